"""VibeVoice-ASR: the shared transcription loop on the PyTorch reference, against transformers' own generate,
in both hub layouts."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vibevoice_onnx.audio import db_normalize
from vibevoice_onnx.checkpoints.tokenizer import build_tokenizer
from vibevoice_onnx.generation.asr import encoder_means, run_transcription, stop_ids
from vibevoice_onnx.reference.asr import LM_WEIGHTS, load_asr
from vibevoice_onnx.transcription import build_asr_prompt

from conftest import built_once, copy_bundle


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("tiny")[0]


@pytest.fixture(scope="module", params=["asr", "asr-hf"])
def reference(request, tiny_checkpoints):
    return load_asr(tiny_checkpoints[request.param])


def speech_like(samples: int, seed: int = 0) -> np.ndarray:
    t = np.arange(samples) / 24000
    rng = np.random.default_rng(seed)
    return (0.2 * np.sin(2 * np.pi * 180 * t + 3 * np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(samples)).astype(np.float32)


@torch.no_grad()
def test_greedy_loop_matches_transformers_generate(reference, tokenizer):
    """On whole frames of audio (where upstream's padding and transformers' agree), with the encoder means."""
    samples = speech_like(3200 * 7)
    prompt = build_asr_prompt(tokenizer, len(samples))
    ours = run_transcription(reference, prompt, samples, stop_ids(tokenizer), 24, rng=None)
    reference.model.config.audio_token_id = tokenizer.token_to_id("<|box_start|>")
    generated = reference.model.generate(
        input_ids=torch.tensor([prompt.ids]), input_values=torch.from_numpy(samples)[None, None], sample=False,
        max_new_tokens=24, do_sample=False, eos_token_id=sorted(stop_ids(tokenizer)), pad_token_id=0)
    assert ours.tokens == generated[0, len(prompt.ids):].tolist()
    assert len(ours.margins) == len(ours.tokens) and ours.stop_reason in ("eos", "max_new_tokens")


@torch.no_grad()
def test_the_same_weights_in_either_layout_transcribe_alike(tiny_checkpoints, tokenizer, tmp_path):
    """The codes-layout checkpoint, saved by transformers' own save_pretrained (the -HF layout), loads strictly
    and transcribes token for token alike, with sampled acoustic noise."""
    codes = load_asr(tiny_checkpoints["asr"])
    codes.model.save_pretrained(tmp_path / "hf")
    resaved = load_asr(tmp_path / "hf")
    assert resaved.dims.kind == "asr-hf"
    samples = speech_like(3200 * 3 + 777, seed=1)
    prompt = build_asr_prompt(tokenizer, len(samples))
    assert len(prompt.audio_positions) == 4  # upstream rounds the frame count up
    runs = [run_transcription(model, prompt, samples, stop_ids(tokenizer), 12, rng=np.random.default_rng(5),
                              keep_logits=True) for model in (codes, resaved)]
    assert runs[0].tokens == runs[1].tokens
    np.testing.assert_allclose(np.stack(runs[0].logits), np.stack(runs[1].logits), atol=1e-5)


def test_audio_over_60_seconds_goes_in_upstreams_segments_and_equals_one_pass(tiny_checkpoints):
    """61.3 s: a 60 s segment and a final partial one through the encoders with their conv states, the last
    padded as upstream pads its final chunk, against one pass with upstream's non-streaming padding."""
    reference = load_asr(tiny_checkpoints["asr"])
    samples = speech_like(24000 * 61 + 7777, seed=2)
    calls = []
    streamed = encoder_means(reference, samples, on_segment=lambda done, total: calls.append((done, total)))
    one_pass = reference.encode(samples[None, None])
    assert calls == [(1, 2), (2, 2)]
    for ours, theirs in zip(streamed, one_pass):
        assert ours.shape[1] == -(-len(samples) // 3200)
        np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.fixture(scope="module")
def asr_bundle(tiny_asr_bundle, tmp_path_factory):
    """A copy of the session's bundle with its tokenizer: these tests verify it and build siblings beside it."""
    import shutil

    return Path(shutil.copytree(tiny_asr_bundle, tmp_path_factory.mktemp("asr-copy") / "onnx" / "asr" / "cpu_fp32"))


def test_asr_bundle_passes_its_gates(asr_bundle, capsys):
    from vibevoice_onnx.cli import main

    assert main(["verify", str(asr_bundle), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    gates = {g["name"]: g for g in record["gates"]}
    assert record["passed"] and {"lm_head", "audio_connector", "closed loop, teacher-forced: greedy picks agree"} <= gates.keys()
    assert any(name.startswith("lm KV: prefill") for name in gates)
    loop = record["closed_loop"]
    assert loop["tokens"] == loop["agreeing_prefix"] > 0 and loop["audio_tokens"] == -(-int(loop["seconds"] * 24000) // 3200)


def test_verify_with_a_layer_streamed_reference_judges_alike(asr_bundle, tiny_checkpoints, monkeypatch, capsys):
    """Where the fp32 model cannot be held (a 7B one on 24 GB), verify reads each LM layer from the shards as
    it runs: the same numbers as the whole reference, never more than one layer's weights at a time."""
    import vibevoice_onnx.reference.loading as loading
    from vibevoice_onnx.cli import main
    from vibevoice_onnx.reference.asr import load_asr_layer_streamed

    streamed, whole = load_asr_layer_streamed(tiny_checkpoints["asr"]), load_asr(tiny_checkpoints["asr"])
    held = []
    layer = streamed.model.get_submodule("model.language_model.layers.1")
    layer.register_forward_pre_hook(lambda *_: held.append(sum(p.untyped_storage().nbytes() for n, p in streamed.model.named_parameters()
                                                                if n.startswith(LM_WEIGHTS))))
    embeds = np.random.default_rng(0).standard_normal((1, 5, streamed.dims.lm.hidden), dtype=np.float32)
    hidden = [reference.lm_stream().step(embeds) for reference in (streamed, whole)]
    np.testing.assert_array_equal(hidden[0], hidden[1])
    np.testing.assert_array_equal(streamed.logits(hidden[0][:, -1]), whole.logits(hidden[1][:, -1]))
    layer_bytes = sum(p.numel() * 4 for p in layer.parameters())
    assert held and layer_bytes <= held[0] <= layer_bytes + 4 * len(streamed.deferred)  # this layer, placeholders elsewhere
    assert all(p.untyped_storage().nbytes() <= 4 for n, p in streamed.model.named_parameters() if n.startswith(LM_WEIGHTS))
    monkeypatch.setattr(loading, "available_memory", lambda: 400_000)
    assert main(["verify", str(asr_bundle)]) == 0
    captured = capsys.readouterr()
    assert "its LM layers are read from the shards as they run" in captured.err and "all gates passed" in captured.out


def test_asr_bundle_fails_on_a_corrupted_head(asr_bundle, tmp_path, capsys):
    import onnx
    from onnx import numpy_helper

    from vibevoice_onnx.cli import main

    bundle = copy_bundle(asr_bundle, tmp_path / "broken")
    model = onnx.load(str(bundle / "lm_head.onnx"))
    weight = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    values = numpy_helper.to_array(weight).copy()
    values[: len(values) // 2] *= -1
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(model, str(bundle / "lm_head.onnx"))
    assert main(["verify", str(bundle)]) == 1
    failed = {line.split("  ")[0] for line in capsys.readouterr().out.splitlines() if line.rstrip().endswith("FAIL")}
    assert "lm_head" in failed and "encoder" not in " ".join(failed)


def test_runtime_transcribes_like_the_reference(asr_bundle, tiny_checkpoints, tokenizer):
    from vibevoice_onnx.runtime.asr import Transcriber

    samples = speech_like(3200 * 5 + 10, seed=3) * 0.5
    transcript = Transcriber(asr_bundle).transcribe(samples, sample_rate=24000, max_new_tokens=16, mean_latents=True)
    expected = run_transcription(load_asr(tiny_checkpoints["asr"]), build_asr_prompt(tokenizer, len(samples)),
                                 db_normalize(samples), stop_ids(tokenizer), 16, rng=None)
    assert transcript.tokens == expected.tokens
    assert transcript.raw == tokenizer.decode(expected.tokens, skip_special_tokens=False)
    seeded = [Transcriber(asr_bundle).transcribe(samples, sample_rate=24000, max_new_tokens=8, seed=11).tokens for _ in range(2)]
    assert seeded[0] == seeded[1]  # the acoustic noise follows the seed


def test_runtime_transcribes_audio_over_60_seconds_like_the_reference(asr_bundle, tiny_checkpoints, tokenizer):
    from vibevoice_onnx.runtime.asr import Transcriber

    samples = speech_like(24000 * 75 + 1234, seed=6)
    segments = []
    ours = Transcriber(asr_bundle).transcribe(samples, sample_rate=24000, max_new_tokens=6, mean_latents=True,
                                              on_segment=lambda done, total: segments.append(total))
    prompt = build_asr_prompt(tokenizer, len(samples))
    theirs = run_transcription(load_asr(tiny_checkpoints["asr"]), prompt, db_normalize(samples), stop_ids(tokenizer), 6, None)
    assert segments == [2, 2] and ours.tokens == theirs.tokens


def test_transcribe_cli_keeps_the_good_results_when_one_input_is_bad(asr_bundle, tmp_path, capsys):
    import soundfile as sf

    from vibevoice_onnx.cli import main

    good = tmp_path / "talk.flac"
    sf.write(str(good), np.stack([speech_like(30000), speech_like(30000, 1)], axis=1), 16000)
    silent, broken = tmp_path / "silence.wav", tmp_path / "notes.wav"
    sf.write(str(silent), np.zeros(24000, np.float32), 24000)
    broken.write_text("not audio")
    out = tmp_path / "out"
    code = main(["transcribe", str(asr_bundle), str(good), str(silent), str(broken), "-o", str(out), "--format", "raw",
                 "--max-new-tokens", "6", "--mean-latents"])
    err = capsys.readouterr().err
    assert code == 2 and "2 of 3 input(s) could not be transcribed" in err
    assert "silence.wav: is silent" in err and "notes.wav: not an audio file" in err
    assert "\r" not in err and "talk.flac: 6 tokens, 0 segments" in err  # not a terminal: whole lines, as a log wants
    assert sorted(p.name for p in out.iterdir()) == ["talk.raw"] and (out / "talk.raw").read_text()
    assert main(["transcribe", str(asr_bundle), str(good), "--max-new-tokens", "6", "--mean-latents"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["segments"] == [] and "text" in printed  # random weights write no JSON transcript


@pytest.fixture(scope="module")
def quantized_asr_bundles(asr_bundle, tiny_checkpoints, tiny_asr_tokenizer, shared_dir):
    """int8 traced (the LM streamed from the shards; the run's, shared with test_writer, copied to be verified
    here) and int4 written, beside the fp32 bundle."""
    from vibevoice_onnx.cli import main

    root = asr_bundle.parent.parent
    copy_bundle(built_once(shared_dir, tiny_checkpoints["asr"], "traced", tokenizer=tiny_asr_tokenizer, precision="int8"),
                root / "asr" / "cpu_int8")
    assert main(["build", str(tiny_checkpoints["asr"]), "-o", str(root), "--precision", "int4",
                 "--tokenizer", str(tiny_asr_tokenizer), "--graphs", "written"]) == 0
    return {precision: root / "asr" / f"cpu_{precision}" for precision in ("int8", "int4")}


def test_both_layouts_build_the_same_graphs(asr_bundle, tiny_checkpoints, tokenizer, tmp_path):
    """The codes-layout checkpoint resaved by transformers' own save_pretrained (the -HF layout) builds and
    transcribes token for token like the codes layout. (Past loading, the layouts share every code path:
    the quantized builds and verify are judged on the codes layout.)"""
    from vibevoice_onnx.export.build import build_bundle
    from vibevoice_onnx.runtime.asr import Transcriber

    load_asr(tiny_checkpoints["asr"]).model.save_pretrained(tmp_path / "hf")
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    # Written without torch, as the session's codes-layout bundle is (test_writer holds each layout's written graphs
    # to the traced ones). transformers 5.23 saves the llava-style names (`language_model.model.*`, no `model.`
    # before the encoders), not the `model.*` ones our synthetic -HF checkpoint stores: the writer read only those.
    hf_bundle = build_bundle(tmp_path / "hf", tmp_path / "onnx", tokenizer=tmp_path / "tokenizer.json", write=True)
    assert hf_bundle.parent.name == "asr-hf"
    samples = speech_like(3200 * 4 + 99, seed=4)
    runs = [Transcriber(b).transcribe(samples, sample_rate=24000, max_new_tokens=12, mean_latents=True).tokens
            for b in (asr_bundle, hf_bundle)]
    assert runs[0] == runs[1]


def test_transcribe_and_bench_run_with_torch_and_transformers_blocked(asr_bundle, tiny_bundle, tmp_path):
    import soundfile as sf

    from helpers import run_torch_free

    clip = tmp_path / "clip.wav"
    sf.write(str(clip), speech_like(20000), 24000)
    proc = run_torch_free(f"""
import os, sys
import vibevoice_onnx.runtime.asr, vibevoice_onnx.runtime.bench, vibevoice_onnx.transcription, vibevoice_onnx.generation.asr
from vibevoice_onnx.cli import main
from vibevoice_onnx.runtime.bundle import shared_pool_threads
# As the process's own command line (argv from sys.argv), so both run in the shared thread pool.
sys.argv = ["vibevoice-onnx", "transcribe", {str(asr_bundle)!r}, {str(clip)!r}, "--format", "srt", "--max-new-tokens", "4",
            "--mean-latents", "-o", {str(tmp_path / "clip.srt")!r}]
assert main() == 0
assert shared_pool_threads() == len(os.sched_getaffinity(0))
sys.argv = ["vibevoice-onnx", "bench", {str(tiny_bundle)!r}, "--frames", "2", "--json"]
assert main() == 0
""")
    assert proc.returncode == 0, proc.stderr
    assert "torch-free ok" in proc.stdout and (tmp_path / "clip.srt").is_file()


def test_int8_and_int4_asr_bundles_are_streamed_quantized_and_judged(quantized_asr_bundles, capsys):
    from vibevoice_onnx.cli import main

    for precision, bundle in quantized_asr_bundles.items():
        graphs = json.loads((bundle / "manifest.json").read_text())["graphs"]
        assert graphs["lm"]["precision"]["bits"] == graphs["lm_head"]["precision"]["bits"] == int(precision[3:])
        assert bool(graphs["lm"]["precision"].get("streamed")) == (precision == "int8")
        assert graphs["lm_head"]["precision"]["matmuls"] == 1
        assert graphs["acoustic_encoder_stream"]["precision"] == {"scheme": "fp32"}  # copied from the fp32 bundle
        capsys.readouterr()
        code = main(["verify", str(bundle), "--json"])
        record = json.loads(capsys.readouterr().out)
        assert "random weights" in record["caveat"]
        assert record["thresholds"]["graph"]["min_cosine"] == {"int8": 0.995, "int4": 0.98}[precision]
        failed = {g["name"]: g for g in record["gates"] if not g["passed"]}
        if precision == "int8":
            assert code == 0 and record["passed"], failed
        else:  # as at full size: int4's logits are off by more than a step may cost (0.971 against 0.98)
            assert code == 1 and set(failed) == {"closed loop, teacher-forced: per-step logits"}, failed
            assert failed["closed loop, teacher-forced: per-step logits"]["cosine"] < 0.975


def test_transcribe_refuses_an_unverified_or_failed_quantized_bundle(quantized_asr_bundles, tmp_path, capsys):
    """One admission rule for every kind: transcribe, as speak, needs --force for a quantized bundle that has
    not been verified or that failed its gates."""
    from vibevoice_onnx.cli import main

    bundle = copy_bundle(quantized_asr_bundles["int4"], tmp_path / "int4")
    manifest = json.loads((bundle / "manifest.json").read_text())
    audio = tmp_path / "clip.wav"
    import soundfile as sf

    sf.write(str(audio), speech_like(3200 * 4), 24000)
    for parity, refusal in ((None, "has not been verified"),
                            ({"passed": False, "gates": [{"name": "lm (past 11, new 5)", "passed": False}]},
                             "failed its parity gates (lm (past 11, new 5))")):
        (bundle / "manifest.json").write_text(json.dumps({**manifest, "parity": parity}))
        capsys.readouterr()
        assert main(["transcribe", str(bundle), str(audio), "--max-new-tokens", "2"]) == 2
        assert refusal in capsys.readouterr().err
        assert main(["transcribe", str(bundle), str(audio), "--max-new-tokens", "2", "--force", "--format", "raw"]) == 0


def test_a_broken_int8_asr_bundle_fails_the_teacher_forced_loop(quantized_asr_bundles, tmp_path, capsys):
    """The audio connector (fp32 in every ASR policy) quantized to 2 bits: every step's logits are off."""
    from vibevoice_onnx.cli import main
    from vibevoice_onnx.export.precision import Scheme, quantize_graph

    bundle = copy_bundle(quantized_asr_bundles["int8"], tmp_path / "broken")
    quantize_graph(bundle / "audio_connector.onnx", Scheme(2, block_size=16, symmetric=True, accuracy_level=0), False)
    capsys.readouterr()
    assert main(["verify", str(bundle), "--json"]) == 1
    gates = {g["name"]: g for g in json.loads(capsys.readouterr().out)["gates"]}
    assert not gates["audio_connector"]["passed"]
    assert not gates["closed loop, teacher-forced: per-step logits"]["passed"]
    assert gates["lm_head"]["passed"] and gates["lm (past 16, new 1)"]["passed"]  # only what was broken


@pytest.mark.parametrize("mixed", [False, True])
def test_streamed_lm_computes_what_the_in_memory_export_computes(tiny_checkpoints, tmp_path, mixed):
    """The LM and its head traced on a skeleton, their weights streamed from the shards (quantized one tensor
    at a time), against the same graphs exported from the fully loaded model and quantized whole; with a mixed
    scheme the streamed export picks each weight's bits by its name, the in-memory one by graph order, and
    both must give the same graph. (fp32 streaming is judged against the reference by every fp32 bundle's
    gates; int8 differs from int4 only in the bits it asks onnxruntime's packer for.)"""
    import onnx
    import onnxruntime as ort

    from vibevoice_onnx.export import asr
    from vibevoice_onnx.export.graphs import export_graph
    from vibevoice_onnx.export.precision import INT4, INT8, LayerRule, Mixed, policy, quantize_graph
    from vibevoice_onnx.export.streaming import export_streamed

    checkpoint = tiny_checkpoints["asr"]
    skeleton, full = asr.load_model(checkpoint), load_asr(checkpoint)
    held = [p.untyped_storage().nbytes() for name, p in skeleton.model.named_parameters() if name.startswith(LM_WEIGHTS)]
    assert len(held) == len(skeleton.deferred) and max(held) <= 4  # placeholders only: one broadcast zero each
    schemes = policy("asr", "int4")
    if mixed:  # the tiny LM has 2 layers: the first at 8 bits, and the second's down projection
        schemes = {**schemes, "lm": Mixed(INT4, (LayerRule(INT8, "first", 1), LayerRule(INT8, "last", 1, ("down",))))}
    (tmp_path / "streamed").mkdir(), (tmp_path / "memory").mkdir()
    for streamed_spec, full_spec in zip(asr.graph_specs(skeleton)[:2], asr.graph_specs(full)[:2]):
        name = streamed_spec.name
        streamed, details = export_streamed(streamed_spec, tmp_path / "streamed", asr.streamed_weights(streamed_spec, skeleton),
                                            schemes.get(name), log=lambda line: None)
        in_memory = export_graph(full_spec, tmp_path / "memory", log=lambda line: None)
        if name in schemes:
            quantize_graph(in_memory, schemes[name], external_data=False)
            assert details["matmuls"] == {"lm": 7 * skeleton.dims.lm.layers, "lm_head": 1}[name]
            bits = [[a.i for a in n.attribute if a.name == "bits"][0] for n in onnx.load(str(streamed)).graph.node
                    if n.op_type == "MatMulNBits"]
            assert bits == ({"lm": [8] * 7 + [4] * 6 + [8], "lm_head": [4]}[name] if mixed else [4] * len(bits))
        feeds = {k: v.numpy() for k, v in zip(full_spec.inputs, full_spec.example)}
        outputs = [ort.InferenceSession(str(path)).run(None, feeds) for path in (streamed, in_memory)]
        for got, expected in zip(*outputs):
            np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-5)


SPEECH = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "audio" / "demo3-hotwords.wav"


@pytest.mark.parametrize("fmt", ["json", "srt", "vtt", "txt", "raw"])
def test_real_speech_is_transcribed_in_every_format(asr_bundle, tokenizer, tmp_path, fmt):
    if not SPEECH.is_file():
        pytest.skip("../shared/fixtures/audio is not available")
    from vibevoice_onnx.cli import main
    from vibevoice_onnx.runtime.asr import Transcriber

    out = tmp_path / f"speech.{fmt}"
    assert main(["transcribe", str(asr_bundle), str(SPEECH), "--format", fmt, "-o", str(out), "--max-new-tokens", "5",
                 "--mean-latents", "--hotwords", "VibeVoice"]) == 0
    expected = Transcriber(asr_bundle).transcribe(SPEECH, max_new_tokens=5, mean_latents=True, hotwords="VibeVoice")
    assert len(expected.tokens) == 5 and expected.audio_seconds == pytest.approx(17.28, abs=0.01)
    written = out.read_text()
    if fmt == "raw":
        assert written == tokenizer.decode(expected.tokens, skip_special_tokens=False)
    elif fmt == "json":
        assert json.loads(written) == {"segments": [], "text": expected.text,
                                       "repetition": {"guard": True, "detected": False, "recovered": False, "loops": []}}
    elif fmt == "vtt":
        assert written.startswith("WEBVTT")
    else:  # a random model writes no JSON transcript, so no segments to list
        assert written == ""

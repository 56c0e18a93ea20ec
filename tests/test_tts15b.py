"""VibeVoice-1.5B end to end on a tiny synthetic checkpoint: build, verify, voices from audio, speak."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import soundfile as sf
from onnx import numpy_helper

from vibevoice_onnx.audio import read_audio
from vibevoice_onnx.cli import main
from vibevoice_onnx.generation.tts15b import TokenIds
from vibevoice_onnx.reference.tts15b import generate, load_tts15b
from vibevoice_onnx.runtime.bundle import Bundle
from vibevoice_onnx.sampling import NoiseSource
from vibevoice_onnx.script import build_prompt, parse_script
from vibevoice_onnx.verify.common import verify_bundle

from conftest import SHARED, copy_bundle, write_voice_sample
from helpers import run_torch_free

GRAPHS = {"lm", "diffusion_head_conditioning", "diffusion_head_step", "acoustic_connector", "semantic_connector", "acoustic_encoder",
          "acoustic_decoder_stream", "semantic_encoder_stream"}
SCRIPT = "Speaker 1: Hello there, how are you today?\nSpeaker 2: I am fine.\nThanks for asking!\nSpeaker 1: Good."
SPEECH = SHARED / "fixtures" / "audio" / "demo3-hotwords.wav"


def test_bundle_holds_every_graph_and_no_vocab_wide_head(tiny_15b_bundle):
    manifest = json.loads((tiny_15b_bundle / "manifest.json").read_text())
    assert tiny_15b_bundle.parts[-2:] == ("1.5b", "cpu_fp32") and manifest["model_kind"] == "1.5b"
    assert set(manifest["graphs"]) == GRAPHS
    lm = manifest["graphs"]["lm"]
    assert [i["name"] for i in lm["inputs"][:4]] == ["inputs_embeds", "position_ids", "seqlens_k", "total_sequence_length"]
    assert len(lm["outputs"]) == 1 + 2 * 2  # hidden + present K/V of the 2 tiny layers
    assert [i["name"] for i in manifest["graphs"]["acoustic_encoder"]["inputs"]] == ["audio"]
    stream = manifest["graphs"]["semantic_encoder_stream"]
    assert len(stream["inputs"]) == 1 + len(stream["states"]) == len(stream["outputs"])
    vocab, hidden = 512, 64
    for name, graph in manifest["graphs"].items():
        model = onnx.load(str(tiny_15b_bundle / graph["file"]))
        onnx.checker.check_model(model)
        assert not any(tuple(t.dims) == (vocab, hidden) for t in model.graph.initializer), name  # host embeds; no head
    assert set(Bundle(tiny_15b_bundle).host) == {"embed_tokens", "speech_scaling_factor", "speech_bias_factor"}


@pytest.fixture(scope="module")
def verified_15b(tiny_15b_bundle, tmp_path_factory):
    bundle = copy_bundle(tiny_15b_bundle, tmp_path_factory.mktemp("verified15b") / "cpu_fp32")
    return bundle, verify_bundle(bundle)


def test_verify_passes_every_gate_and_records_them(verified_15b):
    bundle, record = verified_15b
    assert record["passed"], [g for g in record["gates"] if not g["passed"]]
    names = [g["name"] for g in record["gates"]]
    for expected in ("lm (past", "lm KV: prefill", "diffusion_head", "acoustic_connector", "semantic_connector",
                     "acoustic_encoder", "semantic_encoder_stream", "semantic encoder: 4 streamed chunks == one pass",
                     "acoustic_decoder (", "acoustic_decoder_stream", "decoder: 8 streamed frames == whole decode",
                     "lm: speculative batched CFG streams == separate streams",
                     "closed loop, forced segments: latent divergence within the loop's own spread",
                     "closed loop, forced segments: audio divergence within the loop's own spread",
                     "closed loop, free-running: the LM's picks agree where the loop's own spread keeps them",
                     "closed loop, forced segments, teacher-forced: conditions",
                     "closed loop, free-running, teacher-forced: sampled latents",
                     "closed loop, forced segments, teacher-forced: the LM's picks agree"):
        assert any(n.startswith(expected) for n in names), expected
    loop = record["closed_loop"]
    forced = loop["curves"]["closed loop, forced segments, teacher-forced"]
    assert len(forced["latent_cosine"]) == len(loop["curves"]["closed loop, forced segments"]["divergence"]) == 24
    free = loop["curves"]["closed loop, free-running"]
    assert free["decisions"]["decided"] and not free["decisions"]["flipped"]  # fp32 keeps every decision it is given
    assert loop["segments"] == 3 and loop["voice_latents"] == "mean" and loop["voices"] == "(synthetic signals)"
    assert all(g["cosine"] is None or g["cosine"] >= 0.99 for g in record["gates"])
    assert json.loads((bundle / "manifest.json").read_text())["parity"] == record


def test_a_broken_semantic_encoder_fails_its_gates_and_the_loop(tiny_15b_bundle, tmp_path, capsys):
    bundle = copy_bundle(tiny_15b_bundle, tmp_path / "broken")
    path = bundle / "semantic_encoder_stream.onnx"
    model = onnx.load(str(path))
    largest = max(model.graph.initializer, key=lambda t: np.prod(t.dims))
    largest.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(largest), largest.name))
    onnx.save(model, str(path))
    assert main(["verify", str(bundle)]) == 1
    failed = {line.split("  ")[0] for line in capsys.readouterr().out.splitlines() if line.rstrip().endswith("FAIL")}
    assert {"semantic_encoder_stream (4 chunks, states)",
            "closed loop, forced segments, teacher-forced: conditions"} <= failed
    assert not any(name.startswith(("lm", "diffusion_head", "acoustic_")) for name in failed)


SAMPLE_FORMATS = [("flac", 16000, 2), ("ogg", 48000, 1), ("mp3", 22050, 2), ("wav", 24000, 1)]


@pytest.fixture(scope="module")
def librosa_loaded(tmp_path_factory):
    """Each sample format (and the real speech clip) as upstream loads it, librosa.load(path, sr=24000, mono=True),
    all in one fresh interpreter: librosa's numba kernels compile once (~30 s on a fresh install), and
    numba must not be half-configured in this process. NUMBA_DISABLE_JIT is no way out: librosa's eager
    vectorised kernels then fail to compile."""
    folder = tmp_path_factory.mktemp("librosa")
    samples = {fmt: write_voice_sample(folder / f"sample.{fmt}", rate=rate, channels=channels)
               for fmt, rate, channels in SAMPLE_FORMATS}
    paths = {**samples, **({"speech": SPEECH} if SPEECH.is_file() else {})}
    code = ("import sys, librosa, numpy\n"
            "folder, pairs = sys.argv[1], sys.argv[2:]\n"
            "for name, path in zip(pairs[::2], pairs[1::2]):\n"
            "    numpy.save(f'{folder}/{name}.npy', librosa.load(path, sr=24000, mono=True)[0])\n")
    args = [str(folder)] + [str(item) for name, path in paths.items() for item in (name, path)]
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return samples, {name: np.load(folder / f"{name}.npy") for name in paths}


@pytest.mark.parametrize("fmt, rate, channels", SAMPLE_FORMATS)
def test_audio_reads_like_upstreams_librosa_load(librosa_loaded, fmt, rate, channels):
    samples, expected = librosa_loaded
    ours, info = read_audio(samples[fmt])
    assert (info["sample_rate"], info["channels"]) == (rate, channels)
    np.testing.assert_allclose(ours, expected[fmt], atol=1e-6)


def test_real_speech_at_44k_is_resampled_normalised_and_listed(tiny_15b_bundle, librosa_loaded, tmp_path, capsys):
    if not SPEECH.is_file():
        pytest.skip("../shared/fixtures/audio is not available")
    bundle = copy_bundle(tiny_15b_bundle, tmp_path / "bundle")
    assert main(["voices", "import", str(bundle), str(SPEECH), "--name", "hotwords"]) == 0
    assert "imported voice 'hotwords': 17.28 s, 130 frames (from 44100 Hz, 1 channel)" in capsys.readouterr().out
    stored = Bundle(bundle).voice("hotwords").samples
    expected = librosa_loaded[1]["speech"]
    expected = expected * (10 ** (-25 / 20) / (np.sqrt(np.mean(expected**2)) + 1e-6))  # upstream's AudioNormalizer
    if np.abs(expected).max() > 1:
        expected = expected / (np.abs(expected).max() + 1e-6)
    np.testing.assert_allclose(stored, expected, atol=1e-6)
    assert main(["voices", "list", str(bundle)]) == 0
    listed = capsys.readouterr().out
    assert "hotwords" in listed and "17.28 s" in listed and "130 frames" in listed and "alice" in listed


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_text("not audio at all"), "not an audio file this program can read"),
    (lambda p: sf.write(str(p), np.zeros((0, 1), np.float32), 24000, format="WAV"), "holds no audio (zero samples)"),
    (lambda p: sf.write(str(p), np.full(3000, 0.1, np.float32), 24000, format="WAV"), "shorter than one latent frame"),
    (lambda p: sf.write(str(p), np.zeros(48000, np.float32), 24000, format="WAV"), "is silent"),
])
def test_files_that_cannot_be_voices_are_refused_and_leave_nothing(tiny_15b_bundle, tmp_path, capsys, make, message):
    bundle = copy_bundle(tiny_15b_bundle, tmp_path / "bundle")
    sample = tmp_path / "sample.wav"
    make(sample)
    before = sorted(p.name for p in (bundle / "voices").iterdir())
    assert main(["voices", "import", str(bundle), str(sample)]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in (bundle / "voices").iterdir()) == before


@pytest.fixture(scope="module")
def reference(tiny_checkpoints):
    return load_tts15b(tiny_checkpoints["1.5b"])


def test_speak_a_two_speaker_script_matches_the_reference(tiny_15b_bundle, reference, tmp_path, capsys):
    bob = write_voice_sample(tmp_path / "bob.wav", seconds=1.9, rate=24000, channels=1, pitch=110.0)
    (tmp_path / "script.txt").write_text(SCRIPT)
    out = tmp_path / "dialogue.wav"
    assert main(["speak", str(tiny_15b_bundle), "-f", str(tmp_path / "script.txt"), "--speaker", "1=alice",
                 "--speaker", f"2={bob}", "--voice-latents", "mean", "--seed", "3", "--max-frames", "12",
                 "-o", str(out), "--save-latents", str(tmp_path / "z.npy")]) == 0
    err = capsys.readouterr().err
    assert "speakers 1=alice" in err and "frames 12 (max_frames)" in err and "first audio after" in err
    assert sf.info(str(out)).frames == 12 * 3200
    bundle = Bundle(tiny_15b_bundle)
    voices = [bundle.voice("alice").samples, read_voice(bob)]
    script = parse_script(SCRIPT)
    prompt = build_prompt(bundle.tokenizer, script, [-(-len(v) // 3200) for v in voices])
    expected = generate(reference, prompt, voices, TokenIds.from_tokenizer(bundle.tokenizer), NoiseSource.from_seed(3),
                        max_frames=12)
    np.testing.assert_allclose(np.load(tmp_path / "z.npy"), np.stack(expected.latents), atol=1e-4)


def read_voice(path):
    from vibevoice_onnx.audio import voice_from_file

    return voice_from_file(path).samples


def test_sampled_voice_latents_follow_the_seed(tiny_15b_bundle, tmp_path):
    args = [str(tiny_15b_bundle), "Just one voice here.", "--speaker", "alice", "--max-frames", "3"]
    runs = {}
    for name, extra in (("a", ["--seed", "9"]), ("b", ["--seed", "9"]), ("c", ["--seed", "10"]), ("m", ["--seed", "9", "--voice-latents", "mean"])):
        assert main(["speak", *args, *extra, "-o", str(tmp_path / f"{name}.wav"), "--save-latents", str(tmp_path / f"{name}.npy")]) == 0
        runs[name] = np.load(tmp_path / f"{name}.npy")
    assert np.array_equal(runs["a"], runs["b"])
    assert not np.allclose(runs["a"], runs["c"]) and not np.allclose(runs["a"], runs["m"])


@pytest.mark.parametrize("args, message", [
    (["--voice", "alice"], "--voice does not apply to a 1.5b bundle; give each speaker a voice with --speaker N=VOICE"),
    ([], "give each speaker of the script a voice: --speaker N=VOICE"),
    (["--speaker", "1=alice"], "Speaker 2 speaks in the script but has no voice: add --speaker 2=VOICE"),
    (["--speaker", "1=alice", "--speaker", "2=alice", "--speaker", "3=alice"], "a voice is given for Speaker 3, who does not speak"),
    (["--speaker", "alice"], "the script has speakers 1, 2: give each its voice as --speaker N=VOICE"),
    (["--speaker", "1=alice", "--speaker", "2=nobody"], "has no voice 'nobody' (available: alice), and it is no voice file"),
    (["--speaker", "1=alice", "--speaker", "1=alice"], "--speaker 1=alice: Speaker 1 already has a voice"),
    (["--speaker", "1=alice", "--speaker", "2=alice", "--seed", "1", "--noise", "n.npy", "--voice-latents", "mean"],
     "give either --seed or --noise with --voice-latents mean"),
])
def test_speak_option_errors_on_a_15b_bundle(tiny_15b_bundle, tmp_path, capsys, monkeypatch, args, message):
    np.save(tmp_path / "n.npy", np.zeros((4, 64), np.float32))
    monkeypatch.chdir(tmp_path)
    assert main(["speak", str(tiny_15b_bundle), SCRIPT, *args, "-o", str(tmp_path / "x.wav")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.wav").exists()


@pytest.mark.parametrize("args, message", [
    (["--speaker", "1=synthetic", "--voice", "synthetic"], "--voice does not apply to a dialogue (--speaker)"),
    (["--turn-gap", "0.5"], "--turn-gap applies to a dialogue only"),
    (["--voice-latents", "mean"], "--voice-latents does not apply to a realtime bundle"),
])
def test_15b_options_are_refused_on_a_realtime_bundle(tiny_bundle, tmp_path, capsys, args, message):
    assert main(["speak", str(tiny_bundle), "Hello.", *args, "-o", str(tmp_path / "x.wav")]) == 2
    assert message in capsys.readouterr().err


def test_15b_runtime_runs_with_torch_and_transformers_blocked(tiny_15b_bundle, tmp_path):
    bob = write_voice_sample(tmp_path / "bob.ogg", seconds=1.5, rate=44100, channels=2, pitch=120.0)
    proc = run_torch_free(f"""
import vibevoice_onnx.runtime.tts15b, vibevoice_onnx.audio, vibevoice_onnx.script, vibevoice_onnx.generation.tts15b
from vibevoice_onnx.cli import main
assert main(["voices", "list", {str(tiny_15b_bundle)!r}]) == 0
assert main(["speak", {str(tiny_15b_bundle)!r}, {SCRIPT!r}, "--speaker", "1=alice", "--speaker", "2={bob}",
             "--seed", "1", "--max-frames", "4", "-o", {str(tmp_path / "a.wav")!r}]) == 0
""")
    assert proc.returncode == 0, proc.stderr
    assert "torch-free ok" in proc.stdout
    assert sf.info(str(tmp_path / "a.wav")).frames == 4 * 3200

"""The fixed-shape realtime profile (`build --profile fixed`): static shapes everywhere, standard ops, the
gates (tiles against the untiled reference decode, the loop against the reference and the dynamic bundle), the
same speech as the dynamic bundle through the same loop, the cache's capacity as the context, the mobile report."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from conftest import copy_bundle

from vibevoice_onnx.errors import VibeVoiceError

CACHE, TILE = 128, 3
TEXT = "A fixed-shape bundle speaks as the dynamic one does, frame for frame."


@pytest.fixture(scope="module")
def fixed_root(tiny_checkpoints, tiny_bundle, tiny_preset, tmp_path_factory):
    """ROOT/realtime/{cpu_fp32 (a copy of the tiny bundle), cpu_fp32_fixed, cpu_int8_fixed (with ORT files)},
    each fixed one with the synthetic voice, verified."""
    from vibevoice_onnx.export.build import build_bundle
    from vibevoice_onnx.export.fixed import FixedProfile
    from vibevoice_onnx.runtime.voice_store import import_voice
    from vibevoice_onnx.verify.common import verify_bundle

    root = tmp_path_factory.mktemp("fixed")
    copy_bundle(tiny_bundle, root / "realtime" / "cpu_fp32")
    records = {}
    for precision, ort in (("fp32", False), ("int8", True)):
        with pytest.MonkeyPatch.context() as patch:  # graphs over 1 MB keep their weights in .onnx.data, as
            patch.setattr("vibevoice_onnx.export.graphs.EXTERNAL_DATA_BYTES", 2**20)  # full-size ones do
            bundle = build_bundle(tiny_checkpoints["realtime"], root, precision,
                                  profile=FixedProfile.from_options(CACHE, TILE, ort))
        if precision == "fp32":  # the int8 build takes its graphs and voices from the fp32 one
            import_voice(bundle, tiny_preset, "synthetic")
        records[precision] = verify_bundle(bundle, log=lambda line: None)
    return root, records


def bundle_of(root, precision: str):
    return root / "realtime" / f"cpu_{precision}_fixed"


def test_every_shape_is_static_and_every_op_standard(fixed_root):
    root, _ = fixed_root
    bundle = bundle_of(root, "fp32")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["profile"] == {"name": "fixed", "cache": CACHE, "decoder_frames": TILE, "static_shapes": True}
    assert set(manifest["graphs"]) == {"lower_lm_text", "upper_lm_text", "upper_lm_step", "diffusion_head",
                                       "acoustic_connector", "acoustic_decoder_tile"}
    for name, graph in manifest["graphs"].items():
        model = onnx.shape_inference.infer_shapes(onnx.load(str(bundle / graph["file"])), strict_mode=True)
        assert {node.domain for node in model.graph.node} <= {"", "ai.onnx"}, name  # no contrib op (GQA, Gelu)
        values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
        assert len(model.graph.value_info) > 0
        for value in values:  # onnx's own inference, not the build's checker: every dimension a number
            dims = value.type.tensor_type.shape.dim
            assert all(d.HasField("dim_value") and d.dim_value > 0 for d in dims), (name, value.name, dims)
    step = manifest["graphs"]["upper_lm_step"]["inputs"]
    assert step[0]["shape"][:2] == [2, 1] and step[3]["shape"][2] == CACHE  # both CFG rows, one token, the capacity
    assert manifest["graphs"]["acoustic_decoder_tile"]["inputs"][0]["shape"][:2] == [1, TILE]
    assert manifest["graphs"]["acoustic_decoder_tile"]["external_data"]  # the checks read weights beside the graph


def test_the_mobile_usability_report_is_in_the_manifest_for_every_graph(fixed_root):
    root, records = fixed_root
    for precision in ("fp32", "int8"):
        manifest = json.loads((bundle_of(root, precision) / "manifest.json").read_text())
        assert manifest["profile"]["static_shapes"] is True  # onnxruntime's inference, contrib ops too (int8)
        for name, graph in manifest["graphs"].items():
            for provider in ("nnapi", "coreml"):
                report = graph["mobile"][provider]
                assert 0 < report["supported_nodes"] <= report["nodes"] and report["partitions"] >= 1, (name, provider)
    assert any(line.startswith("  upper_lm_step: nnapi ") for line in records["fp32"]["notes"])


def test_verify_gates_the_tiles_and_the_loop_against_reference_and_dynamic_bundle(fixed_root):
    _, records = fixed_root
    fp32 = {gate["name"]: gate for gate in records["fp32"]["gates"]}
    assert records["fp32"]["passed"] and records["int8"]["passed"], [g for g in records["int8"]["gates"] if not g["passed"]]
    for name in ("acoustic_decoder_tile: 7 frames in tiles of 3 == whole reference decode",
                 "acoustic_decoder_tile: a run of 2 frame(s) (shorter than a tile) == the reference's decode of those frames",
                 "closed loop: audio divergence within the loop's own spread",
                 "closed loop, fixed == dynamic bundle: audio divergence within the loop's own spread",
                 "closed loop, fixed == dynamic bundle: per-frame EOS decisions agree where the loop's own spread keeps them",
                 "eos_classifier (host)"):
        assert name in fp32, name
    assert fp32["closed loop, fixed == dynamic bundle: audio divergence within the loop's own spread"]["cosine"] > 0.99999
    assert records["int8"]["against_dynamic"].startswith("not run: no default-profile bundle")  # none at int8 here


def test_speech_equals_the_dynamic_bundles_whatever_the_decode_grouping(fixed_root):
    from vibevoice_onnx.runtime.realtime import RealtimeTTS

    root, _ = fixed_root
    dynamic, _ = RealtimeTTS(root / "realtime" / "cpu_fp32").create(TEXT, "synthetic", seed=5, max_frames=14)
    fixed = RealtimeTTS(bundle_of(root, "fp32"))
    for group in (1, 2, 3, 5):  # tiles of 3: partial tiles carried over, and groups across tiles
        audio, _ = fixed.create(TEXT, "synthetic", seed=5, max_frames=14, decode_group=group)
        assert len(audio) == len(dynamic) == 14 * 3200
        assert np.abs(audio - dynamic).max() < 1e-4, group


def test_a_generation_that_fills_the_cache_ends_with_max_length_and_says_so(fixed_root, tmp_path, capsys):
    from vibevoice_onnx.cli import main
    from vibevoice_onnx.runtime.realtime import RealtimeTTS

    root, _ = fixed_root
    bundle = bundle_of(root, "fp32")
    tts = RealtimeTTS(bundle)
    speech = tts.stream("Hi.", "synthetic", seed=1)  # a random model never learned to stop: it runs to the end
    for _ in speech:
        pass
    prompt = tts.bundle.voice("synthetic").tts_lm[0][0].shape[2]
    tokens = len(tts.segments("Hi.", "synthetic")[0])
    assert speech.result.stop_reason == "max_length"
    assert prompt + tokens + speech.result.frames - 1 == CACHE  # every fed-back frame took a position, to the last
    assert main(["speak", str(bundle), "Hi.", "--voice", "synthetic", "--seed", "1", "-o", str(tmp_path / "x.wav")]) == 0
    assert f"frames {speech.result.frames} (max_length)" in capsys.readouterr().err


def test_a_voice_prompt_longer_than_the_cache_is_refused_with_a_sentence(fixed_root, tiny_preset, tmp_path):
    from vibevoice_onnx.runtime.fixed import FixedCache
    from vibevoice_onnx.runtime.realtime import RealtimeTTS

    root, _ = fixed_root
    prompt = RealtimeTTS(bundle_of(root, "fp32")).bundle.voice("synthetic")
    with pytest.raises(VibeVoiceError, match="takes 29 positions and this fixed bundle's caches hold 16"):
        FixedCache([prompt.tts_lm], 16, "the voice prompt's upper LM")


def test_the_ort_format_copies_load_and_run_as_the_onnx_graphs(fixed_root):
    import onnxruntime as ort

    root, _ = fixed_root
    bundle = bundle_of(root, "int8")
    manifest = json.loads((bundle / "manifest.json").read_text())
    for name, graph in manifest["graphs"].items():
        assert (bundle / graph["ort_file"]).is_file(), name
    connector = manifest["graphs"]["acoustic_connector"]
    feeds = {"latents": np.random.default_rng(0).standard_normal(connector["inputs"][0]["shape"]).astype(np.float32)}
    outputs = [ort.InferenceSession(str(bundle / connector[key]), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
               for key in ("file", "ort_file")]
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-5)


def test_fixed_bundles_refuse_what_they_cannot_do(fixed_root, tiny_checkpoints, tmp_path, capsys):
    from vibevoice_onnx.cli import EXIT_ERROR, main
    from vibevoice_onnx.runtime.realtime import RealtimeTTS

    root, _ = fixed_root
    with pytest.raises(VibeVoiceError, match="one stream at a time"):
        RealtimeTTS(bundle_of(root, "fp32")).batch(2)
    for args, message in ((["--cache", "64"], "go with --profile fixed"),
                          (["--profile", "fixed", "--cache", "8"], "from 16 to 32768"),
                          (["--profile", "fixed", "--precision", "int4"], "no int4 policy for realtime-fixed")):
        assert main(["build", str(tiny_checkpoints["realtime"]), "-o", str(tmp_path), *args]) == EXIT_ERROR
        assert message in capsys.readouterr().err
    assert main(["build", str(tiny_checkpoints["asr"]), "-o", str(tmp_path), "--profile", "fixed"]) == EXIT_ERROR
    assert "realtime checkpoints only" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_an_fp16_fixed_bundle_for_gpu_and_npu_engines_is_static_and_half_precision(fixed_root, tiny_checkpoints):
    """fp16 (onnxruntime's converter, the norms' and sinusoids' ops kept fp32) from the fp32 fixed graphs; its
    gates need a GPU provider, so here it is checked statically: shapes, types, the mobile report."""
    from vibevoice_onnx.export.build import build_bundle
    from vibevoice_onnx.export.fixed import FixedProfile

    root, _ = fixed_root
    bundle = build_bundle(tiny_checkpoints["realtime"], root, "fp16", "cuda", profile=FixedProfile.from_options(CACHE, TILE))
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert bundle.name == "cuda_fp16_fixed" and manifest["profile"]["static_shapes"] is True
    for name, graph in manifest["graphs"].items():
        assert graph["precision"]["scheme"] == "fp16" and graph["mobile"]["coreml"]["nodes"] > 0
        model = onnx.load(str(bundle / graph["file"]))
        halves = sum(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
        assert halves > 0, name
        assert [i["dtype"] for i in graph["inputs"]] == [i["dtype"] for i in json.loads(
            (bundle_of(root, "fp32") / "manifest.json").read_text())["graphs"][name]["inputs"]]  # fp32 at the edges


def test_bench_times_the_fixed_bundle_against_its_dynamic_sibling_in_one_run(fixed_root):
    from vibevoice_onnx.runtime.bench import bench, format_report

    root, _ = fixed_root
    report = bench(bundle_of(root, "fp32"), frames=4, against=root / "realtime" / "cpu_fp32")
    ours, other = report["runtime"], report["against"]
    assert ours["frames"] == other["frames"] == 4 and other["bundle"] == str(root / "realtime" / "cpu_fp32")
    assert set(ours["graphs"]) == {"lower_lm_text", "upper_lm_text", "upper_lm_step", "diffusion_head",
                                   "acoustic_connector", "acoustic_decoder_tile"}
    assert "upper_lm" in other["graphs"] and other["peak_memory_bytes"] > 0  # its own process, its own memory
    assert ours["weight_bytes"] == sum(ours["graph_weight_bytes"].values())
    assert "against       " in format_report(report) and "graph sizes   lower_lm_text " in format_report(report)


def test_static_buffers_for_cuda_graphs_give_the_same_loop_and_check_their_shapes(fixed_root, capsys):
    """CUDA graphs replay what they captured on the same addresses: every graph of the fixed profile in buffers
    allocated once and bound once (runtime.device.StaticBinding). No GPU here: the same binding in CPU memory
    gives the fixed loop bitwise; a dynamic graph, a call of other shapes and a bundle that is not fixed-profile
    CUDA are refused, each with a sentence."""
    from vibevoice_onnx.errors import BundleError, VibeVoiceError
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.runtime.device import StaticBinding
    from vibevoice_onnx.text import encode_tts_text
    from vibevoice_onnx.verify.realtime import bound_loop

    root, _ = fixed_root
    plain = Bundle(bundle_of(root, "fp32"))
    loop = bound_loop(plain.voice("synthetic"), encode_tts_text(plain.tokenizer, "Captured once, replayed after."))
    static = Bundle(bundle_of(root, "fp32"))
    static.static_graphs = True  # what cuda_graphs=True sets on a CUDA bundle
    replayed = loop(static)
    for ours, theirs in zip(replayed, loop(plain)):
        assert np.array_equal(ours, theirs)
    lm = static.session("upper_lm_step")
    assert lm.static is not None and lm.static.binding is not None
    embeds = lm.static.inputs["inputs_embeds"][0]
    with pytest.raises(VibeVoiceError, match="is not the .* its CUDA graph was captured with"):
        lm.run(None, {name: np.zeros(shape if name != "inputs_embeds" else (embeds[0], embeds[1] + 1, embeds[2]),
                                     dtype) for name, (shape, dtype) in lm.static.inputs.items()})
    dynamic = Bundle(root / "realtime" / "cpu_fp32")
    with pytest.raises(BundleError, match="dynamic dimensions .* --profile fixed"):
        StaticBinding("upper_lm", dynamic.graph("upper_lm"), dynamic.placement)
    with pytest.raises(BundleError, match="CUDA graphs need a bundle of the fixed profile built for CUDA"):
        Bundle(bundle_of(root, "fp32"), cuda_graphs=True)
    from vibevoice_onnx.cli import EXIT_ERROR, main

    capsys.readouterr()
    assert main(["bench", str(bundle_of(root, "fp32")), "--frames", "2", "--cuda-graphs"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "CUDA graphs need a bundle of the fixed profile built for CUDA" in err and "Traceback" not in err

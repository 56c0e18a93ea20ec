"""VibeVoice-Large (the 7B TTS) on a tiny checkpoint in its exact hub layout: recognised, loaded strictly with
its head untied, built at int8 (traced, the LM streamed from the shards) and int4 (written), gated against the
reference, spoken, benched; a head tied by mistake is caught by the gates."""

import json

import numpy as np
import pytest
import soundfile as sf
from safetensors.numpy import load_file, save_file

from vibevoice_onnx.cli import main

from conftest import copy_bundle, write_voice_sample

SCRIPT = "Speaker 1: Hello there, how are you?\nSpeaker 2: Fine, thanks. And you?"


@pytest.fixture(scope="module")
def large(tiny_checkpoints, tmp_path_factory):
    """The tiny Large checkpoint and its int8 (traced, the LM streamed from the shards) and int4 (graphs written)
    bundles, each with a voice imported. Read-only."""
    root = tmp_path_factory.mktemp("large")
    voice = write_voice_sample(root / "alice.flac")
    for precision, graphs in (("int8", "traced"), ("int4", "written")):
        assert main(["build", str(tiny_checkpoints["large"]), "-o", str(root), "--precision", precision,
                     "--graphs", graphs]) == 0
        assert main(["voices", "import", str(root / "large" / f"cpu_{precision}"), str(voice), "--name", "alice"]) == 0
    return root


def test_the_checkpoint_is_the_hub_layout_in_ten_shards(tiny_checkpoints, capsys):
    checkpoint = tiny_checkpoints["large"]
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == [f"model-{i:05d}-of-00010.safetensors" for i in range(1, 11)]
    assert "lm_head.weight" in index["weight_map"]  # top level, no model. prefix (facts sheet 11.4)
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and "tie_word_embeddings" not in config["decoder_config"]
    assert config["acostic_vae_dim"] == 64 and config["decoder_config"]["max_position_embeddings"] == 32768
    assert main(["inspect", str(checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "large" and report["missing"] == [] and report["unexpected"] == []


def test_the_reference_keeps_the_stored_head_untied(tiny_checkpoints):
    from vibevoice_onnx.reference.tts15b import load_tts15b

    checkpoint = tiny_checkpoints["large"]
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    stored = load_file(checkpoint / index["lm_head.weight"])["lm_head.weight"].astype(np.float32)
    model = load_tts15b(checkpoint).model
    head, embed = model.lm_head.weight.detach().numpy(), model.model.language_model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(head, stored)
    assert not np.allclose(head, embed)


def test_int8_and_int4_stream_the_lm_and_follow_the_policy(large):
    from vibevoice_onnx.export.precision import policy

    for precision in ("int8", "int4"):
        manifest = json.loads((large / "large" / f"cpu_{precision}" / "manifest.json").read_text())
        graphs = manifest["graphs"]
        assert manifest["model_kind"] == "large"
        assert bool(graphs["lm"]["precision"].get("streamed")) == (precision == "int8")  # traced from the shards
        for name, scheme in policy("large", precision).items():
            assert graphs[name]["precision"]["bits"] == scheme.bits, (precision, name)
        host = load_file(large / "large" / f"cpu_{precision}" / "host.safetensors")
        assert host["lm_head"].shape == host["embed_tokens"].shape  # the untied head, memory-mapped at run time


def test_int8_verifies_and_speaks_a_script_and_int4_is_judged(large, tmp_path, capsys):
    int8, int4 = large / "large" / "cpu_int8", copy_bundle(large / "large" / "cpu_int4", tmp_path / "int4")
    assert main(["verify", str(int8), "--json"]) == 0
    gates = {g["name"]: g for g in json.loads(capsys.readouterr().out)["gates"]}
    int8_cosines = {name: g["cosine"] for name, g in gates.items() if g["cosine"] is not None}
    assert gates["choice logits (the untied lm_head's rows of the four picks)"]["passed"]
    assert gates["lm: fixed-capacity cache (in place) == growing cache (11 steps)"]["passed"]
    out = tmp_path / "dialogue.wav"
    assert main(["speak", str(int8), SCRIPT, "--speaker", "1=alice", "--speaker", "2=alice", "--seed", "3",
                 "--max-frames", "10", "-o", str(out)]) == 0
    audio, rate = sf.read(out)
    assert rate == 24000 and len(audio) == 10 * 3200 and np.isfinite(audio).all() and np.abs(audio).max() > 0
    code = main(["verify", str(int4)])
    record = json.loads((int4 / "manifest.json").read_text())["parity"]
    passed = record["passed"]
    assert code == (0 if passed else 1)
    # the tiny Large's int4 verdict sits near its limits (teacher-forced conditions 0.985 against 0.98): what is
    # stable is that int4 is farther from the reference than int8, by much more than int8's own error
    int4_cosines = {g["name"]: g["cosine"] for g in record["gates"] if g["cosine"] is not None}
    for name in ("lm (past 11, new 5)", "closed loop, forced segments, teacher-forced: conditions"):
        assert 1 - int4_cosines[name] > 5 * (1 - int8_cosines[name]), (name, int4_cosines[name], int8_cosines[name])
    capsys.readouterr()
    assert main(["speak", str(int4), SCRIPT, "--speaker", "1=alice", "--speaker", "2=alice", "--max-frames", "2",
                 "-o", str(tmp_path / "x.wav")]) == (0 if passed else 2)


def test_a_head_tied_to_the_embedding_is_caught(large, tmp_path, capsys):
    """Trap 11.9.1: a head overwritten by the embedding changes the EOS and segment decisions."""
    bundle = copy_bundle(large / "large" / "cpu_int8", tmp_path / "tied")
    host = load_file(bundle / "host.safetensors")
    host["lm_head"] = host["embed_tokens"].copy()
    save_file(host, str(bundle / "host.safetensors"))
    assert main(["verify", str(bundle), "--json"]) == 1
    gates = {g["name"]: g for g in json.loads(capsys.readouterr().out)["gates"]}
    assert not gates["choice logits (the untied lm_head's rows of the four picks)"]["passed"]


def test_bench_times_a_large_bundle_against_its_reference(large, tiny_checkpoints, capsys):
    assert main(["bench", str(large / "large" / "cpu_int8"), "--frames", "6", "--reference",
                 str(tiny_checkpoints["large"]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runtime"]["kind"] == "large" and report["runtime"]["frames"] == report["reference"]["frames"] == 6

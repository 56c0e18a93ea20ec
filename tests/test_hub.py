"""From a model id to speech: checkpoints, tokenizers and bundles through `huggingface_hub`, the bundle cache, push
and pull, voices by URL.

These machines reach no hub, so the Hub is stood in for in two ways (tests/hub_standin.py): a local HTTP endpoint
on 127.0.0.1 (HF_ENDPOINT) answering the routes `huggingface_hub` downloads through, so that the library's own
download, cache and resume code runs; and a Hugging Face cache written by the test in the library's layout, used
with HF_HUB_OFFLINE=1. Every command runs as a user runs it: the CLI in a child process, with its own HF_* and
VIBEVOICE_ONNX_HOME settings.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hub_standin import REALTIME_ID, audio, cli, environment, write_offline_cache

TEXT = "Hello from the Hub."


@pytest.fixture(scope="module")
def by_hand(tiny_traced_bundle, tmp_path_factory) -> Path:
    """What the bundle built by hand from the same files (build, traced as with torch installed; voices import)
    speaks."""
    out = tmp_path_factory.mktemp("by-hand") / "speech.wav"
    env = environment(out.parent)
    cli("speak", tiny_traced_bundle, TEXT, "--voice", "synthetic", "--seed", "7", "--max-frames", "12", "-o", out, env=env)
    return out


@pytest.fixture(scope="module")
def first_use(hub, tmp_path_factory, tiny_preset) -> dict:
    """`speak --model microsoft/VibeVoice-Realtime-0.5B` through the endpoint with a fresh cache, then the same
    command again. The weight file's connection drops once on the way (huggingface_hub fetches it again)."""
    tmp = tmp_path_factory.mktemp("first-use")
    env = environment(tmp, hub.endpoint)
    hub.requests.clear()
    hub.cut["model.safetensors"] = 1_000_000
    first = cli("speak", "--model", REALTIME_ID, "--precision", "fp32", TEXT, "--voice", tiny_preset, "--seed", "7", "--max-frames", "12",
                "-o", tmp / "first.wav", env=env)
    fetched = hub.downloads()
    hub.requests.clear()
    second = cli("speak", "--model", REALTIME_ID, "--precision", "fp32", TEXT, "--voice", tiny_preset, "--seed", "7", "--max-frames", "12",
                 "-o", tmp / "second.wav", env=env)
    return {"tmp": tmp, "env": env, "first": first, "second": second, "fetched": fetched,
            "second_requests": list(hub.requests)}


def test_a_hub_checkpoint_speaks_what_the_hand_built_bundle_speaks(first_use, by_hand):
    assert "first use: building and verifying a realtime fp32 bundle" in first_use["first"].stderr
    assert "every gate passes" in first_use["first"].stderr
    # the build runs in a child process of ours: starting it warns nothing (runpy did, for `-m` of an imported module)
    assert "Warning" not in first_use["first"].stderr, first_use["first"].stderr
    np.testing.assert_array_equal(audio(first_use["tmp"] / "first.wav"), audio(by_hand))
    np.testing.assert_array_equal(audio(first_use["tmp"] / "second.wav"), audio(by_hand))


def test_without_torch_a_hub_id_speaks_from_graphs_written_on_first_use(hub, by_hand, tiny_preset, tmp_path):
    """The base install (torch and transformers cannot be imported): `speak --model --precision fp32` downloads the
    checkpoint, writes the bundle's graphs, says so, and speaks what the traced bundle speaks (the LMs' rotary
    tables differ in the last bit: within one step of the 16-bit samples); without --precision, the int8 bundle
    is written and verified against those fp32 graphs, and used since it passes; later uses find each bundle."""
    env = environment(tmp_path, hub.endpoint, base_install=True)
    said = {}
    for name, precision in (("fp32", ["--precision", "fp32"]), ("default", []), ("again", [])):
        said[name] = cli("speak", "--model", REALTIME_ID, *precision, TEXT, "--voice", tiny_preset, "--seed", "7",
                         "--max-frames", "12", "-o", tmp_path / f"{name}.wav", env=env).stderr
        assert "Traceback" not in said[name]
    np.testing.assert_allclose(audio(tmp_path / "fp32.wav"), audio(by_hand), atol=1, rtol=0)
    assert "first use: writing the graphs of a realtime fp32 bundle" in said["fp32"], said["fp32"]
    assert "its graphs written without PyTorch (not verified here" in said["fp32"]
    assert "first use: writing the graphs of a realtime int8 bundle" in said["default"], said["default"]
    assert "built and verified against its fp32 graphs" in said["default"] and "every gate passes" in said["default"]
    assert "first use" not in said["again"] and audio(tmp_path / "again.wav").size == 12 * 3200
    np.testing.assert_array_equal(audio(tmp_path / "again.wav"), audio(tmp_path / "default.wav"))
    bundles = tmp_path / "home" / "bundles"
    fp32, int8 = (json.loads(next(bundles.glob(f"*/realtime/cpu_{p}/manifest.json")).read_text()) for p in ("fp32", "int8"))
    assert fp32["tools"]["graphs"] == "vibevoice-onnx writer" and fp32["parity"] is None
    assert int8["parity"]["passed"] and int8["parity"]["teacher"]["graphs"] == "vibevoice-onnx writer"


def test_only_the_files_a_build_needs_are_downloaded_and_a_dropped_download_completes(first_use):
    names = sorted({path.rsplit("/", 1)[1] for path in first_use["fetched"]})
    # the checkpoint's config, weights and preprocessor config; the tokenizer from Qwen's repository
    assert names == ["config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json"]
    assert any("/Qwen/Qwen2.5-0.5B/resolve/" in path for path in first_use["fetched"])
    # the dropped connection cost one more request, and the speech (first test) shows the file arrived whole
    assert len([p for p in first_use["fetched"] if p.endswith("/model.safetensors")]) == 2


def test_the_second_use_neither_downloads_nor_builds(first_use):
    assert [p for m, p in first_use["second_requests"] if "/resolve/" in p] == []
    assert "building" not in first_use["second"].stderr and "verifying" not in first_use["second"].stderr
    manifest = json.loads(next((first_use["tmp"] / "home" / "bundles").glob("*/realtime/cpu_fp32/manifest.json")).read_text())
    assert manifest["source"]["repo"] == REALTIME_ID and manifest["source"]["tokenizer"].startswith("Qwen/Qwen2.5-0.5B@")
    assert manifest["parity"]["passed"]


def test_an_unreachable_hub_falls_back_on_the_caches(first_use, by_hand, tiny_preset):
    env = dict(first_use["env"], HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens there
    out = first_use["tmp"] / "unreachable.wav"
    done = cli("speak", "--model", REALTIME_ID, "--precision", "fp32", TEXT, "--voice", tiny_preset, "--seed", "7", "--max-frames", "12",
               "-o", out, env=env)
    assert "building" not in done.stderr
    np.testing.assert_array_equal(audio(out), audio(by_hand))


def test_offline_from_a_hugging_face_cache_alone(repos, by_hand, tiny_preset, tmp_path):
    """HF_HUB_OFFLINE=1 with a Hugging Face cache holding the checkpoint's and the tokenizer's files (written here
    in the library's layout) and an empty bundle cache: a build killed halfway leaves nothing that passes for a
    bundle, two first uses at once build once, and a later use starts without building."""
    hf_cache = tmp_path / "hf"
    for repo_id in (REALTIME_ID, "Qwen/Qwen2.5-0.5B"):
        write_offline_cache(hf_cache, repo_id, repos[repo_id])
    env = environment(tmp_path, offline=True)
    speak = [sys.executable, "-m", "vibevoice_onnx.cli", "speak", "--model", REALTIME_ID, "--precision", "fp32", TEXT,
             "--voice", tiny_preset, "--seed", "7", "--max-frames", "12", "-o"]

    killed = subprocess.Popen(speak + [tmp_path / "killed.wav"], env=env, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    for line in killed.stderr:
        if "exported" in line:  # halfway through the export
            os.killpg(killed.pid, signal.SIGKILL)
            break
    killed.wait(timeout=60)
    bundles = tmp_path / "home" / "bundles"
    assert not list(bundles.glob("*/*/*/manifest.json"))  # nothing that looks like a bundle

    racers = [subprocess.Popen(speak + [tmp_path / f"racer{i}.wav"], env=env, stderr=subprocess.PIPE, text=True)
              for i in range(2)]
    logs = [racer.communicate(timeout=300)[1] for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0], logs
    assert sum("first use: building" in log for log in logs) == 1, logs
    for i in range(2):
        np.testing.assert_array_equal(audio(tmp_path / f"racer{i}.wav"), audio(by_hand))
    later = cli(*speak[3:], tmp_path / "later.wav", env=env)
    assert "building" not in later.stderr
    np.testing.assert_array_equal(audio(tmp_path / "later.wav"), audio(by_hand))


@pytest.mark.parametrize("offline", [True, False])
def test_without_network_or_a_cached_copy_one_sentence_names_what_is_missing(tmp_path, offline):
    """HF_HUB_OFFLINE=1, or a Hub that cannot be reached (nothing listens at the endpoint)."""
    done = cli("speak", "--model", REALTIME_ID, TEXT, "-o", tmp_path / "x.wav", env=environment(tmp_path, offline=offline),
               ok=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
    assert f"its snapshot is not in the Hugging Face cache and {why}" in done.stderr


@pytest.mark.parametrize("repo, message", [
    ("google-bert/bert-base-uncased", "unknown model_type 'bert'"),
    ("someone/private-model", "or it is private"),
    ("someone/gated-model", "is a gated repository"),
    ("someone/no-such-model", "no such repository on the Hub"),
    (f"{REALTIME_ID}@v9", "has no revision 'v9'"),
    ("someone/model--x.git", "is not a valid Hub repository id"),
])
def test_repositories_that_cannot_be_used_are_refused_in_a_sentence(hub, tmp_path, repo, message):
    done = cli("speak", "--model", repo, TEXT, "-o", tmp_path / "x.wav", env=environment(tmp_path, hub.endpoint),
               ok=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert message in done.stderr
    assert not list((tmp_path / "home").glob("bundles/*/*/*/manifest.json"))


def test_the_python_api_opens_a_cached_model_by_id(first_use, hub, tiny_preset):
    code = (f"from vibevoice_onnx.runtime.realtime import RealtimeTTS\n"
            f"tts = RealtimeTTS.from_pretrained({REALTIME_ID!r}, precision='fp32')\n"
            f"samples, rate = tts.create({TEXT!r}, {str(tiny_preset)!r}, seed=7, max_frames=12)\n"
            "print(len(samples), rate)\n")
    hub.requests.clear()
    done = subprocess.run([sys.executable, "-c", code], env=first_use["env"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(12 * 3200), "24000"]
    assert [p for m, p in hub.requests if "/resolve/" in p] == []


def test_push_dry_run_then_pull_round_trips_a_bundle(first_use, hub, tmp_path):
    from huggingface_hub import ModelCard

    bundle = next((first_use["tmp"] / "home" / "bundles").glob("*/realtime/cpu_fp32"))
    cli("voices", "import", bundle, f"{hub.endpoint}/voices/synthetic.pt", env=first_use["env"])  # a voice by URL
    cli("bench", bundle, "--frames", "4", env=first_use["env"])  # its numbers go into the manifest, then the card
    staged = tmp_path / "staged"
    cli("push", bundle, "me/realtime-onnx", "--dry-run", staged, env=first_use["env"])
    card = ModelCard.load(staged / "README.md")
    assert card.data.pipeline_tag == "text-to-speech" and card.data.base_model == REALTIME_ID
    assert card.data.license == "mit" and card.data.library_name == "vibevoice-onnx" and "onnx" in card.data.tags
    assert "## Parity gates" in card.text and "vibevoice-onnx speak --model me/realtime-onnx" in card.text
    # each gate with its size and bias beside its direction (fp32: cosine and gain 1 to 6 places, a tiny error)
    assert re.search(r"\| acoustic_connector \| 1\.000000 \| \d\.\d\de-0[5-9] \| 1\.000000 \|", card.text), card.text
    assert "`vibevoice-onnx bench" in card.text and "- real-time factor: " in card.text

    hub.add_repo("me/realtime-onnx", staged)
    hub.cut["host.safetensors"] = 1000  # a dropped connection on the way: fetched again, and checked below
    pulled = Path(cli("pull", "me/realtime-onnx", env=first_use["env"]).stdout.strip())
    assert pulled.parent.name == "snapshots"  # used from the Hugging Face cache
    names = sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(pulled).as_posix() for p in pulled.rglob("*")
                           if p.is_file() and p.name != "README.md")
    for name in names:
        assert (bundle / name).read_bytes() == (pulled / name).read_bytes(), name

    # the prebuilt bundle speaks by its id with the runtime alone: torch is never imported
    code = ("import sys\nfrom vibevoice_onnx.cli import main\n"
            f"code = main(['speak', '--model', 'me/realtime-onnx', {TEXT!r}, '--voice', 'synthetic', '--seed', '7', "
            f"'--max-frames', '12', '-o', {str(tmp_path / 'pulled.wav')!r}])\n"
            "assert code == 0 and 'torch' not in sys.modules, (code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], env=first_use["env"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(audio(tmp_path / "pulled.wav"), audio(first_use["tmp"] / "first.wav"))


def test_pull_refuses_a_tampered_or_incomplete_bundle(first_use, hub, tmp_path):
    bundle = next((first_use["tmp"] / "home" / "bundles").glob("*/realtime/cpu_fp32"))
    staged = tmp_path / "staged"
    cli("push", bundle, "me/good", "--dry-run", staged, env=first_use["env"])
    tampered = shutil.copytree(staged, tmp_path / "tampered")
    data = bytearray((tampered / "host.safetensors").read_bytes())
    data[-1] ^= 1
    (tampered / "host.safetensors").write_bytes(bytes(data))
    hub.add_repo("me/tampered", tampered)
    incomplete = shutil.copytree(staged, tmp_path / "incomplete")
    (incomplete / "eos_classifier.onnx").unlink()
    hub.add_repo("me/incomplete", incomplete)
    escaping = shutil.copytree(staged, tmp_path / "escaping")
    manifest = json.loads((escaping / "manifest.json").read_text())
    manifest["files"]["../../outside.txt"] = {"size": 1, "sha256": "0" * 64}
    (escaping / "manifest.json").write_text(json.dumps(manifest))
    hub.add_repo("me/escaping", escaping)
    env = environment(tmp_path, hub.endpoint)
    done = cli("pull", "me/escaping", env=env, ok=False)
    assert done.returncode == 2 and "names '../../outside.txt' as a file of the bundle" in done.stderr
    done = cli("pull", "me/tampered", env=env, ok=False)
    assert done.returncode == 2 and "host.safetensors: this file does not match the sha256" in done.stderr
    done = cli("speak", "--model", "me/incomplete", TEXT, "-o", tmp_path / "x.wav", env=env, ok=False)
    assert done.returncode == 2 and "eos_classifier.onnx is missing from the repository" in done.stderr
    assert "Traceback" not in done.stderr


def test_push_refuses_an_unverified_a_failed_or_an_altered_bundle(first_use, tiny_bundle, tmp_path):
    done = cli("push", tiny_bundle, "me/x", "--dry-run", tmp_path / "out", env=environment(tmp_path), ok=False)
    assert done.returncode == 2 and "has not been verified" in done.stderr
    verified = next((first_use["tmp"] / "home" / "bundles").glob("*/realtime/cpu_fp32"))
    failed = shutil.copytree(verified, tmp_path / "failed")
    manifest = json.loads((failed / "manifest.json").read_text())
    manifest["parity"]["passed"] = False
    manifest["parity"]["gates"][0]["passed"] = False
    (failed / "manifest.json").write_text(json.dumps(manifest))
    done = cli("push", failed, "me/x", "--dry-run", tmp_path / "out", env=environment(tmp_path), ok=False)
    assert done.returncode == 2 and f"failed its parity gates ({manifest['parity']['gates'][0]['name']})" in done.stderr
    altered = shutil.copytree(verified, tmp_path / "altered")  # verified, then a graph changed on disk
    with open(altered / "eos_classifier.onnx", "ab") as graph:
        graph.write(b"\0")
    done = cli("push", altered, "me/x", "--dry-run", tmp_path / "out", env=environment(tmp_path), ok=False)
    assert done.returncode == 2 and "eos_classifier.onnx: this file does not match" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() and "Traceback" not in done.stderr


def test_a_cached_bundle_that_failed_its_gates_is_kept_refused_and_never_rebuilt(tiny_checkpoints, tiny_preset, tmp_path):
    """A checkpoint's first use builds and verifies into the cache; when the verdict is a failure (the tiny
    realtime's int4 fails, as int4 does at full size) the bundle is kept with it: every later use refuses it
    without building or verifying again, and --force uses it. In the base install (its graphs written, judged
    against the fp32 ones written beside them): the cache's rule is the same with torch."""
    env = environment(tmp_path, base_install=True)
    speak = ["speak", "--model", tiny_checkpoints["realtime"], "--precision", "int4", TEXT, "--max-frames", "4",
             "--seed", "1", "--voice", tiny_preset, "-o", tmp_path / "x.wav"]
    first = cli(*speak, env=env, ok=False, timeout=600)
    assert first.returncode == 2 and "first use: writing the graphs of a realtime int4" in first.stderr, first.stderr[-2000:]
    assert "FAILED its gates" in first.stderr and "failed its parity gates" in first.stderr
    manifest = next((tmp_path / "home" / "bundles").glob("*/realtime/cpu_int4/manifest.json"))
    built = manifest.stat().st_mtime_ns
    again = cli(*speak, env=env, ok=False)
    assert again.returncode == 2 and "failed its parity gates" in again.stderr
    assert "building" not in again.stderr and "verifying" not in again.stderr and manifest.stat().st_mtime_ns == built
    forced = cli(*speak, "--force", env=env)
    assert "building" not in forced.stderr and (tmp_path / "x.wav").is_file()


def test_voices_from_urls_are_downloaded_once(first_use, hub, tiny_preset, tmp_path):
    url = f"{hub.endpoint}/voices/again.pt"
    hub.requests.clear()
    env = dict(first_use["env"], VIBEVOICE_ONNX_HOME=str(first_use["tmp"] / "home"))
    for run in range(2):
        cli("speak", "--model", REALTIME_ID, "--precision", "fp32", TEXT, "--voice", url, "--seed", "7", "--max-frames", "12",
            "-o", tmp_path / f"url{run}.wav", env=env)
    assert [p for m, p in hub.requests if p == "/voices/again.pt"] == ["/voices/again.pt"]
    np.testing.assert_array_equal(audio(tmp_path / "url1.wav"), audio(first_use["tmp"] / "first.wav"))


def test_the_tokenizer_is_chosen_by_the_lm_configuration():
    from vibevoice_onnx.checkpoints.configs import full_config, model_dims, tokenizer_repo, tts_preprocessor

    named = {"language_model_pretrained_name": "Qwen/Qwen2.5-7B"}
    assert tokenizer_repo(model_dims(full_config("realtime")), named) == "Qwen/Qwen2.5-0.5B"  # the width decides
    assert tokenizer_repo(model_dims(full_config("1.5b")), None) == "Qwen/Qwen2.5-1.5B"
    assert tokenizer_repo(model_dims(full_config("large")), None) == "Qwen/Qwen2.5-7B"
    assert tokenizer_repo(model_dims(full_config("asr")), None) == "Qwen/Qwen2.5-7B"
    assert tts_preprocessor("realtime")["language_model_pretrained_name"] == "Qwen/Qwen2.5-0.5B"


def test_a_missing_export_extra_is_one_sentence_where_the_graphs_are_not_written_without_it(monkeypatch):
    """Every kind's graphs are written without torch; a kind whose record named no writer would get one sentence."""
    import dataclasses
    import importlib.util

    from vibevoice_onnx import families
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.hub import cache

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.setattr(cache, "torch_installed", lambda: False)
    for kind in families.KINDS:
        cache.require_builder(kind)
    monkeypatch.setattr(cache, "family", lambda kind: dataclasses.replace(families.family(kind), writer=None))
    with pytest.raises(VibeVoiceError, match=r"export extra \(torch not installed\): pip install"):
        cache.require_builder("asr")


def test_cache_list_and_remove(first_use):  # last: it frees the bundle the tests above share
    env = first_use["env"]
    listed = json.loads(cli("cache", "list", "--json", env=env).stdout)
    assert [(e["source"].get("repo"), e["kind"], e["variant"], e["verdict"]) for e in listed] == [
        (REALTIME_ID, "realtime", "cpu_fp32", "passed")]
    assert listed[0]["bytes"] > 0
    cli("cache", "remove", REALTIME_ID, env=env)
    assert json.loads(cli("cache", "list", "--json", env=env).stdout) == []

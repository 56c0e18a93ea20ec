"""The JavaScript module (web/static/vibevoice.mjs) as a web developer installs it: `npm pack` of its package, installed
with onnxruntime-node from the npm registry into a fresh Node.js project, and driven by a program that imports it
(tests/javascript/driver.mjs). Bundles are served from 127.0.0.1 by a plain static server started and stopped here.
Its contract is the Python runtime's: the same speech on the same noise rows (the loop gate `web --check` applies,
in size as well as direction), the same ids, the same text rule, the same refusals, and files checked against the
manifest's sha256 and kept for a load with the network gone."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import copy_bundle
from helpers import FAILED_PARITY, NODE, NPM, STATIC, gained_copy, hosted, node_project, with_parity

if not (NODE and NPM):
    pytest.skip("Node.js or npm is missing: run scripts/install-test-system-packages", allow_module_level=True)
# How long npm or one Node.js program may take before the test calls it hung (a cold npm cache downloads
# onnxruntime-node's 90 MB; a tiny bundle speaks in seconds).
WAIT = 600


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict:
    return node_project(tmp_path_factory.mktemp("node-project"), WAIT)


def node(project: dict, **request) -> dict:
    done = subprocess.run([NODE, "driver.mjs"], cwd=project["folder"], input=json.dumps(request), capture_output=True,
                          text=True, timeout=WAIT)
    assert done.returncode == 0 and not done.stderr, done.stderr[-3000:]  # no console noise either
    return json.loads(done.stdout)


def rerecorded(bundle: Path) -> Path:
    """`bundle`'s manifest recording its files as they now are (a bundle changed and rebuilt, as far as a reader can
    tell)."""
    from vibevoice_onnx.runtime.bundle import rerecord

    rerecord(bundle)
    return bundle


def node_speaker(project: dict, url: str, **options):
    """Node.js's `speak` on the bundle at `url`, as web.check.whole_loop calls a JavaScript speaker."""
    def speak(text, rows, frames, voice):
        return node(project, action="speak", bundle=url, text=text, options={"cache": False, **options},
                    speak={"voice": voice, "noise": rows.tolist(), "maxFrames": frames})
    return speak


def test_the_npm_package_holds_the_module_its_types_and_the_runtime_the_site_pins(project):
    from importlib.metadata import version

    from vibevoice_onnx.web.npm import ONNXRUNTIME_WEB, TOKENIZERS

    assert {f["path"] for f in project["packed"]["files"]} == {"package.json", "vibevoice.mjs", "vibevoice.d.ts"}
    package = json.loads((STATIC / "package.json").read_text())
    assert package["version"] == version("vibevoice-onnx") and package["type"] == "module"
    assert package["exports"]["."] == {"types": "./vibevoice.d.ts", "default": "./vibevoice.mjs"}
    # the versions `web` writes into a site are the ones a developer's install resolves: one pin, two spellings
    assert package["dependencies"] == {TOKENIZERS.name: TOKENIZERS.version}
    assert package["peerDependencies"] == {"onnxruntime-web": ONNXRUNTIME_WEB.version,
                                           "onnxruntime-node": ONNXRUNTIME_WEB.version}
    installed = project["folder"] / "node_modules"
    assert json.loads((installed / "onnxruntime-node" / "package.json").read_text())["version"] == ONNXRUNTIME_WEB.version
    assert json.loads((installed / TOKENIZERS.name / "package.json").read_text())["version"] == TOKENIZERS.version


def node_caller(project: dict, bundle: Path):
    """Node.js's graph calls on `bundle`, as web.check.graph_calls makes them."""
    return lambda requests: node(project, action="calls", bundle=str(bundle), calls=requests,
                                 options={"cache": False})["outputs"]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_every_graph_call_in_node_gives_the_python_outputs(project, tiny_bundle, tiny_int8_bundle, precision):
    """Each graph's first call of a Python generation replayed through the module in Node.js: onnxruntime-node's
    kernels are Python onnxruntime's, so the outputs are the same (measured bit for bit at fp32 and int8; judged by
    the page's limits, in size and direction)."""
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.web.check import GRAPH_LIMITS, graph_calls

    bundle = {"fp32": tiny_bundle, "int8": tiny_int8_bundle}[precision]
    largest, lowest = GRAPH_LIMITS["wasm", "fp32" if precision == "fp32" else "quantized"]
    measured = graph_calls(node_caller(project, bundle), bundle, arithmetic=contextlib.nullcontext)
    print(precision, json.dumps(measured))
    assert {key.split(".")[0] for key in measured} == set(Bundle(bundle).info.graphs)
    assert all(difference <= largest and cosine >= lowest for difference, cosine in measured.values()), measured


@pytest.mark.parametrize("precision", ["fp32", "int8", "int8-decoder"])
def test_node_speaks_what_python_speaks_with_the_same_noise(project, request, precision):
    """The whole loop in Node.js against the Python runtime on the same text, voice and noise rows (`speak
    --noise`), judged as `web --check` judges the page: the same frames, cosine and gain within its limits. Node.js's
    onnxruntime computes as Python's does, so the Python side keeps its own arithmetic (measured: bit for bit at fp32
    and int8; int8 was cosine 0.99948 while the module ran the CFG streams in two calls a frame, each with its own
    dynamic activation scales)."""
    from vibevoice_onnx.web.check import LOOP_FRAMES, loop_verdict, whole_loop

    bundle = request.getfixturevalue({"fp32": "tiny_bundle", "int8": "tiny_int8_bundle",
                                      "int8-decoder": "tiny_int8_decoder_bundle"}[precision])
    with hosted(bundle) as (url, _):
        loop = whole_loop(node_speaker(project, url), bundle, "synthetic", arithmetic=contextlib.nullcontext)
    print(precision, f"cosine {loop['cosine']:.9f}", f"max|Δ| {loop['difference']:.2e} of scale", f"gain {loop['gain']:.9f}")
    assert loop["frames"] == (LOOP_FRAMES, LOOP_FRAMES) and loop["samples"].shape == (LOOP_FRAMES * 3200,)
    assert loop_verdict(loop, precision)["passed"]


def test_a_speech_frame_reads_the_upper_lm_once_for_both_cfg_streams(project, tiny_bundle):
    """The positive and negative CFG streams take each speech frame in one batch-2 call, as the Python runtime's do
    (the upper LM's weights read once a frame, not twice: most of a frame's time at full size). Text goes to the
    positive stream alone, a window of 5 tokens per 6 frames; the last frame ends the loop before its feedback."""
    frames = 13
    with hosted(tiny_bundle) as (url, _):
        answer = node(project, action="speak", bundle=url, text="A text long enough for three windows of five tokens.",
                      options={"cache": False}, speak={"seed": 3, "maxFrames": frames})
    assert answer["frames"] == frames and answer["stop"] == "max_frames", answer.get("error")
    windows = -(-frames // 6)
    assert answer["calls"]["lower_lm"] == windows
    assert answer["calls"]["upper_lm"] == windows + frames - 1  # two calls a frame: windows + 2 * (frames - 1)


def test_a_loop_louder_or_quieter_than_pythons_fails_the_gate_a_cosine_would_pass(project, tiny_bundle, tmp_path):
    """The loop gate's gain limit pinned by defects just past it: the decoder's and the other gain points' outputs
    scaled by 1.01 and 0.99 in a (re-recorded) copy keep the cosine at 1 and fail on gain alone."""
    from vibevoice_onnx.web.check import LOOP_COSINE, LOOP_GAIN, loop_verdict, whole_loop

    assert LOOP_GAIN < 0.01
    for factor in (1.01, 0.99):
        changed = rerecorded(gained_copy(tiny_bundle, tmp_path / str(factor), factor))
        with hosted(changed) as (url, _):
            loop = whole_loop(node_speaker(project, url), tiny_bundle, "synthetic", arithmetic=contextlib.nullcontext)
        verdict = loop_verdict(loop, "fp32")
        assert loop["cosine"] >= LOOP_COSINE["fp32"] and abs(loop["gain"] - factor) < 0.02, verdict
        assert not verdict["passed"]  # on gain alone


def test_files_are_checked_kept_by_sha256_and_a_second_load_needs_no_network(project, tiny_bundle, tmp_path):
    """A first load fetches each file once and keeps it; a second, with the host gone, loads and speaks the same from
    what was kept; a bundle rebuilt at the same URL (one file changed, so its manifest records a new sha256) fetches
    that file again and nothing else."""
    bundle, kept = copy_bundle(tiny_bundle, tmp_path / "bundle"), tmp_path / "kept"
    request = {"action": "speak", "text": "Kept, then offline.", "speak": {"seed": 5, "maxFrames": 4},
               "options": {"cacheDir": str(kept)}}
    with hosted(bundle) as (url, asked):
        first = node(project, bundle=url, **request)
    assert "error" not in first, first
    graphs = {g["file"] for g in json.loads((bundle / "manifest.json").read_text())["graphs"].values()}
    assert graphs <= set(asked) and len(asked) == len(set(asked))  # each file once
    assert first["progress"][-1]["loaded"] == first["progress"][-1]["total"] > 0
    second = node(project, bundle=url, **request)  # the host is gone
    assert "error" not in second and second["samples"] == first["samples"]
    tokenizer = json.loads((bundle / "tokenizer.json").read_text())
    (bundle / "tokenizer.json").write_text(json.dumps(tokenizer, indent=1))  # the same tokenizer, other bytes
    rerecorded(bundle)
    with hosted(bundle) as (url, asked):
        third = node(project, bundle=url, **request)
    assert "error" not in third and third["samples"] == first["samples"]
    assert asked == ["manifest.json", "tokenizer.json"]


def test_a_file_that_is_not_the_one_recorded_is_refused_in_one_sentence(project, tiny_bundle, tmp_path, monkeypatch):
    """Refused in one sentence, and nothing left behind (with `cache: false`, Node.js opens the graphs from a
    temporary folder)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    bundle = copy_bundle(tiny_bundle, tmp_path / "bundle")
    graph = bundle / "eos_classifier.onnx"
    graph.write_bytes(graph.read_bytes()[:-1] + b"\0")
    with hosted(bundle) as (url, _):
        answer = node(project, action="load", bundle=url, options={"cache": False})
    assert answer == {"error": f"{url}/eos_classifier.onnx: this file does not match the sha256 its manifest records; "
                               "it was changed or damaged on the way, so the bundle is refused"}
    with hosted(tmp_path / "nothing") as (url, _):
        missing = node(project, action="load", bundle=url, options={"cache": False})
    assert missing == {"error": f"{url}/manifest.json: the host answered 404"}
    gone = node(project, action="load", bundle=url, options={"cache": False})  # the host stopped, nothing kept
    assert gone["error"].startswith(f"{url}/manifest.json: cannot be read (ECONNREFUSED)"), gone
    assert not list((tmp_path / "tmp").iterdir())


@pytest.mark.parametrize("case", ["failed gates", "unverified int8"])
def test_a_bundle_speak_refuses_is_refused_with_speaks_sentence(project, tiny_bundle, tiny_int8_bundle, tmp_path,
                                                                 case):
    from vibevoice_onnx.runtime.bundle import Bundle

    bundle = with_parity(copy_bundle(tiny_bundle if case == "failed gates" else tiny_int8_bundle, tmp_path / "bundle"),
                         FAILED_PARITY if case == "failed gates" else None)
    with hosted(bundle) as (url, asked):
        answer = node(project, action="load", bundle=url, options={"cache": False})
    assert answer == {"error": Bundle(bundle).unusable(forcible=False).replace(str(bundle), url)}
    assert asked == ["manifest.json"]  # refused before a graph is fetched


def test_the_text_rule_is_pythons_character_for_character(project):
    """Whitespace is Python's str.isspace() over every code point, and the texts a user may paste (a byte-order mark,
    C1 controls, Unicode's other spaces) read as the Python runtime reads them, refusals included."""
    from vibevoice_onnx.errors import VibeVoiceError
    from vibevoice_onnx.text import normalise_tts_text

    texts = ["\ufeffHello\ufeff", "\u0085\u0091 text \u009f", "\u3000\u2003wide\u00a0spaces\u2029", "\u201cquoted\u201d",
             "tab\tand\u000bvertical", "\ufeff", " \u2028 ", "\x00\x1f", "", "\u200bzero width\u200b", "mid\u0080dle"]
    answer = node(project, action="text", texts=texts)
    assert answer["spaces"] == [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    for text, theirs in zip(texts, answer["normalised"]):
        try:
            ours = normalise_tts_text(text)
        except VibeVoiceError as error:
            ours = {"error": str(error)}
        assert theirs == ours, repr(text)


def test_the_tokenizer_in_node_gives_the_python_ids(project, tiny_bundle):
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.web.check import CORPUS

    answer = node(project, action="tokenize", bundle=str(tiny_bundle), texts=CORPUS, options={"cache": False})
    assert answer["voices"] == ["synthetic"] and answer["device"] == "cpu"
    assert answer["ids"] == [Bundle(tiny_bundle).tokenizer.encode(t, add_special_tokens=False).ids for t in CORPUS]


def test_node_reads_the_process_environment_cache_folder(project, tiny_bundle, tmp_path, monkeypatch):
    """Without cacheDir, files are kept under $VIBEVOICE_ONNX_JS_CACHE, by sha256; a bundle in a folder is read where
    it is, nothing of it copied there."""
    monkeypatch.setenv("VIBEVOICE_ONNX_JS_CACHE", str(tmp_path / "kept"))
    with hosted(tiny_bundle) as (url, _):
        assert "error" not in node(project, action="load", bundle=url)
    recorded = {r["sha256"] for r in json.loads((tiny_bundle / "manifest.json").read_text())["files"].values()}
    kept = {p.name for p in (tmp_path / "kept" / "sha256").iterdir()}
    assert kept and kept <= recorded
    shutil.rmtree(tmp_path / "kept")
    assert "error" not in node(project, action="load", bundle=str(tiny_bundle))  # a folder: read where it is
    assert not (tmp_path / "kept").exists()

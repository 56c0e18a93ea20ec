"""The JavaScript module in a web developer's own page (tests/javascript/page.html), in headless Chromium (Selenium)
and headless Firefox ESR (Marionette), a bundle loaded from another origin; and, in Firefox, the page `web` writes
held to the Python runtime by the gates `web --check` runs in Chromium (tests/test_browser_site.py). Every server
is a plain static one on 127.0.0.1, started and stopped here."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("selenium", reason="selenium is not installed (the `test` extra has it)")

from conftest import copy_bundle  # noqa: E402
from helpers import CHROMEDRIVER, CHROMIUM, FIREFOX, Firefox, chromium, hosted, tiny_sites  # noqa: E402

from vibevoice_onnx.web.check import (GRAPH_LIMITS, graph_calls, loop_verdict, open_page, page_arithmetic,  # noqa: E402
                                      page_caller, page_speaker, tokenizer_ids, whole_loop)
from vibevoice_onnx.web.site import served  # noqa: E402

WAIT = 600  # a script that takes longer is hung, never a slow machine
PAGE = Path(__file__).parent / "javascript" / "page.html"
SPEAK = """const done = arguments[arguments.length - 1], text = arguments[0];
const wait = () => globalThis.loaded ? globalThis.loaded.then(async (tts) => {
    const r = await tts.speak(text, {seed: 5, maxFrames: 4});
    const kept = globalThis.caches ? (await (await caches.open("vibevoice-onnx-files")).keys()).map((k) => k.url) : [];
    done({samples: Array.from(r.samples), kept, progress: globalThis.progress.at(-1), threads: tts.threads});
  }).catch((e) => done({error: e.message})) : setTimeout(wait, 50);
wait();"""


def installed(name: str) -> bool:
    if name == "chromium":
        return CHROMIUM.is_file() and CHROMEDRIVER.is_file()
    import importlib.util

    return FIREFOX.is_file() and importlib.util.find_spec("marionette_driver") is not None


@pytest.fixture(scope="module", params=["chromium", "firefox"])
def browser(request, tmp_path_factory):
    if not installed(request.param):
        pytest.skip(f"{request.param} (or its driver) is missing: run scripts/install-test-system-packages")
    folder = tmp_path_factory.mktemp(request.param)
    driver = chromium(folder, WAIT) if request.param == "chromium" else Firefox(folder, WAIT)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def firefox(tmp_path_factory):
    if not installed("firefox"):
        pytest.skip("firefox-esr or marionette-driver is missing: run scripts/install-test-system-packages")
    driver = Firefox(tmp_path_factory.mktemp("firefox"), WAIT)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def sites(tiny_bundle, tiny_int8_bundle, tmp_path_factory):
    """The sites `web` writes for the tiny realtime bundle at fp32 and int8 and for a copy whose gates failed, with
    the developer's page beside the fp32 one, on 127.0.0.1."""
    root = tiny_sites(tmp_path_factory.mktemp("sites"), tiny_bundle, tiny_int8_bundle, tmp_path_factory.mktemp("failed"))
    shutil.copy(PAGE, root / "fp32" / "page.html")
    with served(root) as url:
        yield url


def test_a_page_loads_a_bundle_from_another_origin_keeps_it_and_loads_it_again_with_that_host_gone(
        browser, sites, tiny_bundle, tmp_path):
    """The developer's page (its own origin) loads the bundle from another, each file checked and kept in Cache
    Storage by its sha256; with the bundle's host gone, the page loads again and speaks the same samples; a file
    that is not the one recorded is refused in one sentence where nothing is kept (?cache=0)."""
    bundle = copy_bundle(tiny_bundle, tmp_path / "bundle")
    recorded = json.loads((bundle / "manifest.json").read_text())["files"]
    with hosted(bundle, shared=True) as (url, asked):
        browser.get(f"{sites}/fp32/page.html?bundle={url}/")
        first = browser.execute_async_script(SPEAK, "From another origin.")
    assert "error" not in first, first
    assert first["threads"] > 1  # the page is cross-origin isolated, the bundle's host shares its files
    assert first["progress"]["loaded"] == first["progress"]["total"] > 0
    kept = {u.rsplit("/", 1)[-1] for u in first["kept"] if "/sha256/" in u}
    assert kept == {recorded[name]["sha256"] for name in asked if name in recorded}
    assert len(asked) == len(set(asked)) and "voices/synthetic.safetensors" in asked
    browser.get(f"{sites}/fp32/page.html?bundle={url}/")  # the bundle's host is gone
    second = browser.execute_async_script(SPEAK, "From another origin.")
    assert "error" not in second and second["samples"] == first["samples"]
    graph = bundle / "eos_classifier.onnx"
    graph.write_bytes(graph.read_bytes()[:-1] + b"\0")
    with hosted(bundle, shared=True) as (url, _):
        browser.get(f"{sites}/fp32/page.html?bundle={url}/&cache=0")
        damaged = browser.execute_async_script(SPEAK, "Refused.")
    assert damaged == {"error": f"{url}/eos_classifier.onnx: this file does not match the sha256 its manifest "
                                "records; it was changed or damaged on the way, so the bundle is refused"}


def test_firefox_runs_the_written_page_cross_origin_isolated_and_refuses_what_speak_refuses(firefox, sites):
    state = open_page(firefox, f"{sites}/fp32/")
    assert state["ok"] and state["isolated"] is True and state["threads"] > 1, state
    assert state["provider"] == "wasm" and state["voices"] == ["synthetic"]
    refused = open_page(firefox, f"{sites}/failed/")
    assert not refused["ok"] and "failed its parity gates (upper_lm (past 11, new 5))" in refused["message"]


def test_firefox_tokenizes_as_python(firefox, sites, tiny_bundle):
    from vibevoice_onnx.runtime.bundle import Bundle

    assert open_page(firefox, f"{sites}/fp32/")["ok"]
    theirs, ours = tokenizer_ids(firefox, Bundle(tiny_bundle))
    assert theirs == ours


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_firefox_gives_every_graph_call_and_the_whole_loop_of_python(firefox, sites, tiny_bundle, tiny_int8_bundle,
                                                                     precision):
    """On Firefox's WASM: each graph's call on a Python generation's inputs within the page's limits, and the whole
    loop on the same noise rows within the loop gate's, as `web --check` judges Chromium."""
    from vibevoice_onnx.runtime.bundle import Bundle

    bundle = {"fp32": tiny_bundle, "int8": tiny_int8_bundle}[precision]
    assert open_page(firefox, f"{sites}/{precision}/")["provider"] == "wasm"
    largest, lowest = GRAPH_LIMITS["wasm", "fp32" if precision == "fp32" else "quantized"]
    with page_arithmetic(bundle) as reference:
        measured = graph_calls(page_caller(firefox), reference, arithmetic=contextlib.nullcontext)
        loop = whole_loop(page_speaker(firefox), reference, "synthetic", arithmetic=contextlib.nullcontext)
    print(precision, json.dumps(measured), f"loop cosine {loop['cosine']:.7f} gain {loop['gain']:.6f}")
    assert {key.split(".")[0] for key in measured} == set(Bundle(bundle).info.graphs)
    assert all(difference <= largest and cosine >= lowest for difference, cosine in measured.values()), measured
    assert loop_verdict(loop, precision)["passed"], loop

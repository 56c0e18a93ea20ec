"""The static site `vibevoice-onnx web` writes, in a real browser: Debian's headless Chromium driven by Selenium,
the site served by a plain static HTTP server on 127.0.0.1 (started and stopped here) with the cross-origin
isolation headers a host must send. Its contract is parity with the Python runtime: the JavaScript tokenizer gives
the Python tokenizer's ids, and every graph the realtime loop calls gives, on onnxruntime-web's WASM, the outputs
the Python runtime's onnxruntime gives for the same inputs (the inputs of a real generation, captured). The
JavaScript packages come from the npm registry by pinned version and sha256, as a user's `web` fetches them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("selenium", reason="selenium is not installed (the `test` extra has it)")

from conftest import copy_bundle  # noqa: E402
from helpers import CHROMEDRIVER, CHROMIUM, chromium, tiny_sites  # noqa: E402

from vibevoice_onnx.web.check import (GRAPH_LIMITS, LOOP_COSINE, WEBGPU_ON_CPU, closeness, graph_calls,  # noqa: E402
                                      page_arithmetic, page_caller, page_speaker, tokenizer_ids,
                                      whole_loop)
from vibevoice_onnx.web.check import open_page as page  # noqa: E402  (the page at a URL, its API ready or refused)

if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
    pytest.skip(f"{CHROMIUM} or {CHROMEDRIVER} is missing: run scripts/install-test-system-packages",
                allow_module_level=True)
# How long a script or a wait in the page may take before the test calls it hung: a limit that catches a hang only,
# never a slow machine (the whole loop on WebGPU's software adapter took over 60 s on 2 loaded cores).
WAIT = 600


@pytest.fixture(scope="module")
def site_bundle(tiny_bundle, tmp_path_factory) -> Path:
    return copy_bundle(tiny_bundle, tmp_path_factory.mktemp("site-bundle") / "cpu_fp32")


@pytest.fixture(scope="module")
def int8_bundle(tiny_int8_bundle) -> Path:
    return tiny_int8_bundle


@pytest.fixture(scope="module")
def host(site_bundle, int8_bundle, tmp_path_factory):
    """The sites of the tiny realtime bundle at fp32 and int8 and of a copy whose gates failed, on 127.0.0.1."""
    from vibevoice_onnx.web.site import served

    root = tiny_sites(tmp_path_factory.mktemp("sites"), site_bundle, int8_bundle, tmp_path_factory.mktemp("failed"))
    with served(root) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = chromium(tmp_path_factory.mktemp("chromium"), WAIT, "--autoplay-policy=no-user-gesture-required",
                      *WEBGPU_ON_CPU)
    yield driver
    driver.quit()


def errors(browser) -> list[str]:
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def test_the_page_loads_the_bundle_cross_origin_isolated(host, browser, site_bundle):
    from vibevoice_onnx.runtime.bundle import Bundle

    state = page(browser, f"{host}/fp32/")
    assert state["ok"], state
    assert state["isolated"] is True and state["threads"] > 1  # the headers reach the page: WASM threads
    assert state["provider"] == "wasm" and state["adapter"]["software"] is True  # SwiftShader: not chosen
    assert state["gates"] == "not verified" and Bundle(site_bundle).info.parity is None  # fp32: usable unverified
    assert state["voices"] == Bundle(site_bundle).voices() == ["synthetic"]
    assert browser.find_element("id", "status").text == "Ready."
    assert browser.find_element("id", "provider").text.startswith(f"WASM on {state['threads']} threads; ?provider=webgpu")
    assert browser.find_element("id", "checked").text.startswith("not checked (vibevoice-onnx web --check")
    assert not errors(browser)


def test_the_page_refuses_a_bundle_that_failed_its_gates_as_speak_does(host, browser):
    state = page(browser, f"{host}/failed/")
    assert not state["ok"]
    assert "failed its parity gates" in state["message"] and "--force" not in state["message"]
    assert browser.find_element("id", "status").text == state["message"]


def test_the_page_runs_on_the_provider_asked_for(host, browser):
    state = page(browser, f"{host}/fp32/?provider=webgpu")
    assert state["ok"] and state["provider"] == "webgpu" and state["adapter"]["architecture"] == "swiftshader"
    assert browser.find_element("id", "provider").text.startswith("WebGPU (google swiftshader), WASM on ")
    assert page(browser, f"{host}/fp32/?provider=wasm")["provider"] == "wasm"
    state = page(browser, f"{host}/fp32/?provider=webgl")
    assert not state["ok"] and state["message"] == "?provider=webgl: the page runs on wasm or webgpu"
    assert browser.find_element("id", "status").text == state["message"]


# onnxruntime keeps shape arithmetic on the CPU whatever the provider.
SHAPE_OPS = {"Shape", "Squeeze", "Unsqueeze", "Reshape", "Mul", "Gather", "Concat", "Slice", "Cast"}


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_on_webgpu_only_the_int8_decoders_products_fall_back_to_wasm(host, browser, site_bundle, int8_bundle,
                                                                      precision):
    """Where onnxruntime-web places each graph's nodes on WebGPU: the LMs (GroupQueryAttention, 8-bit MatMulNBits
    at int8), the head, the connector and the EOS classifier wholly on WebGPU; in the decoder, WASM runs shape
    arithmetic and, at int8, its dynamic-int8 products (MatMulInteger and DynamicQuantizeLinear, which have no
    WebGPU kernel), one of each per product the graph holds."""
    import onnx

    from vibevoice_onnx.runtime.bundle import Bundle

    bundle = Bundle({"fp32": site_bundle, "int8": int8_bundle}[precision])
    assert page(browser, f"{host}/{precision}/?provider=webgpu")["ok"]
    placed = browser.execute_async_script("""
        const done = arguments[arguments.length - 1], api = globalThis.vibevoice;
        (async () => { const out = {};
          for (const name of Object.keys(api.manifest.graphs)) out[name] = await api.placement(name);
          done(out); })().catch((e) => done({error: e.message}));""")
    assert "error" not in placed, placed
    assert set(placed) == set(bundle.info.graphs)
    for name, providers in placed.items():
        if name != "acoustic_decoder_stream":
            assert list(providers) == ["WebGpuExecutionProvider"], (name, providers)
    decoder = placed["acoustic_decoder_stream"]
    wasm = decoder.get("CPUExecutionProvider", {"nodes": 0, "ops": {}})  # written graphs have no shape arithmetic
    assert decoder["WebGpuExecutionProvider"]["nodes"] > wasm["nodes"]
    on_wasm = {op: n for op, n in wasm["ops"].items() if op not in SHAPE_OPS}
    graph = onnx.load(bundle.path / bundle.info.graphs["acoustic_decoder_stream"]["file"], load_external_data=False)
    products = sum(node.op_type == "MatMulInteger" for node in graph.graph.node)
    assert (products > 0) == (precision == "int8")
    assert on_wasm == ({"MatMulInteger": products, "DynamicQuantizeLinear": products} if products else {}), decoder
    assert not errors(browser)


def test_the_javascript_tokenizer_gives_the_python_ids(host, browser, site_bundle):
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.web.check import CORPUS

    assert page(browser, f"{host}/fp32/")["ok"]
    theirs, ours = tokenizer_ids(browser, Bundle(site_bundle))
    assert sum(map(len, ours)) > 150
    for text, js, py in zip(CORPUS, theirs, ours):
        assert js == py, text


# Both providers at both precisions (WebGPU on SwiftShader, slow but in the suite: int8's products there are the
# GPU's MatMulNBits, its decoder's fall back to WASM).
@pytest.mark.parametrize("precision, provider", [("fp32", "wasm"), ("int8", "wasm"), ("fp32", "webgpu"),
                                                 ("int8", "webgpu")])
def test_every_graph_of_the_loop_gives_the_python_outputs(host, browser, site_bundle, int8_bundle, precision,
                                                          provider):
    """The loop's graphs, each fed what a Python generation fed it, on onnxruntime-web: the same outputs (the
    largest difference against the output's scale, and the cosine, within LIMITS)."""
    from vibevoice_onnx.runtime.bundle import Bundle

    bundle = {"fp32": site_bundle, "int8": int8_bundle}[precision]
    largest, lowest = GRAPH_LIMITS[provider, "fp32" if precision == "fp32" else "quantized"]
    assert page(browser, f"{host}/{precision}/?provider={provider}")["provider"] == provider
    measured = graph_calls(page_caller(browser), bundle)
    assert {key.split(".")[0] for key in measured} == set(Bundle(bundle).info.graphs)  # the loop called every graph
    print(provider, precision, json.dumps(measured))
    assert all(difference <= largest and cosine >= lowest for difference, cosine in measured.values()), measured
    assert not errors(browser)


@pytest.mark.parametrize("steps", [1, 2, 5, 10, 20, 37])
def test_the_pages_sampler_schedule_is_pythons(host, browser, steps):
    from vibevoice_onnx.sampling import DpmSolverSchedule

    assert page(browser, f"{host}/fp32/")["ok"]
    theirs = browser.execute_script("const s = globalThis.vibevoice.schedule(arguments[0]);"
                                    "return {timesteps: s.timesteps, sigmas: Array.from(s.sigmas)};", steps)
    ours = DpmSolverSchedule.create(steps)
    assert theirs["timesteps"] == ours.timesteps.tolist()
    assert np.array_equal(np.asarray(theirs["sigmas"], np.float32), ours.sigmas)  # fp32, bit for bit


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_latent_sampled_in_the_page_is_pythons(host, browser, site_bundle, int8_bundle, precision):
    """DPM-Solver++ with CFG over the head's graphs: the same conditions and noise give the Python runtime's latent
    in the page's arithmetic (the same arithmetic in another order, at fp32 and int8 alike)."""
    from vibevoice_onnx.generation.common import sample_next
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.runtime.realtime import OnnxRealtimeBackend
    from vibevoice_onnx.sampling import DpmSolverSchedule, NoiseSource

    bundle = {"fp32": site_bundle, "int8": int8_bundle}[precision]
    assert page(browser, f"{host}/{precision}/")["ok"]
    largest, lowest = GRAPH_LIMITS["wasm", "fp32" if precision == "fp32" else "quantized"]
    rng = np.random.default_rng(11)
    with page_arithmetic(bundle) as reference:
        backend = OnnxRealtimeBackend(Bundle(reference))
        for steps, cfg in ((5, 1.5), (10, 3.0)):
            positive, negative = (rng.standard_normal((1, backend.bundle.dims.lm.hidden)).astype(np.float32)
                                  for _ in range(2))
            noise = NoiseSource.from_seed(3)
            ours = sample_next(backend, DpmSolverSchedule.create(steps), noise, positive, negative, cfg, 0)
            theirs = browser.execute_async_script("""
                const done = arguments[arguments.length - 1], [positive, negative, noise, cfgScale, steps] = arguments;
                globalThis.vibevoice.sampleLatent({positive: Float32Array.from(positive), negative: Float32Array.from(negative),
                    noise: Float32Array.from(noise), cfgScale, steps}).then((x) => done(Array.from(x)), (e) => done(e.message));
                """, positive[0].tolist(), negative[0].tolist(), noise(0).tolist(), cfg, steps)
            assert isinstance(theirs, list), theirs
            difference, cosine = closeness(theirs, ours)
            assert difference <= largest and cosine >= lowest, (steps, cfg, difference, cosine)


@pytest.mark.parametrize("precision, provider", [("fp32", "wasm"), ("int8", "wasm"), ("fp32", "webgpu"),
                                                 ("int8", "webgpu")])
def test_the_page_speaks_what_python_speaks_with_the_same_noise(host, browser, site_bundle, int8_bundle, precision,
                                                                provider):
    """The whole loop in JavaScript (text windows, both LMs and their caches, CFG, the sampler, the connector, EOS,
    the streaming decoder) against the Python runtime on the same text, voice and noise rows (`speak --noise`), in
    the page's arithmetic (`page_arithmetic`: int8's products without x86's activation rounding, which differs by
    instruction set): the same frame count, the samples at LOOP_COSINE in direction and LOOP_GAIN in level."""
    from vibevoice_onnx.web.check import LOOP_FRAMES, LOOP_GAIN

    bundle = {"fp32": site_bundle, "int8": int8_bundle}[precision]
    assert page(browser, f"{host}/{precision}/?provider={provider}")["provider"] == provider
    loop = whole_loop(page_speaker(browser), bundle, "synthetic")
    print(provider, precision, f"cosine {loop['cosine']:.7f}", f"max|Δ| {loop['difference']:.2e} of scale",
          f"gain {loop['gain']:.6f}")
    assert loop["frames"] == (LOOP_FRAMES, LOOP_FRAMES) and loop["samples"].shape == (LOOP_FRAMES * 3200,)
    exactness = "fp32" if precision == "fp32" else "quantized"
    assert loop["cosine"] >= LOOP_COSINE[exactness] and abs(loop["gain"] - 1) <= LOOP_GAIN == 0.005, loop
    assert not errors(browser)


def test_the_page_speaks_from_its_form_and_plays_as_it_goes(host, browser):
    """The page's own form: a seed (the page's generator), Speak, frames played through the AudioWorklet as they
    are decoded; the same seed speaks the same again."""
    from selenium.webdriver.support.ui import WebDriverWait

    assert page(browser, f"{host}/fp32/")["ok"]
    heard = []
    for _ in range(2):
        browser.find_element("id", "text").clear()
        browser.find_element("id", "text").send_keys("Two sentences. The page speaks them.")
        browser.find_element("id", "frames").clear()
        browser.find_element("id", "frames").send_keys("12")  # random weights may never say EOS
        browser.find_element("id", "go").click()
        WebDriverWait(browser, WAIT).until(lambda d: d.find_element("id", "progress").text.startswith(("Done", "the", "no")))
        text = browser.find_element("id", "progress").text
        assert text.startswith("Done:") and "first audio after" in text, text
        heard.append(text.split(" in ")[0])
    assert heard[0] == heard[1] and heard[0].startswith("Done: 12 frames, 1.60 s")  # the same seed, the same speech
    assert browser.execute_script("return globalThis.vibevoice.audio.context.state") == "running"
    assert not errors(browser)


def test_text_streamed_into_the_page_speaks_what_python_speaks_for_the_whole_text(host, browser, site_bundle):
    """`stream()`: the text fed in pieces (split mid-word, in whitespace runs, with the demo's quotes) while the
    loop runs gives the whole text's ids (Python's encode_tts_text) and, on the same noise rows, the speech the
    Python runtime speaks for the whole text (`speak --noise`), judged as the whole-loop gate judges fp32."""
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.text import encode_tts_text
    from vibevoice_onnx.web.check import loop_verdict, whole_loop

    assert page(browser, f"{host}/fp32/")["ok"]
    text = "  Streamed \u201ctext\u201d, split   anywhere: mid-wo" + "rd, in spaces, and at the very end. "
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    ids = []

    def streamed(_, rows, frames, voice):  # whole_loop's speaker, fed the text in pieces
        result = browser.execute_async_script("""
            const done = arguments[arguments.length - 1], [pieces, noise, maxFrames, voice] = arguments;
            (async () => {
              const stream = globalThis.vibevoice.stream({voice, noise, maxFrames});
              for (const piece of pieces) { stream.feed(piece); await new Promise((r) => setTimeout(r, 5)); }
              stream.finish();
              const r = await stream.done;
              done({samples: Array.from(r.samples), rate: r.sampleRate, frames: r.frames, ids: stream.ids()});
            })().catch((e) => done({error: e.message}));
            """, pieces, rows.tolist(), frames, voice)
        ids.extend(result.get("ids", []))
        return result

    loop = whole_loop(streamed, site_bundle, "synthetic", text=text, frames=20)
    assert ids == encode_tts_text(Bundle(site_bundle).tokenizer, text)
    verdict = loop_verdict(loop, "fp32")
    assert verdict["passed"] and loop["frames"] == (20, 20), verdict


def test_serve_offers_the_page_at_local_and_it_speaks_what_python_speaks(host, browser, site_bundle, tiny_asr_bundle,
                                                                         tmp_path):
    """`serve`'s /local/: the same page for each served realtime bundle, cross-origin isolated (WASM threads), its
    speech on given noise rows the Python runtime's (`speak --noise`), judged as the whole-loop gate judges fp32."""
    from helpers import Server

    from vibevoice_onnx.web.check import loop_verdict, page_speaker, whole_loop

    running = Server([site_bundle, tiny_asr_bundle], tmp_path / "server.log", key=None)  # a key withholds /local/
    try:
        ready = page(browser, f"{running.url}/local/")
        assert browser.current_url == f"{running.url}/local/vibevoice-realtime-cpu-fp32/"
        assert ready["ok"] and ready["isolated"] and ready["threads"] > 1, ready
        loop = whole_loop(page_speaker(browser), site_bundle, "synthetic", text="Served, then computed in the tab.",
                          frames=6)
        verdict = loop_verdict(loop, "fp32")
        assert verdict["passed"] and loop["frames"] == (6, 6), verdict
        assert not errors(browser)
    finally:
        assert running.stop() == 0, (tmp_path / "server.log").read_text()


def test_web_check_holds_the_page_to_the_python_runtime_and_the_page_shows_its_record(browser, site_bundle, int8_bundle,
                                                                                     tmp_path):
    """`web --check`: the written site's page in headless Chromium against the Python runtime (tokenizer, every
    graph, the whole loop), its record in the site and on the page; a page that is not the bundle's (the int8
    site held to the fp32 bundle) fails it."""
    from helpers import cli_run

    from vibevoice_onnx.web.check import GATES_RECORD, check_site
    from vibevoice_onnx.web.site import served, write_site

    done = cli_run("web", str(site_bundle), "-o", str(tmp_path / "site"), "--check")
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "site" / GATES_RECORD).read_text())
    assert record["passed"] and record["provider"] == "wasm" and record["browser"].startswith("Chromium ")
    tokenizer, graphs, loop = record["gates"]
    assert tokenizer["differing"] == [] and graphs["largest_difference"] <= 1e-4 and loop["cosine"] >= 0.999
    assert "browser gates passed" in done.stderr
    with served(tmp_path / "site") as url:
        assert page(browser, f"{url}/")["ok"]
        shown = browser.find_element("id", "checked").text
        assert shown.startswith(f"passed on {record['browser']}, wasm, ") and f"{loop['cosine']:.7f}" in shown
    failed = check_site(write_site(int8_bundle, tmp_path / "int8", log=lambda _: None), site_bundle, log=lambda _: None)
    assert not failed["passed"] and [g["passed"] for g in failed["gates"]] == [True, False, False]

"""The browser parity gate of a written site (`vibevoice-onnx web --check`): the site served on 127.0.0.1, its page
opened in headless Chromium (Selenium, the `browser` extra) and held to the Python runtime on the bundle it was
written from: the tokenizer's ids on a corpus of odd Unicode, every graph's call on a real generation's inputs,
and the whole loop on injected noise against `speak --noise`. Its record goes into the site (GATES_RECORD), and the
page shows it. The tests drive the same gates (tests/test_browser_site.py)."""

from __future__ import annotations

import contextlib
import datetime
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..errors import VibeVoiceError
from .parity import first_calls, unwire, wire
from .site import GATES_RECORD, served

# Odd Unicode a tokenizer can get wrong: combining marks, CJK, emoji with joiners and skin tones, right-to-left
# text, digits of other scripts, whitespace runs and controls, a replacement character.
CORPUS = ["Hello, world! It's 3:45 p.m. — isn't it?", "naïve café, Ångström, ﬁne ligatures, ß and ẞ",
          "e\u0301 versus é (NFC against NFD)", "中文的句子，还有标点。日本語のテキスト。한국어 문장.",
          "👩🏽‍💻 and 👨‍👩‍👧‍👦 and 🏳️‍🌈", "مرحبا بالعالم שלום עולם", "١٢٣ ४५६ ๗๘๙ and 123,456.78",
          "tabs\tand  double  spaces\nand new\nlines   ", "\u200b\u00ad\ufeffzero-width\ufffd", "   ", ""]
# The largest difference against the output's scale, and the cosine, each graph call may show, against Python in the
# page's arithmetic (page_arithmetic). fp32 on WASM: only the order of sums differs (measured 8.6e-7, cosine
# 1 - 2e-13), and int8 on WASM as much (5.1e-7: its 8-bit products are the dequantized weights' in fp32); on WebGPU
# (SwiftShader) the head's conditioning differs most at fp32 (6.6e-5: WGSL's sin and cos are looser than libm's),
# and at int8 the LMs (0.011 of scale, cosine 0.99994: WebGPU's MatMulNBits rounds in its own way).
GRAPH_LIMITS = {("wasm", "fp32"): (1e-4, 0.99999), ("webgpu", "fp32"): (2e-4, 0.99999),
                ("wasm", "quantized"): (1e-4, 0.99999), ("webgpu", "quantized"): (5e-2, 0.999)}
# The whole loop's samples against `speak --noise`'s in the page's arithmetic, same frame count, in direction
# (cosine) and in level (RMS over RMS), both decoding in Python's groups and batching the CFG streams as Python
# does. fp32 measured 1.0000000 and 1.000000 (Node.js: bit for bit, at int8 too: onnxruntime-node's int8
# activations are Python's on x86). int8 0.99984 and 0.99969 on WASM (Chromium and Firefox alike), 0.99884 and
# 0.99801 on WebGPU (SwiftShader): the decoder's dynamic int8 rounds its activations on every backend, so a
# difference of an ulp upstream can move an activation a whole step, which the closed loop carries on. Each limit
# leaves 2x room or more over the worst measured.
LOOP_COSINE, LOOP_GAIN = {"fp32": 0.999, "quantized": 0.997}, 0.005
LOOP_TEXT, LOOP_FRAMES, LOOP_SEED = "The page speaks \u201cas Python does\u201d, window after window.", 14, 5
CHROMIUM, CHROMEDRIVER = ("chromium", "chromium-browser", "google-chrome"), ("chromedriver",)
# WebGPU on SwiftShader, Chromium's own Vulkan on the CPU: onnxruntime-web's WebGPU kernels (its WGSL shaders) run
# for real, without a GPU (correct, and slow: a software adapter, which the page does not choose itself).
WEBGPU_ON_CPU = ("--enable-unsafe-webgpu", "--use-webgpu-adapter=swiftshader", "--enable-features=Vulkan")

READY = """const done = arguments[arguments.length - 1];
const wait = () => globalThis.vibevoice ? globalThis.vibevoice.ready.then(
    (api) => done({ok: true, threads: api.threads, isolated: globalThis.crossOriginIsolated, voices: api.voices,
                   gates: api.gates, provider: api.device, adapter: api.adapter}),
    (error) => done({ok: false, message: error.message})) : setTimeout(wait, 50);
wait();"""
RUN = """const done = arguments[arguments.length - 1];
globalThis.vibevoice.run(arguments[0], arguments[1], arguments[2]).then(done, (e) => done({error: e.message}));"""
SPEAK = """const done = arguments[arguments.length - 1], [text, noise, frames, voice] = arguments;
globalThis.vibevoice.speak(text, {voice, noise, maxFrames: frames}).then(
    (r) => done({samples: Array.from(r.samples), rate: r.sampleRate, frames: r.frames, stop: r.stopReason}),
    (e) => done({error: e.message}));"""


def executable(names: tuple[str, ...], what: str) -> str:
    for name in names:
        if found := shutil.which(name):
            return found
    raise VibeVoiceError(f"{what} is not installed (looked for {', '.join(names)}): web --check drives headless "
                         "Chromium through its driver (Debian: apt install chromium chromium-driver)")


def headless_chromium(folder: Path, script_timeout: float, *flags: str):
    """Headless Chromium under Selenium, its profile and driver log in `folder`, console logs kept."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise VibeVoiceError("web --check drives a browser with Selenium: pip install 'vibevoice-onnx[browser]'") from None
    options = webdriver.ChromeOptions()
    options.binary_location = executable(CHROMIUM, "Chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={folder / 'profile'}", *flags):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable(CHROMEDRIVER, "chromedriver"), log_output=str(folder / "driver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(script_timeout)
    return driver


def open_page(driver, url: str) -> dict:
    """The page at `url`, its API ready (or refused): {ok, message | threads, provider, ...}."""
    driver.get(url)
    return driver.execute_async_script(READY)


def closeness(got, expected) -> tuple[float, float]:
    """The largest difference against the expected array's scale, and the cosine (1 where either is zero)."""
    got, expected = np.asarray(got, np.float64).ravel(), np.asarray(expected, np.float64).ravel()
    scale = float(np.abs(expected).max(initial=0)) or 1.0
    norms = float(np.linalg.norm(got) * np.linalg.norm(expected))
    cosine = float(got @ expected / norms) if expected.size > 1 and norms > 0 else 1.0
    return float(np.abs(got - expected).max(initial=0)) / scale, cosine


def tokenizer_ids(driver, bundle) -> tuple[list, list]:
    """The page's ids and the Python tokenizer's for each text of CORPUS."""
    theirs = driver.execute_script("return arguments[0].map((text) => globalThis.vibevoice.tokenize(text));", CORPUS)
    return theirs, [bundle.tokenizer.encode(text, add_special_tokens=False).ids for text in CORPUS]


def loop_rows(frames: int = LOOP_FRAMES) -> np.ndarray:
    return np.random.default_rng(LOOP_SEED).standard_normal((frames, 64)).astype(np.float32)


@contextlib.contextmanager
def page_arithmetic(bundle_dir: Path):
    """The bundle as the page computes it, for the Python side of a gate: its 8-bit MatMulNBits products at accuracy
    level 0 (the dequantized weights times fp32 activations: what onnxruntime-web's WASM and WebGPU kernels do)
    where the bundle asks for level 4 (int8 activations: x86's kernels, whose rounding differs by instruction set:
    AVX2, AVX-512 VNNI and AMX each round their own way). The same weights and the same graphs otherwise, so a gate
    against it holds the page to Python's own arithmetic on every host. Yields a copy so changed, in a temporary
    folder, or the bundle itself where nothing is to change."""
    import onnx

    from ..runtime.bundle import rerecord

    bundle_dir = Path(bundle_dir)
    models = {path.name: onnx.load(path, load_external_data=False) for path in sorted(bundle_dir.glob("*.onnx"))}
    changed = {name: model for name, model in models.items() if leveled(model)}
    if not changed:
        yield bundle_dir
        return
    with tempfile.TemporaryDirectory(prefix="vibevoice-page-arithmetic-") as folder:
        twin = Path(shutil.copytree(bundle_dir, Path(folder) / bundle_dir.name))
        for name, model in changed.items():
            for attribute in leveled(model):
                attribute.i = 0
            onnx.save(model, twin / name)
        rerecord(twin)
        yield twin


def leveled(model) -> list:
    """The accuracy_level attributes of a graph's MatMulNBits nodes that are not 0."""
    return [a for node in model.graph.node if node.op_type == "MatMulNBits"
            for a in node.attribute if a.name == "accuracy_level" and a.i != 0]


def page_caller(driver):
    """The page's graph calls in `driver`'s browser, as graph_calls makes them: [{name, feeds, fetches}] (arrays in
    the wire form) -> [{output: wire array} or {error}]."""
    return lambda requests: [driver.execute_async_script(RUN, r["name"], r["feeds"], r["fetches"]) for r in requests]


def graph_calls(caller, bundle_dir: Path, arithmetic=page_arithmetic) -> dict[str, tuple[float, float]]:
    """Each graph's first call of a Python generation, in `arithmetic` (the page's, by default), replayed by the
    JavaScript module (`caller`: page_caller, or Node.js's): {graph.output: closeness}."""
    with arithmetic(bundle_dir) as reference:
        calls = first_calls(reference)
    results = caller([{"name": name, "feeds": {k: wire(v) for k, v in inputs.items()}, "fetches": list(outputs)}
                      for name, (inputs, outputs) in calls.items()])
    measured = {}
    for (name, (_, outputs)), result in zip(calls.items(), results):
        if "error" in result:
            raise VibeVoiceError(f"the JavaScript module could not run {name}: {result['error']}")
        for output, expected in outputs.items():
            got = unwire(result[output])
            if got.shape != expected.shape:
                raise VibeVoiceError(f"{name}.{output}: JavaScript gave shape {got.shape}, Python {expected.shape}")
            measured[f"{name}.{output}"] = closeness(got, expected)
    return measured


def page_speaker(driver):
    """The page's `speak` in `driver`'s browser, as whole_loop calls a JavaScript speaker: (text, noise rows, frames,
    voice) -> {samples, rate, frames, stop} or {error}."""
    return lambda text, rows, frames, voice: driver.execute_async_script(SPEAK, text, rows.tolist(), frames, voice)


def whole_loop(speaker, bundle_dir: Path, voice: str, text: str = LOOP_TEXT, frames: int = LOOP_FRAMES,
               arithmetic=page_arithmetic) -> dict:
    """The JavaScript loop's `speak` (`speaker`: page_speaker, or Node.js's) against the Python runtime's on the same
    text, voice and noise rows, the Python side in `arithmetic` (the page's, by default; onnxruntime-node computes as
    Python's onnxruntime does): {frames: (JavaScript, Python), cosine, difference, gain (JavaScript's RMS over
    Python's), samples: JavaScript's}."""
    from ..runtime.speech import open_tts
    from ..sampling import NoiseSource

    rows = loop_rows(frames)
    with arithmetic(bundle_dir) as reference:
        ours, rate = open_tts(reference).create(text, voice=voice, noise=NoiseSource(rows=rows), max_frames=frames)
    theirs = speaker(text, rows, frames, voice)
    if "error" in theirs:
        raise VibeVoiceError(f"the JavaScript loop could not speak: {theirs['error']}")
    samples = np.asarray(theirs["samples"], np.float64)
    if theirs["rate"] != rate or samples.shape != ours.shape:
        return {"frames": (theirs["frames"], frames), "cosine": 0.0, "difference": float("inf"), "gain": 0.0,
                "samples": samples}
    difference, cosine = closeness(samples, ours)
    return {"frames": (theirs["frames"], frames), "cosine": cosine, "difference": difference,
            "gain": gain(samples, ours), "samples": samples}


def gain(got, expected) -> float:
    """RMS over RMS: a loop off in level (louder or quieter throughout) keeps its cosine, not its gain."""
    rms = float(np.sqrt(np.mean(np.square(np.asarray(expected, np.float64)))))
    return float(np.sqrt(np.mean(np.square(np.asarray(got, np.float64))))) / rms if rms > 0 else 1.0


def check_site(site: Path, bundle_dir: Path, provider: str = "wasm", log=print) -> dict:
    """The gates of `site` (written from `bundle_dir`) in headless Chromium on `provider`; their record is written
    into the site as GATES_RECORD and returned ({passed, gates: [...], browser, ...})."""
    from ..runtime.bundle import Bundle

    bundle = Bundle(Path(bundle_dir))
    exactness = "fp32" if bundle.info.precision == "fp32" else "quantized"
    # one copy in the page's arithmetic serves both gates (each would make its own from the bundle)
    with served(site) as url, tempfile.TemporaryDirectory(prefix="vibevoice-check-") as folder, \
            page_arithmetic(bundle.path) as reference:
        driver = headless_chromium(Path(folder), 600, *(WEBGPU_ON_CPU if provider == "webgpu" else ()))
        try:
            state = open_page(driver, f"{url}/?provider={provider}")
            if not state["ok"]:
                raise VibeVoiceError(f"the page refused the bundle: {state['message']}")
            gates = [tokenizer_gate(driver, bundle, log), graph_gate(driver, reference, provider, exactness, log),
                     loop_gate(driver, reference, bundle.voices(), exactness, log)]
            browser = driver.capabilities.get("browserVersion", "?")
        finally:
            driver.quit()
    record = {"checked_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "browser": f"Chromium {browser} (headless)", "provider": state["provider"], "threads": state["threads"],
              "passed": all(g["passed"] for g in gates), "gates": gates}
    (Path(site) / GATES_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def tokenizer_gate(driver, bundle, log) -> dict:
    theirs, ours = tokenizer_ids(driver, bundle)
    differing = [text for text, a, b in zip(CORPUS, theirs, ours) if a != b]
    log(f"  tokenizer: {len(CORPUS) - len(differing)}/{len(CORPUS)} texts give Python's ids")
    return {"name": "tokenizer ids, odd Unicode", "texts": len(CORPUS), "differing": differing,
            "passed": not differing}


def graph_gate(driver, bundle_dir: Path, provider: str, exactness: str, log) -> dict:
    largest, lowest = GRAPH_LIMITS[provider, exactness]
    measured = graph_calls(page_caller(driver), bundle_dir)
    worst_difference = max(d for d, _ in measured.values())
    worst_cosine = min(c for _, c in measured.values())
    log(f"  graph calls: largest difference {worst_difference:.2g} of scale, lowest cosine {worst_cosine:.6f}")
    return {"name": "every graph's call on a Python generation's inputs", "outputs": len(measured),
            "largest_difference": worst_difference, "lowest_cosine": worst_cosine,
            "limit": {"difference": largest, "cosine": lowest},
            "passed": worst_difference <= largest and worst_cosine >= lowest}


def loop_gate(driver, bundle_dir: Path, voices: list[str], exactness: str, log) -> dict:
    if not voices:
        return {"name": "the whole loop against speak --noise", "passed": False, "why": "the bundle has no voice"}
    loop = whole_loop(page_speaker(driver), bundle_dir, voices[0])
    log(f"  whole loop: {loop['frames'][0]} frames (Python {loop['frames'][1]}), cosine {loop['cosine']:.7f}, "
        f"gain {loop['gain']:.6f}")
    return loop_verdict(loop, exactness)


def loop_verdict(loop: dict, precision: str) -> dict:
    """A whole loop (whole_loop) judged: the same frames, and the samples within LOOP_COSINE in direction and
    LOOP_GAIN in level for the bundle's `precision` (fp32, or any quantized one)."""
    exactness = "fp32" if precision == "fp32" else "quantized"
    return {"name": "the whole loop against speak --noise", "frames": list(loop["frames"]),
            "cosine": loop["cosine"], "largest_difference": loop["difference"],
            "gain": loop["gain"], "limit": {"cosine": LOOP_COSINE[exactness], "gain": LOOP_GAIN},
            "passed": (loop["frames"][0] == loop["frames"][1] and loop["cosine"] >= LOOP_COSINE[exactness]
                       and abs(loop["gain"] - 1) <= LOOP_GAIN)}

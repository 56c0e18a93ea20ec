"""A realtime bundle's graphs in headless Chromium (onnxruntime-web, WASM) against the Python runtime's onnxruntime,
on the same machine in one run: the site's size, the page's load, each graph's session creation, each graph's
call on the inputs a Python generation gave it (median of --repeats, the graph's own time in both), whole
generations, and the browser's peak memory.

    .venv/bin/python benchmarks/browser.py BUNDLE [--threads 2] [--repeats 5] [--provider wasm] [--json FILE]

--threads is Python's and the page's (?threads=, WASM threads; more than one needs the isolation headers the
local server sends).

Then the page speaks --frames latents twice (cold, then warm: first audio, seconds, RTF) beside `vibevoice-onnx
bench` of the same bundle (RTF, first audio cold and warm), and where onnxruntime-web placed each graph's nodes.
`--provider webgpu` runs the page on WebGPU; with no GPU here that is Chromium's SwiftShader (WebGPU's kernels on
the CPU): its placement is the real one, its times say nothing of a GPU's. Uses
the tests' Chromium (Debian's chromium and chromedriver, scripts/install-test-system-packages). Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from phases import header, print_results, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SESSIONS = "return {ready: globalThis.vibevoice.timings.ready};"  # the load's: manifest read to sessions made
PLACEMENT = """const done = arguments[arguments.length - 1], api = globalThis.vibevoice, out = {};
(async () => { for (const name of Object.keys(api.manifest.graphs)) out[name] = await api.placement(name);
  done(out); })().catch((error) => done({error: error.message}));"""
CALLS = """const done = arguments[arguments.length - 1], api = globalThis.vibevoice;
(async () => { api.timings[arguments[0]] = [];
  for (let i = 0; i < arguments[3]; i++) await api.run(arguments[0], arguments[1], arguments[2]);
  done(api.timings[arguments[0]]); })().catch((error) => done({error: error.message}));"""


SPEAK = """const done = arguments[arguments.length - 1], api = globalThis.vibevoice;
(async () => { const runs = [];
  for (let i = 0; i < 2; i++) { const start = performance.now(); let first = null;
    const r = await api.speak(arguments[0], {seed: 42, maxFrames: arguments[1], onAudio: () => { first ??= performance.now() - start; }});
    const seconds = (performance.now() - start) / 1000;
    runs.push({frames: r.frames, first_audio_seconds: first / 1000, seconds, real_time_factor: seconds / (r.samples.length / r.sampleRate)}); }
  done(runs); })().catch((error) => done({error: error.message}));"""
TEXT = "The whole realtime loop runs in this tab, window after window, with nothing computed on a server."


def python_bench(bundle: Path, frames: int, threads: int) -> dict:
    """`vibevoice-onnx bench` of the same bundle: the Python runtime's RTF and first audio, cold and warm."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", "bench", str(bundle), "--frames", str(frames),
                           "--threads", str(threads), "--json"], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)["runtime"]
    return {k: report[k] for k in ("real_time_factor", "first_audio_seconds", "warm_first_audio_seconds", "peak_memory_bytes")}


def browser_peak_bytes() -> int:
    """The largest peak resident memory (VmHWM) of this machine's Chromium processes: the renderer running WASM."""
    peaks = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        if "\nName:\tchromium" in "\n" + text and "VmHWM" in text:
            peaks.append(int(text.split("VmHWM:")[1].split()[0]) * 1024)
    return max(peaks, default=0)


def python_times(bundle: Path, name: str, inputs: dict, outputs: list[str], threads: int, repeats: int) -> list[float]:
    import onnxruntime as ort

    from vibevoice_onnx.runtime.bundle import Bundle

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(bundle / Bundle(bundle).info.graphs[name]["file"]), options,
                                   providers=["CPUExecutionProvider"])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(outputs, inputs)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> int:
    from helpers import chromium

    from vibevoice_onnx.web.check import WEBGPU_ON_CPU, open_page
    from vibevoice_onnx.web.parity import first_calls, wire
    from vibevoice_onnx.web.site import served, write_site

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--threads", type=int, default=2, help="Python's threads, and the page's WASM threads")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--frames", type=int, default=24, help="latents the page speaks (twice: cold, then warm)")
    parser.add_argument("--provider", choices=["wasm", "webgpu"], default="wasm",
                        help="the page's provider (webgpu: SwiftShader's, on this machine's CPU)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vibevoice-browser-") as folder:
        site = write_site(args.bundle, Path(folder) / "site", log=lambda _: None)
        size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
        (Path(folder) / "chromium").mkdir()
        with served(site) as url:
            driver = chromium(Path(folder) / "chromium", 600, *(WEBGPU_ON_CPU if args.provider == "webgpu" else ()))
            try:
                start = time.perf_counter()
                ready = open_page(driver, f"{url}/?provider={args.provider}&threads={args.threads}")
                ready_seconds = time.perf_counter() - start
                if not ready["ok"]:
                    raise SystemExit(f"the page refused the bundle: {ready['message']}")
                sessions = driver.execute_script(SESSIONS)
                placement = driver.execute_async_script(PLACEMENT)
                print(f"placement: {json.dumps(placement)}", flush=True)
                graphs = {}
                for name, (inputs, outputs) in first_calls(args.bundle).items():
                    wasm = driver.execute_async_script(CALLS, name, {k: wire(v) for k, v in inputs.items()}, list(outputs),
                                                       args.repeats)
                    python = python_times(args.bundle, name, inputs, list(outputs), args.threads, args.repeats)
                    graphs[name] = {"inputs": {k: list(v.shape) for k, v in inputs.items() if v.ndim and v.size > 1},
                                    "wasm_ms_median": round(statistics.median(wasm[1:] or wasm), 2),
                                    "python_ms_median": round(statistics.median(python[1:] or python), 2),
                                    "wasm_ms": [round(t, 2) for t in wasm], "python_ms": [round(t, 2) for t in python]}
                    graphs[name]["ratio"] = round(graphs[name]["wasm_ms_median"] / max(graphs[name]["python_ms_median"], 1e-3), 1)
                    print(f"{name:28s} WASM {graphs[name]['wasm_ms_median']:8.2f} ms, Python {graphs[name]['python_ms_median']:7.2f} ms",
                          flush=True)
                speech = driver.execute_async_script(SPEAK, TEXT, args.frames)
                print(f"the page speaks {args.frames} frames: {speech}", flush=True)
                peak = browser_peak_bytes()
                start = time.perf_counter()  # a second visit: every file read from Cache Storage, none fetched
                again = open_page(driver, f"{url}/?provider={args.provider}&threads={args.threads}")
                second_visit = {"page_ready_seconds": round(time.perf_counter() - start, 2),
                                "session_ms": {k: round(v, 1) for k, v in driver.execute_script(SESSIONS).items()},
                                "ok": again["ok"]}
                print(f"a second visit: {second_visit}", flush=True)
            finally:
                driver.quit()
    results = {**header(), "bundle": str(args.bundle), "site_bytes": size, "page_ready_seconds": round(ready_seconds, 2),
               "provider": ready["provider"], "adapter": ready["adapter"], "placement": placement,
               "wasm_threads": ready["threads"], "python_threads": args.threads,
               "session_ms": {k: round(v, 1) for k, v in sessions.items()}, "browser_peak_bytes": peak,
               "second_visit": second_visit,
               "graph_calls": graphs, "speak_in_the_page": {"text": TEXT, "seed": 42, "runs": speech},
               "python_bench": python_bench(args.bundle, args.frames, args.threads),
               "note": "each graph's first call in a Python generation (3 latents), replayed; the median leaves out the first call"}
    return print_results(results, args.json)


if __name__ == "__main__":
    run(main)

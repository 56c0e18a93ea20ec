"""The torch-free runtime: no torch import anywhere, the Python API, and `speak` from the command line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from vibevoice_onnx.cli import main
from vibevoice_onnx.reference.realtime import generate
from vibevoice_onnx.runtime.realtime import RealtimeTTS
from vibevoice_onnx.sampling import NoiseSource
from vibevoice_onnx.text import encode_tts_text
from vibevoice_onnx.verify.common import gain, relative_error

from conftest import copy_bundle
from helpers import run_torch_free

TEXT = "Hello there, this is the runtime speaking."

def test_runtime_runs_with_torch_and_transformers_blocked(tiny_bundle, tmp_path):
    proc = run_torch_free(f"""
import vibevoice_onnx.runtime.bundle, vibevoice_onnx.runtime.realtime, vibevoice_onnx.commands.speak
import vibevoice_onnx.runtime.voice_store, vibevoice_onnx.generation.realtime, vibevoice_onnx.voices
from vibevoice_onnx.cli import main
assert main(["voices", "list", {str(tiny_bundle)!r}]) == 0
assert main(["speak", {str(tiny_bundle)!r}, "Hello.", "--seed", "1", "--max-frames", "3", "-o", {str(tmp_path / "a.wav")!r}]) == 0
""")
    assert proc.returncode == 0, proc.stderr
    assert "torch-free ok" in proc.stdout
    assert sf.info(str(tmp_path / "a.wav")).frames == 3 * 3200


def test_host_tensors_are_read_as_memory_maps_with_the_stored_values(tmp_path):
    import ml_dtypes
    from safetensors.numpy import load_file, save_file

    from vibevoice_onnx.runtime.bundle import map_safetensors

    rng = np.random.default_rng(0)
    stored = {"table": rng.standard_normal((7, 5)).astype(ml_dtypes.bfloat16), "scale": np.array(0.25, np.float32),
              "ids": np.arange(6, dtype=np.int64), "half": rng.standard_normal(3).astype(np.float16),
              "empty": np.zeros((0, 4), np.float32)}
    save_file(stored, str(tmp_path / "host.safetensors"))
    mapped, loaded = map_safetensors(tmp_path / "host.safetensors"), load_file(str(tmp_path / "host.safetensors"))
    assert mapped.keys() == loaded.keys()
    for name, array in loaded.items():
        assert mapped[name].dtype == array.dtype and mapped[name].shape == array.shape
        assert np.array_equal(mapped[name].astype(np.float64), array.astype(np.float64))
    assert not mapped["table"].flags.writeable  # a view of the file, never a copy that could drift from it
    data = (tmp_path / "host.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-4])
    with pytest.raises(ValueError, match="does not fit the file"):
        map_safetensors(tmp_path / "cut.safetensors")


def test_only_streaming_conv_sessions_keep_their_memory_arena(tiny_bundle):
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.runtime.realtime import OnnxRealtimeBackend

    backend = OnnxRealtimeBackend(Bundle(tiny_bundle))
    # The streaming decoder runs on the same shapes every group: its buffers are kept and reused. The loop's
    # other graphs release what they allocate after each call.
    # Without a memory pattern, whose whole-plan blocks (one per input shape) the arena would keep for good.
    decoder = backend.decoder.session.get_session_options()
    assert decoder.enable_cpu_mem_arena and not decoder.enable_mem_pattern
    for name, session in backend.sessions.items():
        assert session.get_session_options().enable_cpu_mem_arena == (name == "acoustic_decoder_stream"), name


def test_a_shared_thread_pool_speaks_alike_and_keeps_its_size(tiny_bundle):
    """share_threads(): the same audio as sessions with pools of their own; one size per process, and
    sessions that ask for another size or a pool of their own are refused with a sentence, not by onnxruntime."""
    proc = run_torch_free(f"""
import numpy as np, onnxruntime as ort
from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.runtime.bundle import Bundle, share_threads, shared_pool_threads
from vibevoice_onnx.runtime.realtime import RealtimeTTS
bundle = {str(tiny_bundle)!r}
own, _ = RealtimeTTS(bundle, threads=2).create("Hello there.", voice="synthetic", seed=3, max_frames=4)
assert shared_pool_threads() is None
assert share_threads(2) == 2 and share_threads() == 2 and shared_pool_threads() == 2
tts = RealtimeTTS(bundle)
shared, _ = tts.create("Hello there.", voice="synthetic", seed=3, max_frames=4)
assert shared.shape == own.shape == (4 * 3200,)
np.testing.assert_allclose(shared, own, atol=1e-6)
assert not any(s.get_session_options().use_per_session_threads for s in tts.backend.sessions.values())
for refused in (lambda: share_threads(3), lambda: Bundle(bundle, threads=1).session("eos_classifier"),
                lambda: Bundle(bundle, session_options=ort.SessionOptions()).session("eos_classifier")):
    try:
        refused()
    except VibeVoiceError as e:
        assert "shares one onnxruntime" in str(e), e
    else:
        raise AssertionError("not refused")
""")
    assert proc.returncode == 0, proc.stderr
    assert "torch-free ok" in proc.stdout


def test_api_streams_chunks_that_match_the_reference(tiny_bundle, realtime_reference):
    tts = RealtimeTTS(tiny_bundle)
    assert tts.voices == ["synthetic"] and tts.sample_rate == 24000
    speech = tts.stream(TEXT, voice="synthetic", seed=11, max_frames=9)
    chunks = list(speech)
    assert [c.frame for c in chunks] == list(range(9)) and all(c.sample_rate == 24000 for c in chunks)
    assert all(c.samples.shape == (3200,) and c.samples.dtype == np.float32 for c in chunks)
    reference = generate(realtime_reference, tts.bundle.voice("synthetic"), encode_tts_text(tts.bundle.tokenizer, TEXT),
                         NoiseSource.from_seed(11), max_frames=9)
    ours = np.concatenate([c.samples for c in chunks])
    # direction and size: a correlation alone passed the audio made 2% louder; fp32 on both sides agree to rounding
    assert relative_error(ours, reference.audio) < 1e-3 and gain(ours, reference.audio) == pytest.approx(1, abs=1e-4)
    audio, rate = tts.create(TEXT, voice="synthetic", seed=11, max_frames=9)
    assert rate == 24000 and np.array_equal(audio, ours)


def test_speak_writes_a_24khz_wav_and_reports(tiny_bundle, tmp_path, capsys):
    out = tmp_path / "speech.wav"
    assert main(["speak", str(tiny_bundle), TEXT, "--seed", "3", "--max-frames", "7", "-o", str(out)]) == 0
    info = sf.info(str(out))
    assert (info.samplerate, info.channels, info.frames, info.subtype) == (24000, 1, 7 * 3200, "PCM_16")
    err = capsys.readouterr().err
    assert "seed 3" in err and "frames 7 (max_frames)" in err and "real-time factor" in err and "first audio after" in err
    assert main(["speak", str(tiny_bundle), TEXT, "--seed", "3", "--max-frames", "2", "--wav-format", "float32", "-o", str(out)]) == 0
    assert sf.info(str(out)).subtype == "FLOAT"


def test_noise_file_reproduces_a_seeded_run_and_latents_are_saved(tiny_bundle, tmp_path):
    rows = np.stack([NoiseSource.from_seed(5)(i) for i in range(6)])
    np.save(tmp_path / "noise.npy", rows)
    args = [str(tiny_bundle), TEXT, "--max-frames", "6"]
    assert main(["speak", *args, "--seed", "5", "-o", str(tmp_path / "a.wav"), "--save-latents", str(tmp_path / "a.npy")]) == 0
    assert main(["speak", *args, "--noise", str(tmp_path / "noise.npy"), "-o", str(tmp_path / "b.wav"), "--save-latents", str(tmp_path / "b.npy")]) == 0
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.shape == (6, 64) and a.dtype == np.float32 and np.array_equal(a, b)
    assert np.array_equal(sf.read(str(tmp_path / "a.wav"))[0], sf.read(str(tmp_path / "b.wav"))[0])


def test_decode_of_saved_latents_equals_the_streamed_audio(tiny_bundle, tmp_path):
    args = [str(tiny_bundle), TEXT, "--seed", "4", "--max-frames", "5", "--wav-format", "float32"]
    assert main(["speak", *args, "-o", str(tmp_path / "s.wav"), "--save-latents", str(tmp_path / "z.npy")]) == 0
    assert main(["decode", str(tiny_bundle), str(tmp_path / "z.npy"), "-o", str(tmp_path / "d.wav")]) == 0
    streamed, decoded = sf.read(str(tmp_path / "s.wav"))[0], sf.read(str(tmp_path / "d.wav"))[0]
    np.testing.assert_allclose(decoded, streamed, atol=1e-5)


def run_cli(*args, stdin=None):
    proc = subprocess.run([sys.executable, "-m", "vibevoice_onnx.cli", *map(str, args)], input=stdin, capture_output=True)
    return proc.returncode, proc.stdout, proc.stderr.decode()


def test_raw_pcm_goes_to_stdout_and_text_comes_from_stdin(tiny_bundle):
    code, out, err = run_cli("speak", tiny_bundle, "--seed", "2", "--max-frames", "4", "--raw", stdin=TEXT.encode())
    assert code == 0, err
    assert len(out) == 4 * 3200 * 2  # pcm16
    samples = np.frombuffer(out, dtype="<i2")
    assert samples.std() > 0


def test_progress_is_one_line_per_window_in_a_log_and_one_rewritten_line_on_a_terminal(tiny_bundle, tmp_path):
    """Off a terminal (a file, a pipe, a CI log) each progress step is printed once: a decoder call of three frames
    gives three chunks, and each once printed the same line. On a terminal the line is rewritten in place."""
    code, _, err = run_cli("speak", tiny_bundle, TEXT, "--seed", "2", "--max-frames", "20", "-o", tmp_path / "a.wav")
    assert code == 0, err
    frames = [line.split()[1] for line in err.splitlines() if line.startswith("frame ")]
    assert frames == ["6", "12", "18", "20"] and "\r" not in err, err

    import pty

    leader, follower = pty.openpty()
    with os.fdopen(leader, "rb", buffering=0) as terminal:
        proc = subprocess.Popen([sys.executable, "-m", "vibevoice_onnx.cli", "speak", str(tiny_bundle), TEXT, "--seed",
                                 "2", "--max-frames", "20", "-o", str(tmp_path / "b.wav")], stderr=follower)
        os.close(follower)
        seen = b""
        while True:
            try:
                piece = terminal.read(4096)
            except OSError:  # the child closed the terminal: everything it wrote is read
                break
            if not piece:
                break
            seen += piece
        assert proc.wait(timeout=120) == 0, seen
    lines = seen.decode().replace("\r\n", "\n").split("\n")  # the terminal sends each newline as \r\n
    progress = [line.split("\r")[1:] for line in lines if line.startswith("\rframe ")]
    assert len(progress) == 1 and len(progress[0]) >= 8, seen  # one line, rewritten at every chunk
    assert progress[0][-1].startswith("frame    20 "), seen


def test_text_from_a_file(tiny_bundle, tmp_path):
    (tmp_path / "text.txt").write_text(TEXT + "\n\n", encoding="utf-8")
    assert main(["speak", str(tiny_bundle), "-f", str(tmp_path / "text.txt"), "--seed", "2", "--max-frames", "2", "-o", str(tmp_path / "f.wav")]) == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["   \n "], "the text has nothing to speak"),
        ([TEXT, "--voice", "nobody"], "has no voice 'nobody' (available: synthetic)"),
        ([TEXT, "--seed", "1", "--noise", "n.npy"], "either --seed or --noise"),
    ],
)
def test_speak_input_errors(tiny_bundle, tmp_path, args, message):
    code, out, err = run_cli("speak", tiny_bundle, *args, "-o", tmp_path / "x.wav")
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "x.wav").exists()


def test_noise_files_of_the_wrong_shape_or_length(tiny_bundle, tmp_path):
    np.save(tmp_path / "wide.npy", np.zeros((5, 32), np.float32))
    code, _, err = run_cli("speak", tiny_bundle, TEXT, "--noise", tmp_path / "wide.npy", "-o", tmp_path / "x.wav")
    assert code == 2 and "noise must have shape [frames, 64]" in err
    np.save(tmp_path / "short.npy", np.ones((3, 64), np.float32))
    code, _, err = run_cli("speak", tiny_bundle, TEXT, "--noise", tmp_path / "short.npy", "--max-frames", "5", "-o", tmp_path / "x.wav")
    assert code == 2 and "has 3 rows, fewer than --max-frames 5" in err
    code, _, err = run_cli("speak", tiny_bundle, TEXT, "--noise", tmp_path / "short.npy", "-o", tmp_path / "y.wav")
    assert code == 2 and "the noise file has 3 rows, but generation reached frame 4" in err and "Traceback" not in err


def test_a_failed_run_leaves_the_previous_output_alone(tiny_bundle, tmp_path):
    out = tmp_path / "speech.wav"
    out.write_bytes(b"previous take")
    np.save(tmp_path / "short.npy", np.ones((2, 64), np.float32))
    code, _, err = run_cli("speak", tiny_bundle, TEXT, "--noise", tmp_path / "short.npy", "-o", out)
    assert code == 2 and "generation reached frame 3" in err
    assert out.read_bytes() == b"previous take" and sorted(p.name for p in tmp_path.iterdir()) == ["short.npy", "speech.wav"]
    code, _, err = run_cli("speak", tiny_bundle, TEXT, "-o", tmp_path / "missing" / "x.wav")
    assert code == 2 and "its directory does not exist" in err


def test_a_bundle_of_another_kind_is_refused(tiny_bundle, tmp_path):
    other = copy_bundle(tiny_bundle, tmp_path / "other")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["model_kind"] = "asr"
    (other / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run_cli("speak", other, TEXT, "-o", tmp_path / "x.wav")
    assert code == 2 and "is a bundle of kind 'asr', which does not speak" in err
    code, _, err = run_cli("speak", tmp_path, TEXT)
    assert code == 2 and "not a complete vibevoice-onnx bundle" in err


def test_the_kv_cache_is_written_in_place_grows_by_doubling_and_keeps_row_lengths(tiny_bundle):
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.runtime.lm import NEGATIVE, POSITIVE, KvCache, OnnxLm

    lm = OnnxLm(Bundle(tiny_bundle), "upper_lm")
    rng = np.random.default_rng(0)
    cache = KvCache(lm, rows=2, capacity=8)
    buffer, address = cache.buffers[0], cache.buffers[0].ctypes.data
    lm.run(rng.standard_normal((1, 5, 64), dtype=np.float32), cache, POSITIVE)
    lm.run(rng.standard_normal((2, 1, 64), dtype=np.float32), cache)
    assert list(cache.lengths) == [6, 1] and cache.buffers[0] is buffer and buffer.ctypes.data == address
    written = np.abs(buffer).sum(axis=(1, 3)) > 0  # [rows, capacity]: the positions the graph wrote
    assert written[0].tolist() == [True] * 6 + [False] * 2 and written[1].tolist() == [True] + [False] * 7
    before = cache.filled(0)[0].copy()
    for _ in range(3):
        lm.run(rng.standard_normal((2, 1, 64), dtype=np.float32), cache)
    assert cache.capacity == 16 and list(cache.lengths) == [9, 4]  # one copy into twice the room, nothing lost
    np.testing.assert_array_equal(cache.filled(0)[0][:, :, :6], before)
    cache.forget(1)
    lm.run(rng.standard_normal((1, 1, 64), dtype=np.float32), cache, NEGATIVE)
    assert list(cache.lengths) == [9, 4]
    with pytest.raises(Exception, match="take one token each"):
        lm.run(rng.standard_normal((2, 2, 64), dtype=np.float32), cache)


def test_the_cache_gate_catches_a_cache_that_is_not_written_in_place(tiny_bundle, realtime_reference, monkeypatch):
    """The in-place path bound to a copy of the cache: each step's keys and values are lost."""
    import torch

    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.runtime.lm import OnnxLm
    from vibevoice_onnx.verify.judge import Probe, cache_gate

    lm = OnnxLm(Bundle(tiny_bundle), "upper_lm")
    probe = Probe(lambda ids: realtime_reference.embed_text(torch.from_numpy(ids)).detach().numpy(), 512)
    assert cache_gate("upper_lm", lm, probe).passed
    in_place = OnnxLm._in_place

    def on_a_copy(self, feeds, cache, rows):
        saved = cache.buffers
        cache.buffers = [b.copy() for b in saved]
        try:
            return in_place(self, feeds, cache, rows)
        finally:
            cache.buffers = saved
    monkeypatch.setattr(OnnxLm, "_in_place", on_a_copy)
    assert not cache_gate("upper_lm", lm, probe).passed


def _resident_fraction(array: np.ndarray) -> float:
    """The share of an array's memory pages the process holds now (Linux mincore): whole-process RSS would
    move with whatever the garbage collector frees beside it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    start = array.ctypes.data // page * page
    pages = -(-(array.ctypes.data + array.nbytes - start) // page)
    vector = (ctypes.c_ubyte * pages)()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), vector) == 0, ctypes.get_errno()
    return sum(flag & 1 for flag in vector) / pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads page residency with Linux mincore")
def test_a_planned_cache_is_resident_at_once_and_an_unplanned_one_only_where_written():
    from types import SimpleNamespace

    from vibevoice_onnx.runtime.device import Placement
    from vibevoice_onnx.runtime.lm import KvCache

    # KvCache reads only the graph's K/V shapes and where its buffers live. The unplanned buffers are 491 MB of address space each, mapped
    # apart from the heap: the few 2 MB pages transparent huge pages may make resident around the allocation's
    # header stay far below the bound (at 49 MB they once came to 8 % and failed CI)
    lm = SimpleNamespace(kv_shapes=[(8, 128)] * 2, placement=Placement())
    lazy = KvCache.planned(lm, 2, 30_000, None, 1 << 20)
    assert lazy.capacity == 60_000 and all(_resident_fraction(buffer) < 0.05 for buffer in lazy.buffers)
    planned = KvCache.planned(lm, 2, 3000, 10_000, 8192)
    assert planned.capacity == 8192  # the model's positions bound the plan
    # taken before the first step, so a run cannot grow into an OOM
    assert all(_resident_fraction(buffer) == 1.0 for buffer in planned.buffers)


@pytest.mark.parametrize("bundle_fixture", ["tiny_bundle", "tiny_15b_bundle"])
def test_a_run_of_known_length_sizes_its_caches_once_and_gives_the_same_latents(bundle_fixture, request, monkeypatch):
    from vibevoice_onnx.generation import realtime as realtime_loop
    from vibevoice_onnx.generation import tts15b as tts15b_loop
    from vibevoice_onnx.runtime.bench import bench_kind, result_of
    from vibevoice_onnx.runtime.bundle import Bundle
    from vibevoice_onnx.runtime.lm import KvCache

    bundle = Bundle(request.getfixturevalue(bundle_fixture))
    backend_class, bench_frames, _ = bench_kind(bundle.kind)
    grown, original_reserve = [], KvCache.reserve

    def reserve(cache, length):
        if length > cache.capacity:
            grown.append((cache.capacity, length))
        original_reserve(cache, length)

    def run() -> np.ndarray:
        result = result_of(bundle.kind)
        for _ in bench_frames(backend_class(bundle), bundle, bundle.voices()[0], 300, result):
            pass
        assert result.frames == 300
        return np.stack(result.latents)

    monkeypatch.setattr(KvCache, "reserve", reserve)
    planned = run()
    assert grown == []  # every cache was made for the whole run: no copy into a larger one mid-stream
    monkeypatch.setattr(realtime_loop, "planned_positions", lambda *args: (None, None))
    monkeypatch.setattr(tts15b_loop, "planned_steps", lambda *args: None)
    unplanned = run()
    assert grown  # without a plan the same run passes its first capacity and doubles
    np.testing.assert_array_equal(planned, unplanned)


def test_bench_runs_without_the_onnx_package(tiny_bundle, tmp_path):
    """The torch-free install has onnxruntime but not onnx: bench's bandwidth probe builds its graph itself."""
    bundle = copy_bundle(tiny_bundle, tmp_path / "bundle")
    proc = run_torch_free(f"""
class BlockOnnx:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "onnx":
            raise ImportError(f"blocked import of {{name}}")
sys.meta_path.insert(0, BlockOnnx())
from vibevoice_onnx.cli import main
assert main(["bench", {str(bundle)!r}, "--frames", "2", "--profile", "--json"]) == 0
assert "onnx" not in sys.modules
""")
    assert proc.returncode == 0, proc.stderr
    assert "torch-free ok" in proc.stdout


def test_bench_against_runs_the_other_bundle_in_the_same_kind_of_thread_pool(tiny_bundle):
    """`bench --against` times the other bundle in a child process: where the command line shares one pool
    (share_threads), the child must too, or the comparison pits a shared pool against a pool per session
    (full-size realtime int8, two bundles 3% apart in the same pool: RTF 0.36 in the shared pool, 0.44 in pools per
    session)."""
    proc = run_torch_free(f"""
from vibevoice_onnx.runtime.bench import bench
from vibevoice_onnx.runtime.bundle import share_threads
share_threads(2)
report = bench({str(tiny_bundle)!r}, frames=2, against={str(tiny_bundle)!r})
assert report["runtime"]["shared_pool_threads"] == 2, report["runtime"]["shared_pool_threads"]
assert report["against"]["shared_pool_threads"] == 2, report["against"]["shared_pool_threads"]
""")
    assert proc.returncode == 0, proc.stderr
    assert "torch-free ok" in proc.stdout


def test_the_hand_serialised_bandwidth_graph_is_the_one_onnx_would_build():
    """bench's probe writes its ONNX bytes without the onnx package; onnx (test extra) must read them as a valid
    model holding the same graph its own helpers build, and onnxruntime must sum the rows."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from vibevoice_onnx.runtime.bench import row_sums_model

    ours = onnx.load_from_string(row_sums_model(4, 3))
    onnx.checker.check_model(ours, full_check=True)
    weight = numpy_helper.from_array(np.ones((4, 3), np.float32), "weight")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    graph = helper.make_graph([helper.make_node("ReduceSum", ["weight", "axes"], ["sums"], keepdims=0)], "bandwidth",
                              [], [helper.make_tensor_value_info("sums", TensorProto.FLOAT, [4])], [weight, axes])
    assert ours.graph == graph and ours.opset_import[0].version == 18
    session = ort.InferenceSession(row_sums_model(4, 3), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {})[0], np.full(4, 3.0, np.float32))

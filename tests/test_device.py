"""The runtime's bound path (runtime.device): every graph call through onnxruntime's I/O binding, caches and
states written in place where the graphs run, gated against plain session.run calls on host arrays.

No GPU here: the buffers CUDA uses (onnxruntime values, bound by address) are made in CPU memory instead, so the
code a GPU runs, but for the device's name, runs in CI."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnxruntime import OrtValue

from vibevoice_onnx.runtime.bundle import Bundle
from vibevoice_onnx.runtime.device import Placement, Region, host
from vibevoice_onnx.text import encode_tts_text
from vibevoice_onnx.verify.common import bound_gate
from vibevoice_onnx.verify.realtime import bound_loop

TEXT = "Bound or not, the same numbers."


def realtime_loop(bundle_dir):
    bundle = Bundle(bundle_dir)
    return bound_loop(bundle.voice("synthetic"), encode_tts_text(bundle.tokenizer, TEXT))


def test_placement_follows_the_first_provider():
    assert Placement.of(["CPUExecutionProvider"]) == Placement("cpu", 0, True, device_buffers=False)
    assert Placement.of([("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]) == Placement(
        "cuda", 1, True, device_buffers=True)
    assert not Placement.of(["CUDAExecutionProvider"], bound=False).device_buffers  # unbound: host arrays


def test_device_buffers_are_written_and_addressed_by_row():
    placement = Placement(device_buffers=True)
    buffer = placement.zeros((3, 2, 4))
    assert isinstance(buffer, OrtValue)
    placement.write(buffer, (1, slice(None), slice(0, 2)), np.ones((2, 2), np.float32))
    expected = np.zeros((3, 2, 4), np.float32)
    expected[1, :, :2] = 1
    assert np.array_equal(host(buffer), expected)
    region = Region.rows(buffer, slice(1, 3))
    assert region.shape == (2, 2, 4) and region.address() == buffer.data_ptr() + 1 * 2 * 4 * 4
    assert np.array_equal(host(region), expected[1:3])


def test_the_bound_loop_equals_the_unbound_loop_bitwise(tiny_bundle):
    gate = bound_gate(Bundle(tiny_bundle), realtime_loop(tiny_bundle), "test")
    assert gate.passed and gate.max_abs == 0.0, gate


def test_every_call_of_the_loop_is_bound_and_state_stays_where_the_graphs_run(tiny_bundle, monkeypatch):
    """Bound, no graph is called through session.run and the diffusion head's modulation and the decoder's conv
    states come back as device values; unbound, no call is bound and everything is a host array."""
    calls, values = {"run": 0, "run_with_iobinding": 0}, {}
    from vibevoice_onnx.runtime import lm

    original_modulation, original_conv = lm.OnnxDiffusionHead.modulation, lm.StreamingConv.run

    def modulation(self, *args):
        values["modulation"] = result = original_modulation(self, *args)
        return result

    def conv(self, chunk, state):
        out, values["state"] = original_conv(self, chunk, state)
        return out, values["state"]

    monkeypatch.setattr(lm.OnnxDiffusionHead, "modulation", modulation)
    monkeypatch.setattr(lm.StreamingConv, "run", conv)
    for bound in (True, False):
        bundle = Bundle(tiny_bundle, bound=bound)
        for name in calls:
            calls[name] = 0
        for graph in bundle.info.graphs:
            session = bundle.session(graph).session
            for name in calls:
                monkeypatch.setattr(session, name, _counting(getattr(session, name), calls, name), raising=False)
        realtime_loop(tiny_bundle)(bundle)
        if bound:
            assert calls["run"] == 0 and calls["run_with_iobinding"] > 0
            assert isinstance(values["modulation"], OrtValue) and all(isinstance(s, OrtValue) for s in values["state"])
        else:
            assert calls["run_with_iobinding"] == 0 and calls["run"] > 0
            assert isinstance(values["modulation"], np.ndarray) and all(isinstance(s, np.ndarray) for s in values["state"])


def _counting(method, calls, name):
    def counted(*args, **kwargs):
        calls[name] += 1
        return method(*args, **kwargs)

    return counted


def test_device_memory_buffers_give_the_same_loop_bitwise(tiny_bundle):
    """KV caches as onnxruntime values bound by address, loaded and grown through the host as on CUDA (the
    voice prompt fills a row; caches made one position longer than their prompt double at once): the same
    numbers as the unbound loop."""
    from vibevoice_onnx.runtime import lm

    loop = realtime_loop(tiny_bundle)
    unbound = loop(Bundle(tiny_bundle, bound=False))
    bundle = Bundle(tiny_bundle)
    bundle.placement = replace(bundle.placement, device_buffers=True)
    with pytest.MonkeyPatch.context() as patch:
        tight = lambda cls, model, rows, length, planned, limit, in_place=True: cls(model, rows, length + 1)  # noqa: E731
        patch.setattr(lm.KvCache, "planned", classmethod(tight))
        grown = []
        reserve = lm.KvCache.reserve
        patch.setattr(lm.KvCache, "reserve", lambda self, n: (grown.append(n > self.capacity), reserve(self, n))[1])
        on_device = loop(bundle)
    assert any(grown)
    for ours, theirs in zip(on_device, unbound):
        assert np.array_equal(ours, theirs)


def test_a_defect_in_the_bound_path_fails_the_gate(tiny_bundle, monkeypatch):
    """Each sampler step reads its rows of the modulation by address; a step that read the rows of the step
    before (an offset one block short) must fail the gate, which is what it is there to catch."""
    address = Region.address

    def one_block_short(self):
        if isinstance(self.buffer, np.ndarray) or not self.start:
            return address(self)
        return address(self) - (self.stop - self.start) * int(np.prod(self.shape[1:])) * 4

    monkeypatch.setattr(Region, "address", one_block_short)
    gate = bound_gate(Bundle(tiny_bundle), realtime_loop(tiny_bundle), "test")
    assert not gate.passed and gate.max_abs > 0


def test_bench_batches_64_streams_and_reports_each_ones_real_time_factor_and_late_frames(tiny_bundle, tmp_path):
    """The largest count the GPU benchmark asks for: 64 streams' rows in one shared cache, their LM steps shared
    (how many join each call depends on when each stream's prefill ends, so only sharing is asserted)."""
    from conftest import copy_bundle

    from vibevoice_onnx.runtime.bench import bench, format_report

    report = bench(copy_bundle(tiny_bundle, tmp_path / "bundle"), frames=3, streams=64)
    streams = report["together"]["per_stream"]
    assert len(streams) == 64 and all(s["real_time_factor"] > 0 and s["late_frames"] >= 0 for s in streams)
    lm_steps = report["together"]["batches"]["lm_step"]
    assert lm_steps["calls"] >= 64 and lm_steps["largest"] > 1 and lm_steps["batches"] < lm_steps["calls"]
    assert "64 streams" in format_report(report)

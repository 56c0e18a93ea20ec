"""Where a bundle's tensors live and how its graphs are called.

Every graph call of the runtime goes through `GraphSession.run`. Bound (the default), it is onnxruntime's I/O
binding: inputs and outputs can be values that live on the bundle's device (`keep`), and blocks of buffers the
caller owns (`Region`: a KV cache's rows, one sampler step's rows of the diffusion head's modulation) are
bound by address, so a graph reads and writes state where it lies; past and present of a KV cache are one
buffer. Only what the host must see (hidden states the host decides on, logits, audio) is copied back. On the
CPU the device is the host: the same binding with CPU buffers, which is what CI runs. Unbound
(`Bundle(..., bound=False)`), every call is a plain `session.run` on host arrays, and outputs meant for a
buffer are copied into it: the path verify gates the bound one against (bitwise on the CPU).

On CUDA a cache row written from the host (a voice prompt loaded into a row, a cache that grows) costs a
round trip of that buffer through host memory: it happens when a stream starts or its cache doubles, never
per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BundleError, VibeVoiceError

F32 = np.float32


@dataclass(frozen=True)
class Placement:
    """A bundle's device ("cpu" or "cuda", and its index), whether its calls are bound, and whether state
    buffers are onnxruntime values in the device's memory (bound on a GPU) or numpy arrays (on the host)."""

    device: str = "cpu"
    device_id: int = 0
    bound: bool = True
    device_buffers: bool = False

    @classmethod
    def of(cls, providers: list, bound: bool = True) -> "Placement":
        first = providers[0] if providers else "CPUExecutionProvider"
        name, options = (first if isinstance(first, tuple) else (first, {}))
        if name == "CUDAExecutionProvider":
            return cls("cuda", int(options.get("device_id", 0)), bound, device_buffers=bound)
        return cls("cpu", 0, bound)

    def zeros(self, shape: tuple, dtype=F32):
        """A zeroed buffer for state a graph reads and writes in place: numpy on the host, else device memory."""
        return self.upload(np.zeros(shape, dtype))

    def upload(self, array: np.ndarray):
        """A host array as a value of the device (the array itself where the device is the host)."""
        if not self.device_buffers:
            return array
        from onnxruntime import OrtValue

        return OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, self.device_id)

    def write(self, buffer, index, value: np.ndarray) -> None:
        """buffer[index] = value, for a buffer of `zeros`."""
        if isinstance(buffer, np.ndarray):
            buffer[index] = value
            return
        host = buffer.numpy()
        host[index] = value
        buffer.update_inplace(host)


def host(value) -> np.ndarray:
    """A graph's output (a numpy array or a device value) or a Region, as a host array."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Region):
        return host(value.buffer)[value.start:value.stop]
    return value.numpy()


def shape_of(buffer) -> tuple:
    return buffer.shape if isinstance(buffer, np.ndarray) else tuple(buffer.shape())


@dataclass(frozen=True)
class Region:
    """Rows [start, stop) of a buffer's outermost axis (a contiguous block): bound by address, no copy."""

    buffer: object  # np.ndarray or onnxruntime.OrtValue
    start: int
    stop: int

    @classmethod
    def rows(cls, buffer, rows: slice) -> "Region":
        start, stop, _ = rows.indices(shape_of(buffer)[0])
        return cls(buffer, start, stop)

    @property
    def shape(self) -> tuple:
        return (self.stop - self.start,) + tuple(shape_of(self.buffer)[1:])

    @property
    def view(self) -> np.ndarray:
        """The block as a numpy view (host buffers only)."""
        return self.buffer[self.start:self.stop]

    def address(self) -> int:
        if isinstance(self.buffer, np.ndarray):
            return self.view.ctypes.data
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(F32).itemsize
        return self.buffer.data_ptr() + self.start * row_bytes

    def location(self, placement: Placement) -> tuple[str, int]:
        return ("cpu", 0) if isinstance(self.buffer, np.ndarray) else (placement.device, placement.device_id)


class GraphSession:
    """An onnxruntime session of a bundle, called bound or unbound (see the module), its calls timed into
    `timings[name]` once the bundle times them. `static`: a graph of static shapes whose every input and output
    lies in a buffer of its own allocated once on the device (StaticBinding), as CUDA graph replay needs."""

    def __init__(self, name: str, session, placement: Placement, timings: dict | None = None,
                 static: "StaticBinding | None" = None):
        self.name, self.session, self.placement, self.timings, self.static = name, session, placement, timings, static
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, output_names: list[str] | None, feeds: dict, keep=frozenset(), into: dict | None = None) -> list:
        """The outputs `output_names` (None: all but those in `into`), in that order. Feeds are host arrays,
        device values or Regions; outputs named in `keep` come back as device values (host arrays unbound),
        the others as host arrays; `into` names outputs written into Regions (past and present of a cache)."""
        into = into or {}
        names = [n for n in self.output_names if n not in into] if output_names is None else list(output_names)
        start = time.perf_counter()
        try:
            if self.static is not None:
                return self.static.run(self.session, names, feeds)
            if self.placement.bound:
                return self._bound(names, feeds, keep, into)
            return self._unbound(names, feeds, into)
        finally:
            if self.timings is not None:
                self.timings.setdefault(self.name, []).append(time.perf_counter() - start)

    def _bound(self, names: list[str], feeds: dict, keep, into: dict) -> list:
        placement, binding, held = self.placement, self.session.io_binding(), []
        for name, value in feeds.items():
            if isinstance(value, Region):
                binding.bind_input(name, *value.location(placement), F32, value.shape, value.address())
            elif isinstance(value, np.ndarray):
                held.append(np.ascontiguousarray(value))  # bound by address: alive until the run is over
                binding.bind_cpu_input(name, held[-1])
            else:
                binding.bind_ortvalue_input(name, value)
        for name, region in into.items():
            binding.bind_output(name, *region.location(placement), F32, region.shape, region.address())
        for name in names:  # after `into`: get_outputs() lists outputs in binding order
            binding.bind_output(name, *((placement.device, placement.device_id) if name in keep else ("cpu", 0)))
        self.session.run_with_iobinding(binding)
        values = binding.get_outputs()[len(into):]
        return [value if name in keep else value.numpy() for name, value in zip(names, values)]

    def _unbound(self, names: list[str], feeds: dict, into: dict) -> list:
        outputs = self.session.run(names + list(into), {name: host(value) for name, value in feeds.items()})
        for region, value in zip(into.values(), outputs[len(names):]):
            np.copyto(region.view, value)
        return outputs[:len(names)]

    def __getattr__(self, attribute):
        return getattr(self.session, attribute)


class StaticBinding:
    """One graph's inputs and outputs in buffers allocated once on the device and bound once: each call copies
    its host inputs into the input buffers and replays. onnxruntime's CUDA graphs (`enable_cuda_graph`) capture a
    graph's kernels on its first run and then replay them on these same addresses, so every buffer must keep its
    address and shape: a graph whose shapes are not all static is refused at opening, and a call of other
    shapes at the call."""

    def __init__(self, name: str, graph: dict, placement: Placement):
        dynamic = [f"{v['name']} {v['shape']}" for v in graph["inputs"] + graph["outputs"]
                   if not all(isinstance(d, int) and d > 0 for d in v["shape"])]
        if dynamic:
            raise BundleError(f"graph {name} has dynamic dimensions ({', '.join(dynamic)}); CUDA graphs replay static "
                              "shapes only: build the bundle with --profile fixed")
        self.name, self.placement = name, placement
        self.inputs = {v["name"]: (tuple(v["shape"]), v["dtype"]) for v in graph["inputs"]}
        self.outputs = {v["name"]: (tuple(v["shape"]), v["dtype"]) for v in graph["outputs"]}
        self.binding, self.values = None, {}

    def run(self, session, names: list[str], feeds: dict) -> list:
        if set(feeds) != set(self.inputs):
            raise ValueError(f"{self.name}: a static binding takes exactly the inputs {sorted(self.inputs)}")
        for name, value in feeds.items():
            if tuple(np.shape(value)) != self.inputs[name][0]:
                raise VibeVoiceError(f"{self.name}: input {name} of shape {list(np.shape(value))} is not the "
                                     f"{list(self.inputs[name][0])} its CUDA graph was captured with")
        if self.binding is None:
            self._bind(session)
        for name, value in feeds.items():
            self.values[name].update_inplace(np.ascontiguousarray(value, dtype=self.inputs[name][1]))
        session.run_with_iobinding(self.binding)
        # copies: the buffers are overwritten by the next call (on the CPU, numpy() is a view of them)
        return [np.array(self.values[name].numpy()) for name in names]

    def _bind(self, session) -> None:
        from onnxruntime import OrtValue

        where = (self.placement.device, self.placement.device_id)
        self.binding = session.io_binding()
        for name, (shape, dtype) in self.inputs.items():  # buffers of their own, filled by each call
            self.values[name] = OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(dtype), *where)
            self.binding.bind_ortvalue_input(name, self.values[name])
        for name, (shape, dtype) in self.outputs.items():
            self.values[name] = OrtValue.ortvalue_from_shape_and_type(shape, np.dtype(dtype), *where)
            self.binding.bind_ortvalue_output(name, self.values[name])


# Memory a model's weights take once loaded, against their bytes: activations, onnxruntime's and Python's own.
MEMORY_ROOM = 1.2


def available_memory() -> int | None:
    """Bytes the kernel says a new allocation can get (MemAvailable: free pages plus reclaimable cache)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None

"""An ONNX graph written node by node with its weights streamed to disk: the torch-free builder's one writer.

Each weight is written into the graph's external data file as soon as it is given (page-aligned, so onnxruntime
can map it) and only a reference stays in the graph, so writing a graph holds one tensor at a time, not the
model. A graph whose weights are small keeps them inside the .onnx file instead, as the traced export does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
MS_DOMAIN = "com.microsoft"
EXTERNAL_DATA_BYTES = 64 * 2**20  # graphs with more weights than this keep them in a .onnx.data file
ALIGNMENT = 4096  # tensor offsets in the data file, so onnxruntime can map them
INT64_MAX = np.iinfo(np.int64).max
_ELEMENT_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
                  np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int8): TensorProto.INT8,
                  np.dtype(np.uint8): TensorProto.UINT8}


class AlignedFile:
    """A graph's .onnx.data file, written tensor by tensor at page-aligned offsets (what onnxruntime maps); the
    writer's and the traced export's streamed weights (export/streaming.py) both write through it."""

    def __init__(self, path: Path):
        self.path, self.file, self.end, self.payload = Path(path), open(path, "wb"), 0, 0

    def add(self, array: np.ndarray) -> tuple[int, int]:
        """Write `array`'s bytes at the next aligned offset: (offset, length)."""
        data = np.ascontiguousarray(array).tobytes()
        offset = -self.end % ALIGNMENT + self.end
        self.file.seek(offset)
        self.file.write(data)
        self.end, self.payload = offset + len(data), self.payload + len(data)
        return offset, len(data)

    def close(self) -> None:
        self.file.close()


class GraphWriter:
    """One graph: `input`, `op` and `output` in run order, `weight` for a checkpoint's tensors, `product` for a
    linear layer's weight (quantized as it is written where the graph has a `scheme`: export.precision's Scheme
    or Mixed), `const` for the graph's own small constants (deduplicated), then `save`."""

    def __init__(self, name: str, directory: Path, external: bool, scheme=None):
        self.name, self.path = name, Path(directory) / f"{name}.onnx"
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.domains: set[str] = set()
        self._constants: dict[tuple, str] = {}
        self._counts: dict[str, int] = {}
        self.weight_bytes = 0  # as written
        self.fp32_bytes = 0  # what the weights would take in fp32
        self.scheme, self.quantized, self.layers = scheme, 0, None  # layers: an LM's, for a Mixed scheme's rules
        self.data_path = self.path.with_name(self.path.name + ".data") if external else None
        self._data = AlignedFile(self.data_path) if external else None

    def _unique(self, stem: str) -> str:
        count = self._counts.get(stem, 0)
        self._counts[stem] = count + 1
        return stem if count == 0 else f"{stem}_{count}"

    def input(self, name: str, dtype, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, _ELEMENT_TYPES[np.dtype(dtype)], shape))
        return name

    def output(self, value: str, name: str, dtype, shape: list) -> None:
        """Declare `value` a graph output called `name` (the node that made it is renamed to write it)."""
        if value != name:
            for node in self.nodes:
                node.output[:] = [name if o == value else o for o in node.output]
                node.input[:] = [name if i == value else i for i in node.input]
        self.outputs.append(helper.make_tensor_value_info(name, _ELEMENT_TYPES[np.dtype(dtype)], shape))

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "", **attributes):
        """One node; returns its output name (or names, for `outputs` > 1)."""
        stem = op_type.lower()
        names = [self._unique(stem) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self._unique(f"node_{stem}"), domain=domain,
                                           **attributes))
        if domain:
            self.domains.add(domain)
        return names[0] if outputs == 1 else names

    def const(self, value, dtype=np.float32) -> str:
        """A constant of the graph itself (a shape, an epsilon), stored once however often it is used."""
        array = np.asarray(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            name = self._unique("const")
            self.initializers.append(numpy_helper.from_array(array, name))
            self._constants[key] = name
        return self._constants[key]

    def weight(self, name: str, array: np.ndarray, fp32_bytes: int | None = None) -> str:
        """A weight (float32, or the integers of a quantized one), written to the data file now where the graph
        keeps its weights outside."""
        array = np.asarray(array)
        array = np.ascontiguousarray(array, dtype=array.dtype if array.dtype in (np.int8, np.uint8) else np.float32)
        name = self._unique(name)
        self.weight_bytes += array.nbytes
        self.fp32_bytes += array.nbytes if fp32_bytes is None else fp32_bytes
        if self._data is None:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        offset, length = self._data.add(array)
        tensor = TensorProto(name=name, data_type=_ELEMENT_TYPES[array.dtype], dims=array.shape,
                             data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.data_path.name), ("offset", str(offset)), ("length", str(length))):
            tensor.external_data.add(key=key, value=value)
        self.initializers.append(tensor)
        return name

    def product(self, x: str, weight: np.ndarray, name: str, where: tuple[int, str] | None = None) -> str:
        """x times a linear layer's weight, transposed [in, out]: a MatMul in fp32, or what the graph's scheme makes
        of it (`where`: the LM layer and projection a Mixed scheme's rules pick by)."""
        from ..export.precision import Mixed, dynamic_weight, quantize_weight

        scheme = self.scheme
        if isinstance(scheme, Mixed):
            scheme = scheme.pick(where[0], self.layers, where[1])
        if scheme is None:
            return self.op("MatMul", x, self.weight(name, weight))
        self.quantized += 1
        share = weight.nbytes / 4  # the fp32 bytes, spread over the tensors it becomes
        if scheme.method == "dynamic":
            nodes, tensors = dynamic_weight(weight, name)
            renamed = {t: self.weight(t, array, fp32_bytes=share) for t, array in tensors}
            return self._splice(nodes, {"x": x, **renamed}, "y")
        attributes, tensors = quantize_weight(np.ascontiguousarray(weight, np.float32), name, scheme)
        inputs = [self.weight(t, array, fp32_bytes=share) for t, array in tensors]
        return self.op("MatMulNBits", x, *inputs, domain=MS_DOMAIN, **{k: int(v) for k, v in attributes.items()})

    def _splice(self, nodes: list[onnx.NodeProto], names: dict[str, str], output: str) -> str:
        """Another writer's nodes (onnxruntime's quantizer's) added under fresh names; returns what `output` became."""
        for node in nodes:
            for o in node.output:
                names.setdefault(o, self._unique(node.op_type.lower()))
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [names[i] for i in node.input]
            copy.output[:] = [names[o] for o in node.output]
            copy.name = self._unique(f"node_{node.op_type.lower()}")
            self.nodes.append(copy)
        return names[output]

    def describe_precision(self) -> dict | None:
        """The manifest's record of what the scheme made of the graph (as export.precision.quantize_graph's)."""
        if self.scheme is None:
            return None
        return {**self.scheme.describe(), "matmuls": self.quantized, "weight_bytes_before": self.fp32_bytes,
                "weight_bytes_after": self.weight_bytes}

    def save(self) -> Path:
        if self._data is not None:
            self._data.close()
        # Every value typed here, because no shape inference can type what follows a com.microsoft operator,
        # and onnxruntime's quantizers need each MatMul input's type.
        declared = {v.name for v in self.outputs}
        typed = [helper.make_tensor_value_info(name, element, None) for name, element in self._computed_types().items()
                 if name not in declared]
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers, value_info=typed)
        opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in sorted(self.domains)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="vibevoice-onnx writer")
        model.ir_version = 10
        onnx.save(model, str(self.path))
        return self.path

    def _computed_types(self) -> dict[str, int]:
        types = {v.name: v.type.tensor_type.elem_type for v in self.inputs}
        types.update((t.name, t.data_type) for t in self.initializers)
        computed = {}
        for node in self.nodes:
            first = types.get(node.input[0]) if node.input else None
            for index, name in enumerate(node.output):
                types[name] = computed[name] = _computed_type(node, index, first)
        return computed

    def abandon(self) -> None:
        if self._data is not None:
            self._data.close()


def _computed_type(node: onnx.NodeProto, index: int, first_input: int | None) -> int:
    """What a node's output holds: a quantizer's integers, a shape's int64, a cast's type, else its first input's
    type (the shape arithmetic of a dynamic padding stays int64), fp32 where that is not known."""
    if node.op_type == "DynamicQuantizeLinear":
        return TensorProto.FLOAT if index == 1 else TensorProto.UINT8
    if node.op_type in ("MatMulInteger", "Shape"):
        return TensorProto.INT32 if node.op_type == "MatMulInteger" else TensorProto.INT64
    if node.op_type == "Cast":
        return next(a.i for a in node.attribute if a.name == "to")
    if node.domain == MS_DOMAIN or first_input is None:
        return TensorProto.FLOAT
    return first_input

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
                  np.dtype(np.int32): TensorProto.INT32}


class GraphWriter:
    """One graph: `input`, `op` and `output` in run order, `weight` for a checkpoint's tensors (fp32),
    `const` for the graph's own small constants (deduplicated), then `save`."""

    def __init__(self, name: str, directory: Path, external: bool):
        self.name, self.path = name, Path(directory) / f"{name}.onnx"
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.domains: set[str] = set()
        self._constants: dict[tuple, str] = {}
        self._counts: dict[str, int] = {}
        self.weight_bytes = 0
        self.data_path = self.path.with_name(self.path.name + ".data") if external else None
        self._data = open(self.data_path, "wb") if external else None
        self._offset = 0

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

    def weight(self, name: str, array: np.ndarray) -> str:
        """A weight (float32), written to the data file now where the graph keeps its weights outside."""
        array = np.ascontiguousarray(array, dtype=np.float32)
        name = self._unique(name)
        self.weight_bytes += array.nbytes
        if self._data is None:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        offset = -self._offset % ALIGNMENT + self._offset
        self._data.seek(offset)
        self._data.write(array.tobytes())
        self._offset = offset + array.nbytes
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape,
                             data_location=TensorProto.EXTERNAL)
        for key, value in (("location", self.data_path.name), ("offset", str(offset)), ("length", str(array.nbytes))):
            tensor.external_data.add(key=key, value=value)
        self.initializers.append(tensor)
        return name

    def save(self) -> Path:
        if self._data is not None:
            self._data.close()
        # Every value these graphs compute is fp32: typed here because no shape inference can type what follows
        # a com.microsoft operator, and onnxruntime's quantizers need each MatMul input's type.
        declared = {v.name for v in self.outputs}
        typed = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for node in self.nodes for o in node.output
                 if o not in declared]
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers, value_info=typed)
        opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in sorted(self.domains)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="vibevoice-onnx writer")
        model.ir_version = 10
        onnx.save(model, str(self.path))
        return self.path

    def abandon(self) -> None:
        if self._data is not None:
            self._data.close()

"""Memory-bounded export: a graph traced on placeholder weights (see reference.loading.load_skeleton), then
its weights streamed one tensor at a time from the checkpoint's shards into the graph's external data file,
quantized on the way where the policy gives the graph a scheme.

A linear layer's weight W [out, in] reaches the traced graph as MatMul(x, Transpose(W)). Each such pair is
rewritten with the transposed weight as a plain initializer (fp32) or as one MatMulNBits node made by
onnxruntime's own quantizer (`precision.quantize_weight`); every other placeholder is written as stored, in
fp32. Peak memory: the graph's real (small) tensors plus a few copies of the largest single weight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import onnx_ir as ir
import torch

from ..errors import VibeVoiceError
from ..reference.loading import DeferredWeight
from ..writer.graph import AlignedFile
from .graphs import GraphSpec, trace
from .precision import Mixed, Scheme, layer_count, quantize_weight



def deferred_weights(spec: GraphSpec, reference) -> dict[str, DeferredWeight]:
    """A skeleton's placeholders in the spec's graph, by the graph's own parameter names, with where each weight
    is stored (`reference.model`, `reference.deferred` as the skeleton loaders give them)."""
    targets = {id(p): target for target, p in reference.model.named_parameters()}
    return {name: reference.deferred[targets[id(p)]] for name, p in spec.module.named_parameters()
            if targets.get(id(p)) in reference.deferred}


class DataFile(AlignedFile):
    """The graph's .onnx.data file, written tensor by tensor; each tensor becomes an external reference."""

    def add(self, name: str, array: np.ndarray) -> ir.ExternalTensor:
        offset, length = super().add(array)
        return ir.ExternalTensor(self.path.name, offset, length, ir.DataType.from_numpy(array.dtype),
                                 shape=ir.Shape(array.shape), name=name, base_dir=self.path.parent)


def _initializer(graph: ir.Graph, data: DataFile, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     const_value=data.add(name, array))
    graph.register_initializer(value)
    return value


def _attribute(node: ir.Node, name: str, default):
    attribute = node.attributes.get(name)
    return default if attribute is None else attribute.value


def _linear_use(value: ir.Value) -> ir.Node | None:
    """How the graph applies a linear layer's weight W [out, in], if it does: the Transpose(perm=[1, 0]) that
    feeds MatMuls, or a Gemm(x, W, transB=1) (the exporter's form for 2-D inputs). None for anything else."""
    uses = list(value.uses())
    if len(uses) != 1 or uses[0].node.domain not in ("", "ai.onnx") or uses[0].idx != (0 if uses[0].node.op_type == "Transpose" else 1):
        return None
    node = uses[0].node
    if node.op_type == "Transpose" and list(_attribute(node, "perm", [])) == [1, 0]:
        return node
    plain_gemm = (_attribute(node, "transB", 0) == 1 and _attribute(node, "transA", 0) == 0
                  and _attribute(node, "alpha", 1.0) == 1.0 and _attribute(node, "beta", 1.0) == 1.0)
    return node if node.op_type == "Gemm" and plain_gemm else None


def _products(linear: ir.Node) -> list[tuple[ir.Node, ir.Value, ir.Value | None]]:
    """Each product of the weight with an input: (node, its input x, a bias added after) -- or [] when the
    transposed weight feeds anything but MatMul's right-hand side."""
    if linear.op_type == "Gemm":
        return [(linear, linear.inputs[0], linear.inputs[2] if len(linear.inputs) > 2 else None)]
    uses = list(linear.outputs[0].uses())
    if not all(u.node.op_type == "MatMul" and u.idx == 1 for u in uses):
        return []
    return [(u.node, u.node.inputs[0], None) for u in uses]


def _stream_linear(graph: ir.Graph, data: DataFile, linear: ir.Node, weight: np.ndarray, name: str,
                   scheme: Scheme | None) -> int:
    """Write a linear layer's weight: fp32 as the graph wants it (W^T for MatMul, W for Gemm), or as
    MatMulNBits replacing each product; returns the number of MatMulNBits made."""
    if scheme is None:
        if linear.op_type == "Gemm":
            linear.replace_input_with(1, _initializer(graph, data, name + ".stored", weight))
        else:
            ir.convenience.replace_all_uses_with(linear.outputs[0], _initializer(graph, data, name + ".T", weight.T))
            graph.remove(linear, safe=True)
        return 0
    products = _products(linear)
    if not products:
        raise VibeVoiceError(f"{name}: the graph uses this weight other than in MatMul or Gemm; it cannot be "
                             "quantized while streaming")
    attributes, tensors = quantize_weight(np.ascontiguousarray(weight.T), name, scheme)
    inputs = [_initializer(graph, data, tensor_name, array) for tensor_name, array in tensors]
    for product, x, bias in products:
        nodes = [ir.Node("com.microsoft", "MatMulNBits", [x, *inputs], name=f"{product.name}_Q{scheme.bits}",
                         attributes=[ir.AttrInt64(k, int(v)) for k, v in attributes.items()])]
        if bias is not None:
            nodes.append(ir.Node("", "Add", [nodes[0].outputs[0], bias], name=f"{product.name}_bias"))
        ir.convenience.replace_nodes_and_values(graph, product, [product], nodes, product.outputs, nodes[-1].outputs)
    if linear.op_type == "Transpose":
        graph.remove(linear, safe=True)
    return len(products)


def stream_weights(model: ir.Model, deferred: dict[str, DeferredWeight], data_path: Path,
                   scheme: Scheme | Mixed | None, progress: Callable[[int, int], None] = lambda done, total: None) -> tuple[int, int]:
    """Give every placeholder initializer named in `deferred` its stored weight, one at a time, in
    `data_path`; returns the number of MatMuls made MatMulNBits and the bytes written."""
    graph = model.graph
    names = [name for name in list(graph.initializers) if name in deferred]
    layers = layer_count(names)
    data, quantized = DataFile(data_path), 0
    try:
        for done, name in enumerate(names, 1):
            placeholder = graph.initializers[name]
            weight = deferred[name].read().to(torch.float32).numpy()
            linear = _linear_use(placeholder) if weight.ndim == 2 else None
            if linear is not None:
                chosen = scheme.of_weight(name, layers) if isinstance(scheme, Mixed) else scheme
                quantized += _stream_linear(graph, data, linear, weight, name, chosen)
            elif scheme is not None and weight.ndim == 2:
                raise VibeVoiceError(f"{name}: a matrix the graph does not use as a linear layer's weight; "
                                     f"it cannot be stored as {scheme.name}")
            else:
                ir.convenience.replace_all_uses_with(placeholder, _initializer(graph, data, name + ".stored", weight))
            if not list(placeholder.uses()):
                del graph.initializers[name]
            progress(done, len(names))
    finally:
        data.close()
    if quantized:
        model.opset_imports.setdefault("com.microsoft", 1)
    return quantized, data.payload


def export_streamed(spec: GraphSpec, out_dir: Path, deferred: dict[str, DeferredWeight], scheme: Scheme | None,
                    log: Callable[[str], None] = print) -> tuple[Path, dict | None]:
    """Export `spec` whose module holds placeholders for the `deferred` weights (keyed by the module's own
    parameter names); returns the graph's path and, when quantized, what was done (for the manifest)."""
    path = Path(out_dir) / f"{spec.name}.onnx"
    program = trace(spec, optimize=False)  # folding would materialise each transposed placeholder
    step = max(1, len(deferred) // 10)

    def progress(done: int, total: int) -> None:
        if done % step == 0 or done == total:
            log(f"  {spec.name}: {done}/{total} weights streamed")

    count, written = stream_weights(program.model, deferred, path.with_name(path.name + ".data"), scheme, progress)
    program.optimize()
    ir.save(program.model, path)
    log(f"  exported {spec.name} ({written / 1e6:.1f} MB of weights streamed from the checkpoint)")
    if scheme is None:
        return path, None
    before = sum(int(np.prod(w.shape)) * 4 for w in deferred.values())
    return path, {**scheme.describe(), "matmuls": count, "weight_bytes_before": before, "weight_bytes_after": written,
                  "streamed": True}

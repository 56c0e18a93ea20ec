"""What a mobile or NPU engine will make of a graph, by onnxruntime's own tools: every value's shape after
onnxruntime's symbolic shape inference (which knows its contrib ops, such as the int8 MatMulNBits), the
NNAPI and CoreML partitioning its mobile usability checker predicts, and the ORT format onnxruntime-mobile loads."""

from __future__ import annotations

from pathlib import Path

import onnx


def _dims(value: onnx.ValueInfoProto) -> list | None:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]


def non_static(model: onnx.ModelProto) -> list[str]:
    """Every input, output and intermediate value whose shape is unknown or has a symbolic dimension."""
    graph = model.graph
    found = []
    for value in [*graph.input, *graph.output, *graph.value_info]:
        dims = _dims(value)
        if dims is None or any(not isinstance(d, int) or d <= 0 for d in dims):
            found.append(f"{value.name} {dims}")
    return found


def _partitions(info) -> dict:
    return {"nodes": info.num_nodes, "supported_nodes": info.num_supported_nodes, "partitions": info.num_partitions,
            "unsupported_ops": sorted(info.unsupported_ops)}


def static_shapes_and_usability(path: Path) -> tuple[list[str], dict]:
    """(the values that are not static, the NNAPI and CoreML (ML Program) partitioning of the graph's nodes)."""
    from onnxruntime.tools.mobile_helpers.usability_checker import check_coreml_partitions, check_nnapi_partitions
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    model = onnx.load(str(path))  # with its .onnx.data: the inference reads small constant initializers' values
    inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=False, guess_output_rank=False)
    usability = {"nnapi": _partitions(check_nnapi_partitions(inferred, require_fixed_input_sizes=True)),
                 "coreml": _partitions(check_coreml_partitions(inferred, True, "coreml_supported_mlprogram_ops.md"))}
    return non_static(inferred), usability


def ort_format(path: Path) -> str:
    """GRAPH.ort beside GRAPH.onnx: the graph with onnxruntime's basic (provider-independent) optimizations,
    saved in the ORT format; returns its file name."""
    import onnxruntime as ort

    target = path.with_suffix(".ort")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return target.name

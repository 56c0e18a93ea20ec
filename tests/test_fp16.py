"""The fp16 conversion whatever onnxruntime converter is installed: the duplicate Casts that onnxruntime
1.31's converter writes (one per kept-fp32 consumer, all under one name) are merged into one per tensor, and
a converted graph passes the checker and loads in onnxruntime; a CUDA install with two onnxruntime
distributions is named for what it is."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vibevoice_onnx.errors import VibeVoiceError
from vibevoice_onnx.export.precision import _sort_topologically, convert_fp16, share_casts
from vibevoice_onnx.runtime.bundle import runtime_clash

RNG = np.random.default_rng(0)
WEIGHT = RNG.uniform(0.5, 1.5, (4,)).astype(np.float32)
FEED = {"x": RNG.uniform(0.5, 2.0, (2, 4)).astype(np.float32)}


def _model(nodes, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def fp32_model() -> onnx.ModelProto:
    """t = x * w feeds two kept-fp32 ops (Pow and Sqrt): the case the 1.31 converter breaks."""
    return _model([helper.make_node("Mul", ["x", "w"], ["t"]), helper.make_node("Pow", ["t", "two"], ["p"]),
                   helper.make_node("Sqrt", ["t"], ["q"]), helper.make_node("Add", ["p", "q"], ["z"])],
                  [numpy_helper.from_array(WEIGHT, "w"), numpy_helper.from_array(np.float32(2.0), "two")])


def as_converted_by_onnxruntime_1_31() -> onnx.ModelProto:
    """The fp32 graph as 1.31's converter leaves it (keep_io_types, Pow and Sqrt blocked): the Mul in fp16,
    and one Cast of t per blocked consumer, both named t_cast_to_fp32, appended after their users."""
    def cast(source, target, to):
        return helper.make_node("Cast", [source], [target], to=to, name=target + "_node")

    nodes = [cast("x", "x_fp16", TensorProto.FLOAT16), helper.make_node("Mul", ["x_fp16", "w"], ["t"]),
             helper.make_node("Pow", ["t_cast_to_fp32", "two"], ["p"]), helper.make_node("Sqrt", ["t_cast_to_fp32"], ["q"]),
             helper.make_node("Add", ["p", "q"], ["z"]),
             cast("t", "t_cast_to_fp32", TensorProto.FLOAT), cast("t", "t_cast_to_fp32", TensorProto.FLOAT)]
    return _model(nodes, [numpy_helper.from_array(WEIGHT.astype(np.float16), "w"),
                          numpy_helper.from_array(np.float32(2.0), "two")])


def run(model: onnx.ModelProto) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, FEED)[0]


def casts(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.input[0], n.output[0]) for n in model.graph.node if n.op_type == "Cast"]


def test_the_1_31_converters_duplicate_casts_are_merged_into_one_per_tensor():
    model = as_converted_by_onnxruntime_1_31()
    _sort_topologically(model.graph)
    with pytest.raises(onnx.checker.ValidationError, match="single static assignment"):  # the failure
        onnx.checker.check_model(model, full_check=True)
    assert share_casts(model.graph) == 1
    onnx.checker.check_model(model, full_check=True)
    assert casts(model).count(("t", "t_cast_to_fp32")) == 1
    np.testing.assert_allclose(run(model), run(fp32_model()), rtol=2e-3)


def test_casts_of_one_tensor_under_different_names_are_merged_and_their_readers_rewired():
    model = as_converted_by_onnxruntime_1_31()
    second = next(n for n in model.graph.node if n.op_type == "Sqrt")
    second.input[0] = "t_cast_again"
    model.graph.node[-1].output[0] = "t_cast_again"
    assert share_casts(model.graph) == 1
    assert next(n for n in model.graph.node if n.op_type == "Sqrt").input[0] == "t_cast_to_fp32"
    _sort_topologically(model.graph)
    onnx.checker.check_model(model, full_check=True)


def test_two_different_casts_under_one_name_are_refused():
    model = as_converted_by_onnxruntime_1_31()
    model.graph.node[-1].attribute[0].i = TensorProto.DOUBLE
    with pytest.raises(VibeVoiceError, match="t_cast_to_fp32"):
        share_casts(model.graph)


def test_convert_fp16_leaves_one_cast_per_tensor_and_a_graph_onnxruntime_runs(tmp_path):
    path = tmp_path / "g.onnx"
    onnx.save(fp32_model(), str(path))
    details = convert_fp16(path, external_data=False)
    converted = onnx.load(str(path))
    onnx.checker.check_model(converted, full_check=True)
    cast_keys = [(n.input[0], n.attribute[0].i) for n in converted.graph.node if n.op_type == "Cast"]
    assert len(cast_keys) == len(set(cast_keys))
    assert [source for source, _ in cast_keys].count("t") == 1  # both kept-fp32 readers of t share one Cast
    assert details["weight_bytes_after"] < details["weight_bytes_before"]
    np.testing.assert_allclose(run(converted), run(fp32_model()), rtol=2e-3)


def test_a_cuda_install_with_two_onnxruntime_distributions_is_named_with_its_fix():
    assert runtime_clash({"numpy", "onnxruntime"}) is None
    assert runtime_clash({"onnxruntime-gpu", "onnxruntime-extensions"}) is None
    message = runtime_clash({"numpy", "onnxruntime", "onnxruntime-gpu"})
    assert "onnxruntime and onnxruntime-gpu" in message
    assert "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu" in message

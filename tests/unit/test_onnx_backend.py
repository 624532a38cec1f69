"""ONNX Runtime backend helpers on hand-made graphs: which kernels an optimised graph runs, and weight
dequantization with uint8 zero points (checked against ONNX's reference implementation)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from resnet8ptq.backends.onnx.backend import kernel_summary
from resnet8ptq.backends.onnx.layer_errors import (
    augmented_session,
    dequantized_weights,
    saved_outputs,
    tensors,
)


def _graph_of(*op_types: str) -> onnx.ModelProto:
    nodes = [helper.make_node(op, [], [f"t{i}"]) for i, op in enumerate(op_types)]
    return helper.make_model(helper.make_graph(nodes, "g", [], []))


def test_fully_integer_graph() -> None:
    integer, text = kernel_summary(_graph_of(*["QLinearConv"] * 9, "QGemm", "QLinearAdd", "DequantizeLinear"))
    assert integer
    assert text == "ONNX Runtime runs 10/10 conv/gemm layers in integer kernels (QGemm x1, QLinearConv x9)"


def test_partly_integer_graph_lists_what_stays_float() -> None:
    integer, text = kernel_summary(_graph_of(*["QLinearConv"] * 3, *["Conv"] * 6, "QGemm", "Add"))
    assert integer and "4/10 conv/gemm layers" in text and "in float: Conv x6" in text


def test_float_graph_has_no_integer_kernels() -> None:
    integer, text = kernel_summary(_graph_of("DequantizeLinear", "Conv", "QuantizeLinear", "Gemm"))
    assert not integer and "keeps all 2 conv/gemm layers in float" in text


@pytest.mark.parametrize(
    ("dtype", "zero_points", "axis"),
    [
        (np.uint8, [130, 3, 255], 0),  # uint8 weights: ORT's own weight matching wraps around here
        (np.int8, [0, 0, 0], 0),
        (np.uint8, [128], None),  # per tensor
    ],
)
def test_dequantized_weights_follow_the_onnx_reference(
    dtype, zero_points: list[int], axis: int | None
) -> None:
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max + 1, size=(3, 2, 3, 3)).astype(dtype)
    scale = np.array([0.01, 0.02, 0.5][: len(zero_points)], np.float32)
    zero_point = np.array(zero_points, dtype)
    inits = [
        numpy_helper.from_array(values, "w_quantized"),
        numpy_helper.from_array(scale if axis is not None else scale.reshape(()), "w_scale"),
        numpy_helper.from_array(zero_point if axis is not None else zero_point.reshape(()), "w_zero_point"),
    ]
    attrs = {"axis": axis} if axis is not None else {}
    node = helper.make_node("DequantizeLinear", ["w_quantized", "w_scale", "w_zero_point"], ["w"], **attrs)
    output = helper.make_tensor_value_info("w", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([node], "g", [], [output], initializer=inits))
    expected = ReferenceEvaluator(model).run(None, {})[0]
    weights = dequantized_weights(model)
    assert list(weights) == ["w"]
    np.testing.assert_allclose(weights["w"], expected, rtol=0, atol=1e-6)


def _scaled_model(factor: float) -> onnx.ModelProto:
    """input (NHWC) -> Mul(factor) -> Relu: two intermediate tensors."""
    nodes = [
        helper.make_node("Mul", ["input", "factor"], ["scaled"]),
        helper.make_node("Relu", ["scaled"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scaled",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 2, 2, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, 2, 2, 3])],
        [numpy_helper.from_array(np.array(factor, np.float32), "factor")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_augmented_session_gives_each_intermediate_tensor_of_a_batch(tmp_path) -> None:
    """The layer analysis reads a batch's tensors by their names in the model (flattened, as ORT's
    qdq_loss_debug saves them); with op types given, only the tensors around those nodes; fetched by name,
    only the tensors asked for."""
    path = tmp_path / "scaled.onnx"
    onnx.save(_scaled_model(-2.0), path)
    images = np.arange(2 * 2 * 2 * 3, dtype=np.float32).reshape(2, 2, 2, 3) - 10
    session = augmented_session(path, tmp_path / "every.onnx", None)
    assert sorted(saved_outputs(session)) == ["input", "out", "scaled"]
    every = tensors(session, {"input": images}, saved_outputs(session))
    assert every.keys() == {"input", "scaled", "out"}
    np.testing.assert_allclose(every["scaled"][0], (images * -2).ravel())
    np.testing.assert_allclose(every["out"][0], np.maximum(images * -2, 0).ravel())
    assert tensors(session, {"input": images}, ["out"]).keys() == {"out"}
    relu_only = augmented_session(path, tmp_path / "relu.onnx", ["Relu"])
    assert sorted(saved_outputs(relu_only)) == ["out", "scaled"]

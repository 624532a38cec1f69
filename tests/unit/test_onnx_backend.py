"""ONNX Runtime backend helpers on hand-made graphs: which kernels an optimised graph runs, weight
dequantization with uint8 zero points, and activations narrower than 8 bits (checked against ONNX's reference
implementation)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from resnet8ptq.backends.onnx.backend import kernel_summary, session
from resnet8ptq.backends.onnx.layer_errors import (
    augmented_session,
    dequantized_weights,
    saved_outputs,
    tensors,
)
from resnet8ptq.backends.onnx.widths import clamp_narrow_activations, layer_precision
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.spec import QuantSpec


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


def _qdq_model(scale: float, zero_point: int, storage: type = np.uint8) -> onnx.ModelProto:
    """x -> QuantizeLinear (``storage``) -> DequantizeLinear -> y, as ORT's quantizer writes an activation."""
    inits = [
        numpy_helper.from_array(np.array(scale, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(zero_point, storage), "x_zero_point"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero_point"], ["x_QuantizeLinear_Output"]),
        helper.make_node("DequantizeLinear", ["x_QuantizeLinear_Output", "x_scale", "x_zero_point"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("bits", [4, 5, 6, 7])
def test_narrow_activations_are_quantized_to_their_range(bits: int, tmp_path: Path) -> None:
    """The integer Clip after QuantizeLinear makes the pair quantize to 0..2^b-1 (zero point 3), in ONNX's
    reference evaluator and in ONNX Runtime; the width reads back from the model."""

    model = _qdq_model(0.5, 3)
    spec = QuantSpec(DtypeConfig("uint8", "int8", activation_bits=bits), CalibConfig("minmax"))
    clamp_narrow_activations(model, spec, {"x": bits})
    onnx.checker.check_model(model)
    x = np.linspace(-10, 200, 421, dtype=np.float32)
    expected = (np.clip(np.round(x / 0.5) + 3, 0, 2**bits - 1) - 3) * 0.5  # round half to even, as ONNX
    (reference,) = ReferenceEvaluator(model).run(None, {"x": x})
    onnx.save(model, tmp_path / "model.onnx")
    runtime = session(tmp_path / "model.onnx").run(None, {"x": x})[0]
    np.testing.assert_array_equal(reference, expected)
    np.testing.assert_array_equal(runtime, expected)
    assert [(p.kind, p.dtype, p.bits) for p in layer_precision(model)] == [("activation", "uint8", bits)]


def test_8_bit_activations_get_no_clip() -> None:

    model = _qdq_model(0.5, 3)
    clamp_narrow_activations(model, QuantSpec(DtypeConfig("uint8", "int8"), CalibConfig("minmax")), {"x": 8})
    assert [node.op_type for node in model.graph.node] == ["QuantizeLinear", "DequantizeLinear"]

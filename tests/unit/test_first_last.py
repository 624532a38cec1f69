"""The papers' first/last-layer convention (`dtype.first_last_bits`) on a small ONNX graph: which layers it
keeps wider, the widths each backend is given, the check of a saved model, and bad settings."""

from __future__ import annotations

import pytest

from resnet8ptq.backends.onnx.widths import activation_qranges, activation_widths, weight_overrides
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.layers import check_first_last, first_last_layers, weight_widths
from resnet8ptq.spec import LayerPrecision, QuantSpec

from .test_mixed_precision import small_model

TENSORS = ["input", "model_1/t:0", "model_1/c:0", "model_1/r:0", "model_1/p:0", "model_1/f:0", "out"]


def _spec(first_last_bits: int | None, weight_bits: int = 4, activation_bits: int = 4) -> QuantSpec:
    dtype = DtypeConfig("uint8", "int8", activation_bits, weight_bits, first_last_bits)
    return QuantSpec(dtype, CalibConfig("minmax"), per_channel=True)


def test_the_first_and_last_layers_and_what_they_read() -> None:
    """The conv's weight and input (a transpose of the graph input), the dense layer's weight and input (a
    reshape of an average pool of the ReLU: all three take the ReLU's quantization); not the conv's output."""
    assert first_last_layers(small_model()) == {"conv", "t", "input", "dense", "f", "p", "r"}


def test_each_layer_gets_its_width() -> None:
    model = small_model()
    assert set(weight_widths(model, _spec(8)).values()) == {8}
    assert set(weight_widths(model, _spec(None)).values()) == {4}
    widths = activation_widths(model, _spec(6), TENSORS)
    assert widths == {"input": 6, "model_1/t:0": 6, "model_1/c:0": 4, "model_1/r:0": 6, "model_1/p:0": 6,
                      "model_1/f:0": 6, "out": 8}  # fmt: skip
    assert activation_qranges(model, _spec(6), TENSORS)["model_1/r:0"] == (0, 63)
    assert activation_qranges(model, _spec(6), TENSORS)["model_1/c:0"] == (0, 15)


def test_ort_is_given_the_narrow_grids_only() -> None:
    """8-bit layers need no override (ORT's own parameters); 6-bit ones get their 6-bit grid."""
    model = small_model()
    assert weight_overrides(model, _spec(8)) == {}
    six = weight_overrides(model, _spec(6))
    assert set(six) == {"model_1/conv/ReadVariableOp:0", "model_1/dense/ReadVariableOp:0"}
    scales = [float(entry["scale"]) for entry in six["model_1/conv/ReadVariableOp:0"]]
    assert scales == pytest.approx([1 / 31, 1 / 31])  # all-ones weights on -31..31


def _read_back(weight_bits: int, activation_bits: int) -> list[LayerPrecision]:
    return [
        LayerPrecision("t", "activation", "uint8", activation_bits),
        LayerPrecision("conv", "weight", "int8", weight_bits),
        LayerPrecision("c", "activation", "uint8", 4),
        LayerPrecision("r", "activation", "uint8", activation_bits),
        LayerPrecision("dense", "weight", "int8", weight_bits),
    ]


def test_a_saved_model_is_checked_and_tagged() -> None:
    model = small_model()
    assert check_first_last(_read_back(8, 8), model, _spec(8)) == "8 bits (read back): conv, dense, r, t"
    assert check_first_last(_read_back(4, 4), model, _spec(None)) is None
    with pytest.raises(RuntimeError, match="weight conv: 4 bits"):
        check_first_last(_read_back(4, 8), model, _spec(8))
    with pytest.raises(RuntimeError, match="no quantized input of the last layer"):
        check_first_last(_read_back(8, 8)[:-2] + _read_back(8, 8)[-1:], model, _spec(8))


@pytest.mark.parametrize(
    ("weight_bits", "activation_bits", "first_last_bits", "message"),
    [
        (4, 8, 6, r"first_last_bits=6: .*at least the width of the rest.*expected null or 8..8"),
        (4, 4, 2, r"expected null or 4..8"),
        (8, 16, 8, r"with 16-bit activations .* set dtype.first_last_bits=null"),
    ],
)
def test_first_last_bits_below_the_rest_are_refused(
    weight_bits: int, activation_bits: int, first_last_bits: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        DtypeConfig("uint8", "int8", activation_bits, weight_bits, first_last_bits)


def test_the_label_says_which_convention() -> None:
    assert DtypeConfig("uint8", "int8", 4, 4, 8).label == "uint4-int4-fl8"
    assert DtypeConfig("uint8", "int8", 4, 4).label == "uint4-int4"

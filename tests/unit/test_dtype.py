"""The `dtype` group's widths: one integer-range rule (ONNX Runtime's at any width), read-back, bad values."""

from __future__ import annotations

import pytest
from onnx import TensorProto
from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

from resnet8ptq.config import quant_spec
from resnet8ptq.dtype import DtypeConfig, bits_used, integer_range
from resnet8ptq.errors import ConfigError
from tests.unit.test_config import composed

ONNX_TYPES = {
    ("int8", 8): TensorProto.INT8,
    ("uint8", 8): TensorProto.UINT8,
    ("int8", 16): TensorProto.INT16,
    ("uint8", 16): TensorProto.UINT16,
}


@pytest.mark.parametrize(("signedness", "bits"), list(ONNX_TYPES))
@pytest.mark.parametrize("symmetric", [False, True])
def test_integer_range_is_onnx_runtimes_at_8_and_16_bits(signedness: str, bits: int, symmetric: bool) -> None:
    expected = get_qmin_qmax_for_qType(ONNX_TYPES[signedness, bits], symmetric=symmetric)
    assert integer_range(signedness, bits, symmetric) == tuple(int(q) for q in expected)
    if bits == 8:
        reduced = get_qmin_qmax_for_qType(ONNX_TYPES[signedness, bits], reduce_range=True)
        assert integer_range(signedness, bits, symmetric, reduce_range=True) == tuple(int(q) for q in reduced)


def test_integer_range_at_narrow_widths() -> None:
    assert integer_range("int8", 4, symmetric=True) == (-7, 7)
    assert integer_range("int8", 4, symmetric=False) == (-8, 7)
    assert integer_range("uint8", 4, symmetric=True) == (0, 15)
    assert integer_range("int8", 2, symmetric=True) == (-1, 1)
    with pytest.raises(ValueError, match="reduce_range"):
        integer_range("int8", 4, symmetric=True, reduce_range=True)


@pytest.mark.parametrize("bits", range(2, 9))
def test_bits_used_reads_back_every_width(bits: int) -> None:
    assert bits_used(*integer_range("int8", bits, symmetric=True), signed=True) == bits
    assert bits_used(*integer_range("int8", bits, symmetric=False), signed=True) == bits
    assert bits_used(*integer_range("uint8", bits, symmetric=False), signed=False) == bits
    assert bits_used(0, 2 ** (bits - 1), signed=False) == bits  # one code above the half range


def test_labels_and_storage() -> None:
    assert DtypeConfig("int8", "int8").label == "int8-int8"
    assert DtypeConfig("uint8", "int8", activation_bits=16).storage == ("uint16", "int8")
    assert DtypeConfig("uint8", "int8", activation_bits=16).label == "uint16-int8"
    assert DtypeConfig("uint8", "int8", activation_bits=6, weight_bits=4).label == "uint6-int4"


def test_a16w8_preset_and_bit_overrides_compose() -> None:
    spec = quant_spec(composed("dtype=a16w8"))
    assert (spec.dtype.storage, spec.dtype.weight_bits) == (("uint16", "int8"), 8)
    spec = quant_spec(composed("dtype=u8s8", "dtype.weight_bits=4", "dtype.activation_bits=6"))
    assert (spec.dtype.activation_range(), spec.dtype.weight_range(symmetric=True)) == ((0, 63), (-7, 7))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["dtype.weight_bits=1"], "dtype.weight_bits=1: expected 2..8"),
        (["dtype.weight_bits=9"], "dtype.weight_bits=9: expected 2..8"),
        (["dtype.activation_bits=3"], "dtype.activation_bits=3: expected 4..8 or 16"),
        (["dtype.activation_bits=12"], "dtype.activation_bits=12: expected 4..8 or 16"),
        (["dtype.weight_bits=4", "reduce_range=true"], "set dtype.weight_bits=7 instead"),
    ],
)
def test_bad_widths_are_refused_by_name(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        quant_spec(composed(*overrides))

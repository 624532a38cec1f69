"""The requantizer's multiplier width (device.requantizer_bits, resnet8ptq/device/requantizer.py): a narrowed
multiplier keeps its top bits, rounded; the executor's doubling high multiply by it is a b-bit multiplier's
rounded product, bit for bit; every requantization of a model is narrowed and 32 bits change nothing; the
setting names the run and prices the multiplier by its width."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.device.executor import execute
from resnet8ptq.device.fixed_point import quantize_multiplier, saturating_rounding_doubling_high_mul
from resnet8ptq.device.graph import Add, AveragePool, IntegerModel, Quant
from resnet8ptq.device.requantizer import narrow_multiplier, with_requantizer_bits
from tests.unit.test_device import conv_layer

RNG = np.random.default_rng(0)
SCALES = np.exp(RNG.uniform(np.log(1e-5), np.log(0.9), 2000))


@pytest.mark.parametrize("bits", [8, 12, 16, 24, 31])
def test_a_narrowed_multiplier_keeps_its_top_bits_rounded(bits: int) -> None:
    multiplier, shift = quantize_multiplier(SCALES)
    narrowed, new_shift = narrow_multiplier(multiplier, shift, bits)
    assert (
        np.all(narrowed % (1 << (32 - bits)) == 0) and np.all(narrowed < 2**31) and np.all(narrowed >= 2**30)
    )
    error = np.abs(narrowed * np.exp2(new_shift - 31.0) - multiplier * np.exp2(shift - 31.0))
    assert np.all(error <= np.exp2(shift - 31.0) * 2.0 ** (32 - bits - 1))  # within half its last bit
    assert narrow_multiplier(2**31 - 1, 3, bits) == (2**30, 4)  # rounding carries: halved, shifted once more
    assert narrow_multiplier(multiplier[:5], shift[:5], 32)[0].tolist() == multiplier[:5].tolist()


@pytest.mark.parametrize("bits", [8, 16])
def test_the_doubling_high_multiply_by_it_is_a_b_bit_multipliers_rounded_product(bits: int) -> None:
    """gemmlowp's SaturatingRoundingDoublingHighMul by the narrowed multiplier equals multiplying by its
    b-bit value (multiplier >> (32 - b)) and rounding off b - 1 bits with gemmlowp's nudge (ties upward)."""
    multiplier, _ = narrow_multiplier(*quantize_multiplier(SCALES[:50]), bits)
    acc = RNG.integers(-(2**31), 2**31, (50, 200), dtype=np.int64)
    small = (multiplier >> (32 - bits))[:, None]
    product = acc * small
    half = 1 << (bits - 2)
    hardware = np.where(product >= 0, (product + half) >> (bits - 1), -((-product + half - 1) >> (bits - 1)))
    assert np.array_equal(saturating_rounding_doubling_high_mul(acc, multiplier[:, None]), hardware)


def _model() -> IntegerModel:
    rng = np.random.default_rng(1)
    conv = conv_layer(rng, channels_in=3, channels_out=4)
    quant = conv.output_quant
    add = Add(
        "add", ("y", "y"), "z", (quant, quant), quant, 20, (1518500250, 1518500250), (-1, -1),
        1518500250, -18, -128, 127,
    )  # fmt: skip
    (pool_multiplier,), (pool_shift,) = quantize_multiplier(1 / 7)
    pool = AveragePool(
        "pool", "z", "p", quant, Quant(0.05, -128, -128, 127), False, pool_multiplier, pool_shift
    )
    return IntegerModel("test", "x", conv.input_quant, "half_to_even", [conv, add, pool])


def test_every_requantization_of_a_model_is_narrowed_and_32_bits_change_nothing() -> None:
    model = _model()
    assert with_requantizer_bits(model, 32) is model
    narrowed = with_requantizer_bits(model, 8)
    conv, add, pool = narrowed.layers
    values = [*conv.multiplier, *add.input_multipliers, add.output_multiplier, pool.multiplier]
    assert all(int(value) % (1 << 24) == 0 for value in values)
    assert conv.weight is model.layers[0].weight and "narrowed to 8 bits" in narrowed.notes[-1]
    images = np.random.default_rng(2).uniform(0, 12, (64, 6, 6, 3)).astype(np.float32)  # in range
    full, _ = execute(model, images)
    eight, _ = execute(narrowed, images)
    assert np.array_equal(execute(with_requantizer_bits(model, 32), images)[0], full)
    assert not np.array_equal(full, eight)  # 7 fraction bits move some outputs by a step
    assert np.abs(full.astype(int) - eight.astype(int)).max() <= 2


def test_the_setting_is_checked_and_names_the_run() -> None:
    assert DeviceConfig(kind="integer", requantizer_bits=16).label == "int-rq16"
    assert DeviceConfig(kind="cim", rows=64, adc_bits=4, requantizer_bits=12).label == "cim-r64-adc4-rq12"
    assert DeviceConfig(kind="integer").label == "int"
    with pytest.raises(ValueError, match=r"device.requantizer_bits=40: expected 8..32 bits"):
        DeviceConfig(kind="integer", requantizer_bits=40)


def test_the_requantizer_is_priced_by_its_width() -> None:
    pytest.importorskip("hwcomponents", reason="the component models need Python >= 3.12")
    from resnet8ptq.components.config import ComponentsConfig
    from resnet8ptq.components.costs import chip_cost
    from tests.unit.test_chip_cost import actions

    costs = {}
    for bits in (32, 16):
        device = DeviceConfig(kind="integer", requantizer_bits=bits)
        costs[bits] = chip_cost(actions(device), device, ComponentsConfig())
    (part,) = [p for p in costs[16].parts if p.component == "requantizer"]
    assert "width_a=32, width_b=16" in part.attributes
    assert costs[16].energy["requantizer"] == pytest.approx(costs[32].energy["requantizer"] / 2)  # linear
    assert math.isclose(costs[16].energy["mac"], costs[32].energy["mac"])
    assert replace(DeviceConfig(kind="integer"), requantizer_bits=16).requantizer_bits == 16

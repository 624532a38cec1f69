"""Grouped (depthwise) convolutions on the crossbar (resnet8ptq/device/cim.py, ``device.depthwise``): mapped
block-diagonally, each group's columns compute exactly what the same group computes as an ungrouped layer of
its own (tiles, bit-serial inputs, sliced weights, calibrated ADCs, IR drop, read noise's input energy);
``digital`` computes them exactly whatever the crossbar's non-idealities."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from resnet8ptq.device.adc import PartialSumProfile
from resnet8ptq.device.adc_ranges import AdcRule, calibrated_steps
from resnet8ptq.device.cim import CrossbarArithmetic, input_energy
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.executor import Ideal, integer_conv2d
from resnet8ptq.device.graph import Conv
from tests.unit.test_device import conv_layer

PER_CHANNEL = ("weight", "weight_zero_point", "weight_scale", "bias", "multiplier", "shift")


def grouped_layer(rng: np.random.Generator, channels: int, groups: int, multiplier: int) -> Conv:
    """A conv of ``groups`` groups over ``channels`` inputs, ``multiplier`` outputs per group."""
    layer = conv_layer(rng, channels_in=channels // groups, channels_out=groups * multiplier)
    return dataclasses.replace(layer, name="grouped", groups=groups)


def group_of(layer: Conv, group: int) -> Conv:
    """Group ``group`` of ``layer`` as an ungrouped layer of its own."""
    per_group = len(layer.weight) // layer.groups
    part = slice(group * per_group, (group + 1) * per_group)
    sliced = {name: getattr(layer, name)[part] for name in PER_CHANNEL}
    return dataclasses.replace(layer, name=f"group{group}", groups=1, **sliced)


def calibrated(crossbar: Crossbar, layer: Conv, x: torch.Tensor) -> CrossbarArithmetic:
    """The crossbar with ``layer``'s ADCs set (``max``, per column) from its partial sums on ``x``."""
    profile = PartialSumProfile()
    CrossbarArithmetic(crossbar.ideal(), profile=profile).accumulate(layer, x)
    steps = calibrated_steps(profile, AdcRule.of(crossbar, "max"))
    return CrossbarArithmetic(crossbar, adc_steps=steps)


def inputs(rng: np.random.Generator, channels: int, n: int = 3) -> torch.Tensor:
    return torch.from_numpy(rng.integers(0, 256, (n, channels, 7, 7)).astype(np.float32))


LAYERS = [(6, 6, 2), (6, 2, 2)]  # (channels, groups, outputs per group): depthwise x2; two groups of three
CROSSBARS = [
    Crossbar(adc_bits=5),
    Crossbar(rows=10, adc_bits=4, dac_bits=2, bits_per_cell=4, cells_per_weight=2),
    Crossbar(rows=4, adc_bits=6, adc_window="symmetric", adc_step="free"),
]


@pytest.mark.parametrize(("channels", "groups", "multiplier"), LAYERS, ids=["depthwise", "two-groups"])
@pytest.mark.parametrize("crossbar", CROSSBARS, ids=["adc", "tiles-sliced", "small-tiles-free-steps"])
def test_each_group_computes_as_a_layer_of_its_own(
    channels: int, groups: int, multiplier: int, crossbar: Crossbar
) -> None:
    """Block-diagonal: a column sums its group's C_in/groups·kh·kw terms only, tiled, sliced and read by its
    own ADC, so the grouped layer's columns equal each group's as an ungrouped layer, bit for bit; with an
    ideal ADC both equal the integer device."""
    rng = np.random.default_rng(11)
    layer = grouped_layer(rng, channels, groups, multiplier)
    calibration, x = inputs(rng, channels, 8), inputs(rng, channels)
    ideal = CrossbarArithmetic(dataclasses.replace(crossbar, adc_bits=None)).accumulate(layer, x)
    assert torch.equal(ideal.to(torch.float64), Ideal().accumulate(layer, x).to(torch.float64))
    grouped = calibrated(crossbar, layer, calibration).accumulate(layer, x)
    per_group = channels // groups
    for group in range(groups):
        alone = group_of(layer, group)
        own = slice(group * per_group, (group + 1) * per_group)
        expected = calibrated(crossbar, alone, calibration[:, own]).accumulate(alone, x[:, own])
        columns = grouped[:, group * multiplier : (group + 1) * multiplier]
        assert torch.equal(columns.to(torch.float64), expected.to(torch.float64))
    assert not torch.equal(grouped.to(torch.float64), ideal.to(torch.float64))  # the ADC rounds


def test_ir_drop_on_a_group_is_its_own_columns() -> None:
    """aihwkit's first-order IR drop (deterministic) on a depthwise layer: each column's drop comes from its
    own kernel's rows, as that kernel's alone."""
    rng = np.random.default_rng(12)
    layer = grouped_layer(rng, 4, 4, 1)
    x = inputs(rng, 4)
    crossbar = Crossbar(rows=6, ir_drop=1.0, ir_drop_g_ratio=20.0)  # a strong drop over a 9-row column
    grouped = CrossbarArithmetic(crossbar).accumulate(layer, x).to(torch.float64)
    assert not torch.equal(grouped, Ideal().accumulate(layer, x).to(torch.float64))
    for group in range(4):
        alone = group_of(layer, group)
        expected = CrossbarArithmetic(crossbar).accumulate(alone, x[:, group : group + 1])
        torch.testing.assert_close(grouped[:, group : group + 1], expected.to(torch.float64), atol=1, rtol=0)


def test_read_noise_sees_each_columns_own_inputs() -> None:
    """The input energy read noise scales with (Σ x² over a column's rows) is each column's group's, per
    weight slice: a depthwise column's 9 inputs, not every channel's."""
    rng = np.random.default_rng(13)
    layer = dataclasses.replace(grouped_layer(rng, 3, 3, 2), padding=(0, 0, 0, 0))
    squares = inputs(rng, 3).square().to(torch.float64)
    rows = torch.ones((1, 1, 3, 3), dtype=torch.float64)
    energy = input_energy(layer, squares, rows, columns=2 * len(layer.weight))  # two weight slices
    by_channel = integer_conv2d(squares, torch.ones((3, 1, 3, 3), dtype=torch.float64), 1, groups=3)
    expected = by_channel.repeat_interleave(2, dim=1).repeat(1, 2, 1, 1)
    assert torch.equal(energy, expected)
    x = inputs(rng, 3)
    noisy = CrossbarArithmetic(Crossbar(read_noise=0.05, cells_per_weight=2, bits_per_cell=4)).accumulate(
        layer, x
    )
    assert noisy.shape == (3, 6, 5, 5) and not torch.equal(
        noisy.double(), Ideal().accumulate(layer, x).double()
    )


def test_the_digital_unit_computes_a_depthwise_layer_exactly() -> None:
    """``depthwise=digital``: the grouped layer is computed by exact integer MACs on a noisy chip with few-bit
    ADCs, which change an ungrouped layer's accumulators."""
    rng = np.random.default_rng(14)
    depthwise, dense = grouped_layer(rng, 4, 4, 1), conv_layer(rng, channels_in=4, channels_out=4)
    x = inputs(rng, 4)
    chip = Crossbar(depthwise="digital", weight_noise=0.05, read_noise=0.02)
    arithmetic = CrossbarArithmetic(chip)
    assert torch.equal(arithmetic.accumulate(depthwise, x), Ideal().accumulate(depthwise, x))
    assert not torch.equal(arithmetic.accumulate(dense, x).double(), Ideal().accumulate(dense, x).double())
    on_arrays = CrossbarArithmetic(dataclasses.replace(chip, depthwise="crossbar")).accumulate(depthwise, x)
    assert not torch.equal(on_arrays.double(), Ideal().accumulate(depthwise, x).double())


def test_the_depthwise_setting_is_checked_and_named() -> None:
    with pytest.raises(ValueError, match=r"device\.depthwise='analog': expected one of crossbar, digital"):
        DeviceConfig(kind="cim", depthwise="analog")
    with pytest.raises(ValueError, match="crossbar settings need device=cim"):
        DeviceConfig(kind="integer", depthwise="digital")
    assert DeviceConfig(kind="cim", rows=128, depthwise="digital").label == "cim-r128-dwdigital"
    assert "depthwise" in dataclasses.asdict(Crossbar().ideal())  # part of the layout ADCs calibrate on


def test_a_digital_depthwise_layer_has_no_dac_range() -> None:
    """``dac_range=percentile`` calibrates the DACs of the layers on arrays only: with ``depthwise=digital``
    a depthwise layer has none (and no row in ``dac_ranges.csv``)."""
    from resnet8ptq.device.evaluate import dac_ranges
    from resnet8ptq.device.graph import IntegerModel

    rng = np.random.default_rng(15)
    depthwise = grouped_layer(rng, 4, 4, 1)
    model = IntegerModel("t", "x", depthwise.input_quant, "half_to_even", [depthwise])
    images = rng.uniform(-6, 6, (8, 7, 7, 4)).astype(np.float32)
    settings = {"kind": "cim", "dac_range": "percentile", "dac_percentile": 90.0}
    assert set(dac_ranges(model, DeviceConfig(**settings), images)) == {"grouped"}
    assert dac_ranges(model, DeviceConfig(**settings, depthwise="digital"), images) == {}

"""DAC ranges (resnet8ptq.device.dac): the calibrated clip of each layer's inputs against hand computations,
the crossbar applying it, the input cycles it saves, and its settings' validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.dac import InputProfile, clipped_range
from resnet8ptq.device.executor import Ideal
from tests.unit.test_device import centred_input, conv_layer

pytestmark = pytest.mark.device


def test_the_clip_is_the_smallest_power_of_two_range_holding_the_percentile() -> None:
    counts = np.zeros(256, np.int64)  # inputs 0..255
    counts[:40] = 1000  # 40,000 inputs below 40
    counts[200] = 3  # 3 outliers: 0.0075 % of all
    assert clipped_range(0, 255, counts, 99.99) == (0, 63)  # 39 needs 6 bits
    assert clipped_range(0, 255, counts, 100.0) == (0, 255)  # 200 needs all 8
    signed = np.zeros(256, np.int64)  # inputs -128..127
    signed[128 - 5 : 128 + 20] = 100  # -5..19
    assert clipped_range(-128, 127, signed, 99.99) == (-32, 31)  # 19 and -5 need 6 signed bits
    with pytest.raises(ValueError, match="no calibration inputs"):
        clipped_range(0, 255, np.zeros(256, np.int64), 99.99)


def test_the_profile_counts_every_input_and_keeps_the_ideal_accumulators() -> None:
    rng = np.random.default_rng(21)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)  # 0..255, as after a ReLU
    profile = InputProfile()
    acc = profile.accumulate(layer, x)
    assert torch.equal(acc, Ideal().accumulate(layer, x))
    expected = np.bincount(x.numpy().astype(np.int64).ravel(), minlength=256)  # centred range 0..255
    assert np.array_equal(profile.counts["conv"].numpy(), expected)


@pytest.mark.parametrize("dac_bits", [8, 1])
def test_the_crossbar_applies_the_clipped_inputs_in_fewer_cycles(dac_bits: int) -> None:
    """With an ideal ADC, a DAC clipped to 0..63 gives the integer device's accumulators of the clipped
    input, in 6 one-bit cycles instead of 8 for a bit-serial DAC."""
    rng = np.random.default_rng(22)
    layer = conv_layer(rng)
    x = centred_input(rng, layer)
    crossbar = Crossbar(rows=64, dac_bits=dac_bits)
    clipped = CrossbarArithmetic(crossbar, dac_ranges={"conv": (0, 63)})
    expected = Ideal().accumulate(layer, x.clamp(0, 63)).double()
    assert torch.equal(clipped.accumulate(layer, x).double(), expected)
    assert not torch.equal(expected, Ideal().accumulate(layer, x).double())


def test_dac_settings_fail_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match=r"device\.dac_range='max'"):
        DeviceConfig(kind="cim", dac_range="max")
    with pytest.raises(ValueError, match=r"device\.dac_percentile=40: expected a percentile in \(50, 100\]"):
        DeviceConfig(kind="cim", dac_range="percentile", dac_percentile=40)
    with pytest.raises(ValueError, match=r"applies to device\.dac_range=percentile only"):
        DeviceConfig(kind="cim", dac_percentile=99.9)
    with pytest.raises(ValueError, match=r"device\.dac_range=percentile with device=integer"):
        DeviceConfig(kind="integer", dac_range="percentile")
    assert DeviceConfig(kind="cim", dac_bits=1, dac_range="percentile").label == "cim-dac1-inp99.99"
    assert Crossbar(dac_range="percentile").ideal().dac_range == "percentile"  # calibration keeps the clip

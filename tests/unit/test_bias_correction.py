"""Device-aware bias correction (resnet8ptq/device/bias_correction.py) on a two-layer synthetic integer
model: a device that adds a known offset per channel gets exactly that offset taken out of each bias (the
second layer measured on the corrected first layer's outputs), after which it computes the ideal model's
logits; on a crossbar with a 3-bit ADC the corrected accumulators' mean error per channel, on the images
measured, is at most half a unit."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
import torch

from resnet8ptq.device.adc import Geometry, LayerSteps
from resnet8ptq.device.bias_correction import ErrorMeter, correct_biases, corrections_table
from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.executor import Arithmetic, Ideal, execute
from resnet8ptq.device.graph import Conv, IntegerModel, Quant
from tests.unit.test_device import conv_layer

pytestmark = pytest.mark.device

QUANT = Quant(1.0, -128, -128, 127)


def conv(rng: np.random.Generator, name: str, source: str, channels_in: int, channels_out: int) -> Conv:
    """test_device's synthetic layer, named into a chain, with unit-scale quantizations."""
    layer = conv_layer(rng, channels_in, channels_out)
    return dataclasses.replace(
        layer, name=name, input=source, output=name, input_quant=QUANT, output_quant=QUANT
    )


def two_layers(seed: int = 0) -> IntegerModel:
    rng = np.random.default_rng(seed)
    layers = [conv(rng, "conv1", "x", 3, 8), conv(rng, "conv2", "conv1", 8, 4)]
    return IntegerModel("test", "x", QUANT, "half_to_even", layers)


def images(n: int = 16, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 6, 6, 3)).astype(np.float32)


class Offset(Arithmetic):
    """Exact accumulators plus a fixed offset per output channel, per layer."""

    OFFSETS: ClassVar[dict[str, np.ndarray]] = {
        "conv1": np.array([3, -2, 0, 7, -5, 1, 0, 40]),
        "conv2": np.array([-9, 4, 0, 2]),
    }

    def accumulate(self, layer: Conv, x: torch.Tensor) -> torch.Tensor:
        acc = Ideal().accumulate(layer, x)
        return acc + torch.tensor(self.OFFSETS[layer.name], dtype=acc.dtype).reshape(1, -1, 1, 1)


def test_a_known_offset_is_taken_out_exactly() -> None:
    model, sample = two_layers(), images()
    corrected, corrections = correct_biases(model, Offset, sample, batch_size=5)
    assert {name: list(c) for name, c in corrections.items()} == {
        name: list(offset) for name, offset in Offset.OFFSETS.items()
    }
    original = {layer.name: layer.bias for layer in model.layers}
    for layer in corrected.layers:
        np.testing.assert_array_equal(layer.bias, original[layer.name] - Offset.OFFSETS[layer.name])
    ideal, _ = execute(model, sample, Ideal())
    on_device, _ = execute(corrected, sample, Offset())
    uncorrected, _ = execute(model, sample, Offset())
    np.testing.assert_array_equal(on_device, ideal)
    assert not np.array_equal(uncorrected, ideal)  # the offsets did move the logits
    table = corrections_table(corrections)
    assert len(table) == 12 and table.loc[7, "correction"] == 40


def test_a_few_bit_adcs_mean_error_is_corrected_to_half_a_unit() -> None:
    model, sample = two_layers(), images(32)
    geometry = Geometry(tiles=1, slices=1, outputs=8)
    steps = {"conv1": LayerSteps.symmetric(geometry, "layer", np.array([2.0**10]), 3)}

    def crossbar() -> Arithmetic:
        return CrossbarArithmetic(Crossbar(adc_bits=3), adc_steps=steps | _ideal_steps(model), effects=[])

    corrected, corrections = correct_biases(model, crossbar, sample, batch_size=8)
    assert np.abs(corrections["conv1"]).max() > 10  # a 3-bit ADC in steps of 2^10 is far from exact
    before, after = ErrorMeter(crossbar(), "conv1"), ErrorMeter(crossbar(), "conv1")
    execute(model, sample, before)
    execute(corrected, sample, after)
    corrected_bias = {layer.name: layer.bias for layer in corrected.layers}["conv1"]
    original_bias = model.layers[0].bias
    # the meter sees accumulators without the bias: the corrected error is the raw error plus the change
    residual = after.mean + (corrected_bias - original_bias)
    assert np.abs(residual).max() <= 0.5
    assert np.abs(before.mean).max() > 10


def _ideal_steps(model: IntegerModel) -> dict[str, LayerSteps]:
    """conv2 read exactly: steps of one unit with enough bits for any of its sums."""
    geometry = Geometry(tiles=1, slices=1, outputs=4)
    return {"conv2": LayerSteps.symmetric(geometry, "layer", np.array([1.0]), 24)}


def test_bias_correction_needs_calibration_images_and_a_crossbar() -> None:
    with pytest.raises(ValueError, match="measures the crossbar on calibration images; none given"):
        correct_biases(two_layers(), Offset, images(0))
    with pytest.raises(ValueError, match=r"device\.bias_correction=True with device=integer"):
        DeviceConfig(kind="integer", bias_correction=True)
    assert DeviceConfig(kind="cim", rows=128, adc_bits=4, bias_correction=True).label.endswith("-bc")


def test_the_systematic_crossbar_keeps_what_every_chip_shares() -> None:
    noisy = Crossbar(rows=64, adc_bits=4, weight_noise=0.02, read_noise=0.01, ir_drop=1.0, adc_inl=0.5)
    noisy = Crossbar(**vars(noisy) | {"drift": "pcm", "t_inference": 3600.0, "adc_offset": 0.3})
    shared = noisy.systematic()
    assert (shared.weight_noise, shared.read_noise, shared.drift, shared.adc_offset) == (
        0.0,
        0.0,
        "none",
        0.0,
    )
    assert (shared.rows, shared.adc_bits, shared.ir_drop, shared.adc_inl) == (64, 4, 1.0, 0.5)

"""Device-aware bias correction (`device.bias_correction=true`): the mean error a crossbar adds to each output
channel's accumulator, measured on the calibration images and taken out of the layer's integer bias.

Bias correction (Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias Correction",
ICCV 2019, its empirical form; `algo=bias_correction` here for the weights' rounding) applied to the device's
error instead: a few-bit ADC clips and rounds every partial sum, and the clipped tail does not average out,
so each channel's accumulator is off by a mean that the digital bias can absorb. Layer by layer, in the
model's order, each conv/dense layer's accumulators on the crossbar are compared with the exact ones on the
same inputs (the device's outputs of the layers before it, already corrected), averaged over the calibration
images and output positions, rounded to an integer, and subtracted from the layer's int32 bias. The result
is still an integer model (the biases are integers; the export carries them).

The crossbar is measured **without its random effects** (programming and read noise, drift, charge loss,
stuck cells, the ADCs' offset, gain and noise: :meth:`~resnet8ptq.device.config.Crossbar.systematic`): what
is corrected is the model's systematic error on this crossbar (its tiles, slices, DAC and ADC ranges, IR
drop, ADC INL), the same for every chip. A programmed chip's own mean error would need that
chip's calibration: not modelled. Cost: one pass of the calibration images per layer, up to that layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from resnet8ptq.device.executor import Arithmetic, Ideal, execute
from resnet8ptq.device.graph import Conv, IntegerModel

INT32 = np.iinfo(np.int32)


class ErrorMeter(Arithmetic):
    """A device's accumulators, passed through; for the layer named ``layer``, the sum of their difference
    from the exact accumulators on the same input, per output channel, and how many outputs it summed."""

    def __init__(self, device: Arithmetic, layer: str) -> None:
        self.device, self.layer = device, layer
        self.total: np.ndarray | None = None
        self.count = 0

    def start_batch(self, first_image: int, images: int) -> None:
        self.device.start_batch(first_image, images)

    def accumulate(self, layer: Conv, x: torch.Tensor) -> torch.Tensor:
        acc = self.device.accumulate(layer, x)
        if layer.name == self.layer:
            error = acc.double() - Ideal().accumulate(layer, x).double()
            total = error.sum(dim=(0, 2, 3)).cpu().numpy()
            self.total = total if self.total is None else self.total + total
            self.count += error.numel() // error.shape[1]
        return acc

    @property
    def mean(self) -> np.ndarray:
        if self.total is None:
            raise RuntimeError(f"Layer {self.layer} was never run: nothing measured.")
        return self.total / self.count


def correct_biases(
    model: IntegerModel, crossbar: Callable[[], Arithmetic], images: np.ndarray, batch_size: int = 500
) -> tuple[IntegerModel, dict[str, np.ndarray]]:
    """``model`` with each conv/dense layer's bias less the crossbar's mean accumulator error on ``images``
    (``crossbar()``: a fresh arithmetic of the crossbar without random effects, one per layer), and each
    layer's correction (int64 per output channel: what was subtracted)."""
    if len(images) == 0:
        raise ValueError(
            "device.bias_correction=true measures the crossbar on calibration images; none given."
        )
    corrections: dict[str, np.ndarray] = {}
    layers = list(model.layers)
    for index, layer in enumerate(layers):
        if not isinstance(layer, Conv):
            continue
        meter = ErrorMeter(crossbar(), layer.name)
        execute(dataclasses.replace(model, layers=layers[: index + 1]), images, meter, batch_size)
        correction = np.rint(meter.mean).astype(np.int64)
        bias = np.clip(layer.bias.astype(np.int64) - correction, INT32.min, INT32.max).astype(np.int32)
        layers[index] = dataclasses.replace(layer, bias=bias)
        corrections[layer.name] = correction
    return dataclasses.replace(model, layers=layers), corrections


def corrections_table(corrections: dict[str, np.ndarray]) -> pd.DataFrame:
    """One row per layer and output channel: the integer subtracted from its bias
    (``device/bias_corrections.csv``)."""
    return pd.DataFrame(
        [
            {"layer": name, "channel": channel, "correction": int(value)}
            for name, values in corrections.items()
            for channel, value in enumerate(values)
        ]
    )

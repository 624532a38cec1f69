"""DAC ranges: the full scale of the inputs a crossbar's rows are driven with, per layer.

A layer's input is the centred activation x - x_zp, integers in the quantized range (:func:`.cim.input_range`,
0 .. 255 after a ReLU). ``device.dac_range``:

* ``full``: the DAC spans the whole quantized range; every input is applied as it is (8 input bits);
* ``percentile``: the full scale is calibrated on the calibration images, as aihwkit-lightning calibrates its
  tiles' ``input_range`` from data: the (100 - q)-th and q-th percentiles of the layer's inputs
  (q = ``device.dac_percentile``), widened to the smallest two's-complement (or unsigned) range of m bits that
  holds them. Inputs beyond it are clipped to its ends. The step stays one unit of the quantized input
  (an integer model's input has no finer step), so the DAC keeps every value below the clip and drops the
  top bits: a bit-serial DAC then needs ceil(m / dac_bits) cycles instead of ceil(8 / dac_bits).

The inputs are profiled on the ideal integer device (exact accumulators, no ADC): each layer's histogram of
integer inputs, exact (one bin per value).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from resnet8ptq.device.executor import Ideal, execute
from resnet8ptq.device.mapping import dac_window, input_range, value_bits

if TYPE_CHECKING:
    import pandas as pd

    from resnet8ptq.device.graph import Conv, IntegerModel


class InputProfile(Ideal):
    """The ideal integer device, counting every conv/dense layer's input integers on the way (one bin per
    value of the layer's quantized input range)."""

    def __init__(self) -> None:
        self.counts: dict[str, torch.Tensor] = {}

    def accumulate(self, layer: Conv, x: torch.Tensor) -> torch.Tensor:
        low, high = input_range(layer)
        # integers 0 .. high - low: as bytes where they fit (bincount reads them ~10x faster than int64)
        index = (x - low).to(torch.uint8 if high - low < 256 else torch.int64).reshape(-1)
        counts = torch.bincount(index, minlength=high - low + 1).cpu()
        self.counts[layer.name] = self.counts.get(layer.name, 0) + counts
        return super().accumulate(layer, x)


def profiled_inputs(
    model: IntegerModel, images: np.ndarray, profiles: dict[tuple, object], batch_size: int, every: int = 1
) -> InputProfile:
    """The conv/dense layers' input counts on ``images[::every]`` (the ideal integer device), kept in
    ``profiles`` for the next device run of the same model and images."""
    key = ("inputs",) if every == 1 else ("inputs", every)
    if key not in profiles:
        profile = InputProfile()
        execute(model, images[::every], profile, batch_size=batch_size)
        profiles[key] = profile
    return profiles[key]  # type: ignore[return-value]


def clipped_range(low: int, high: int, counts: np.ndarray, percentile: float) -> tuple[int, int]:
    """The DAC range of one layer: the (100 - q)-th and q-th percentiles of its inputs (``counts`` per value
    from ``low`` to ``high``), widened to the smallest m-bit range holding both (two's complement when the
    lower one is negative, else unsigned), within [low, high]."""
    cumulative = np.cumsum(counts)
    total = cumulative[-1]
    if total == 0:
        raise ValueError("no calibration inputs were profiled for a layer: the DAC range needs them.")
    lower = low + int(np.argmax(cumulative > np.floor(total * (100.0 - percentile) / 100.0)))
    upper = low + int(np.argmax(cumulative >= np.ceil(total * percentile / 100.0)))
    bits, signed = value_bits(lower, upper)
    span = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return max(low, span[0]), min(high, span[1])


def dac_ranges(model: IntegerModel, profile: InputProfile, percentile: float) -> dict[str, tuple[int, int]]:
    """Every conv/dense layer's DAC range (:func:`clipped_range`) from its profiled inputs."""
    return {
        layer.name: clipped_range(*input_range(layer), profile.counts[layer.name].numpy(), percentile)
        for layer in model.convs
    }


def dac_table(model: IntegerModel, ranges: dict[str, tuple[int, int]], dac_bits: int) -> pd.DataFrame:
    """Every layer's DAC (the run's ``device/dac_ranges.csv``): its quantized input range, the DAC's range and
    bits, the inputs' cycles at ``dac_bits`` per cycle, before and after the clip; the layers of ``ranges``
    (those on the crossbar's arrays: :func:`~resnet8ptq.device.evaluate.dac_ranges`)."""
    import pandas as pd

    rows = []
    for layer in (layer for layer in model.convs if layer.name in ranges):
        full = input_range(layer)
        clip = dac_window(layer, ranges)
        full_bits, bits = value_bits(*full)[0], value_bits(*clip)[0]
        rows.append(
            {
                "layer": layer.name,
                "input_low": full[0],
                "input_high": full[1],
                "dac_low": clip[0],
                "dac_high": clip[1],
                "input_bits": full_bits,
                "dac_input_bits": bits,
                "cycles_full": -(-full_bits // dac_bits),
                "cycles": -(-bits // dac_bits),
            }
        )
    return pd.DataFrame(rows)

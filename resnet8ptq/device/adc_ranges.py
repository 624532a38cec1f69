"""ADC range rules: from a layer's partial sums on the calibration images (:class:`.adc.PartialSumProfile`)
or from the array's worst case to its ADCs (:class:`.adc.LayerSteps`), per layer, tile or column.

The range rules (``device.adc_range``; the field's names beside them) give [low, high]:

* ``max`` (formerly ``calibrated``): the smallest and largest partial sums seen on the calibration sample
  (CrossSim's ``MAX`` calibration); symmetric: the largest |sum|;
* ``percentile``: the (100 - q)-th and q-th percentiles of the sums, q = ``adc_percentile`` (CrossSim's
  default for bit-sliced arrays: 99.99), clipping the rarest sums; symmetric: the q-th percentile of |sum|;
* ``mse``: the step and window that minimise the ADC's squared error (rounding plus clipping) over the
  calibration partial sums: a search over steps (every power of two, or 32 per octave for ``free``) and, for
  an asymmetric window, its position (CrossSim searches clipping percentiles for the least L1 error;
  NeuroSim V1.5 calibrates by histogram);
* ``worst_case``: ± the tile's largest possible sum, rows × the largest input digit × the largest cell level
  (nothing ever saturates; the same for every column of a tile);
* ``granular``: a step of one unit (the ADC reads small sums exactly; CrossSim's ``GRANULAR``), the window
  following from the bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from resnet8ptq.device.adc import (
    BINS,
    Geometry,
    LayerSteps,
    PartialSumProfile,
    adc_top,
    codes,
    cover,
    magnitude_edges,
    signed_edges,
    window_for,
)

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar

FREE_STEPS_PER_OCTAVE = 32


@dataclass(frozen=True)
class AdcRule:
    """How a layer's ADCs are set: their resolution (``bits``), the range rule (``device.adc_range``), one
    range per ``granularity`` (layer, tile, column), the code ``window`` (symmetric, asymmetric), the ``step``
    (pow2, free) and the ``percentile`` rule's q. No defaults: the crossbar's are written once, in
    :class:`~resnet8ptq.device.config.Crossbar` (:meth:`of`)."""

    bits: int
    rule: str
    granularity: str
    window: str
    step: str
    percentile: float

    @classmethod
    def of(cls, crossbar: Crossbar, rule: str) -> AdcRule:
        """A crossbar's ADC settings (``crossbar.adc_bits`` set) with range rule ``rule``."""
        c = crossbar
        return cls(c.adc_bits, rule, c.adc_granularity, c.adc_window, c.adc_step, c.adc_percentile)


def percentile_range(
    low: np.ndarray, high: np.ndarray, counts: np.ndarray, percentile: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per group, the (100 - q)-th and q-th percentiles of the sums: the outer edges of the bins where the
    cumulative count reaches them (exact in the integer bins), within the smallest and largest sum."""
    edge_low, edge_high = signed_edges()
    cumulative = np.cumsum(counts, axis=1)
    total = cumulative[:, -1:]
    upper = (cumulative >= np.ceil(total * percentile / 100.0)).argmax(axis=1)
    lower = (cumulative > np.floor(total * (100.0 - percentile) / 100.0)).argmax(axis=1)
    return np.maximum(edge_low[lower], low), np.minimum(edge_high[upper], high)


def magnitude_percentile(largest: np.ndarray, counts: np.ndarray, percentile: float) -> np.ndarray:
    """Per group, the q-th percentile of |sum| from the signed histogram, within the largest |sum|."""
    _, edge_high = magnitude_edges()
    magnitude = counts[:, BINS:].copy()
    magnitude[:, 1:] += counts[:, : BINS - 1][:, ::-1]  # -|v| in bin BINS - 1 - m joins |v| in bin m
    cumulative = np.cumsum(magnitude, axis=1)
    upper = (cumulative >= np.ceil(cumulative[:, -1:] * percentile / 100.0)).argmax(axis=1)
    return np.minimum(edge_high[upper], largest)


def range_steps(low: np.ndarray, high: np.ndarray, geometry: Geometry, adc: AdcRule) -> LayerSteps:
    """The ADCs that cover [low, high] per group."""
    width = 2 * np.maximum(np.abs(low), np.abs(high)) if adc.window == "symmetric" else high - low
    steps = cover(width, adc.bits, adc.window, adc.step)
    code_min, code_max = window_for(low, high, steps, adc.bits, adc.window)
    return LayerSteps(geometry, adc.granularity, steps, code_min, code_max)


def least_error(counts: np.ndarray, low: float, high: float, adc: AdcRule) -> tuple[float, int]:
    """One group's (step, first code) of least squared ADC error over its signed histogram: every power of
    two (``pow2``), or 4 steps per octave, then :data:`FREE_STEPS_PER_OCTAVE` around the best (``free``);
    for an asymmetric window, 65 positions of the window for each step."""
    adc_bits, window = adc.bits, adc.window
    error = AdcError(counts, adc_bits, window)
    k = codes(adc_bits, window)
    span = max(high - low, 1.0) if window == "asymmetric" else 2 * max(abs(low), abs(high), 0.5)
    widest = max(span / k, 1.0)
    if adc.step == "pow2":
        return error.best(np.exp2(np.arange(0, np.ceil(np.log2(widest) - 1e-12) + 1)), low, high)[1:]
    octaves = np.log2(widest)

    def search(exponents: np.ndarray) -> tuple[float, float, int]:
        return error.best(
            np.unique(cover(widest * np.exp2(-exponents) * k, adc_bits, window, "free")), low, high
        )

    coarse = search(np.arange(0, np.floor(octaves * 4) + 1) / 4)
    centre = np.log2(widest / coarse[1])
    fine = search(np.clip(centre + np.arange(-8, 9) / FREE_STEPS_PER_OCTAVE, 0, octaves))
    return min(coarse, fine, key=lambda found: found[0])[1:]


class AdcError:
    """The squared ADC error of a step and window over one group's signed histogram.

    A bin's sums are taken at its centre; a bin's rounding error is exact at the centre where the step is at
    least 4 bin widths (a Riemann sum) and step²/12 where the bin is wider. The per-bin rounding errors are
    summed cumulatively, so every window position costs two look-ups; clipping beyond the window is
    Σ n (v - edge)², from cumulative sums of n, n·v and n·v²."""

    POSITIONS = 65  # window positions tried per step (asymmetric)

    def __init__(self, counts: np.ndarray, adc_bits: int, window: str) -> None:
        edge_low, edge_high = signed_edges()
        used = counts > 0
        self.v = ((edge_low + edge_high) / 2)[used]
        self.w = (edge_high - edge_low)[used]
        self.n = counts[used].astype(np.float64)
        self.s0, self.s1, self.s2 = (
            np.concatenate([[0.0], np.cumsum(self.n * self.v**p)]) for p in (0, 1, 2)
        )
        self.adc_bits, self.window = adc_bits, window

    def at(self, step: float, low: float, high: float) -> tuple[float, float, int]:
        """(least error, step, first code) at ``step`` over the window positions."""
        return self.best(np.array([float(step)]), low, high)

    def best(self, steps: np.ndarray, low: float, high: float) -> tuple[float, float, int]:
        """(least error, its step, its first code) over ``steps`` and the window positions."""
        v, n, s0, s1, s2 = self.v, self.n, self.s0, self.s1, self.s2
        k = codes(self.adc_bits, self.window)
        s = np.asarray(steps, np.float64)[:, None]
        rounding = np.where(4 * self.w[None, :] > s, s * s / 12, (v - np.round(v / s) * s) ** 2)
        r = np.concatenate([np.zeros((len(s), 1)), np.cumsum(n * rounding, axis=1)], axis=1)
        if self.window == "symmetric":
            firsts = np.full((len(s), 1), -adc_top(self.adc_bits), dtype=np.float64)
        else:
            lowest, highest = np.floor(low / s), np.ceil(high / s) - k
            fraction = np.linspace(0.0, 1.0, self.POSITIONS)[None, :]
            firsts = np.round(np.minimum(lowest, highest) + fraction * np.abs(highest - lowest))
        bottom, top = firsts * s, (firsts + k) * s
        i = np.searchsorted(v, bottom, side="left")  # bins below the window: read as its bottom
        j = np.searchsorted(v, top, side="right")  # bins above the window: read as its top
        below = s2[i] - 2 * bottom * s1[i] + bottom**2 * s0[i]
        above = (s2[-1] - s2[j]) - 2 * top * (s1[-1] - s1[j]) + top**2 * (s0[-1] - s0[j])
        error = below + above + np.take_along_axis(r, j, 1) - np.take_along_axis(r, i, 1)
        at = np.unravel_index(int(error.argmin()), error.shape)
        return float(error[at]), float(s[at[0], 0]), int(firsts[at])


def calibrated_steps(profile: PartialSumProfile, adc: AdcRule) -> dict[str, LayerSteps]:
    """Every profiled layer's ADCs by a calibrated rule (``max``, ``percentile``, ``mse``)."""
    result = {}
    for name, geometry in profile.geometry.items():
        low, high, counts = profile.grouped(name, adc.granularity)
        if adc.rule == "max":
            result[name] = range_steps(low, high, geometry, adc)
        elif adc.rule == "percentile":
            if adc.window == "symmetric":
                high = magnitude_percentile(np.maximum(np.abs(low), np.abs(high)), counts, adc.percentile)
                low = -high
            else:
                low, high = percentile_range(low, high, counts, adc.percentile)
            result[name] = range_steps(low, high, geometry, adc)
        elif adc.rule == "mse":
            found = [least_error(c, lo, hi, adc) for c, lo, hi in zip(counts, low, high, strict=True)]
            steps = np.array([s for s, _ in found])
            first = np.array([f for _, f in found], dtype=np.int64)
            last = first + codes(adc.bits, adc.window)
            result[name] = LayerSteps(geometry, adc.granularity, steps, first, last)
        else:
            raise ValueError(f"device.adc_range={adc.rule!r} is not calibrated from partial sums.")
    return result


def fixed_steps(geometry: Geometry, full_scale: float | None, adc: AdcRule) -> LayerSteps:
    """Every group of a layer over ± ``full_scale`` (``worst_case``), or at a step of one unit with the window
    around zero (``granular``: ``full_scale`` None)."""
    groups = geometry.groups(adc.granularity)
    if full_scale is None:
        steps = np.ones(groups)
        low = np.full(groups, -float(codes(adc.bits, adc.window)) / 2)
        code_min, code_max = window_for(low, -low, steps, adc.bits, adc.window)
        return LayerSteps(geometry, adc.granularity, steps, code_min, code_max)
    low, high = np.full(groups, -float(full_scale)), np.full(groups, float(full_scale))
    return range_steps(low, high, geometry, adc)

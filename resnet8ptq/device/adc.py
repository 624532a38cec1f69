"""ADC ranges: each ADC's step and code window, set from the partial sums of the ideal crossbar on the
calibration images (or from the array's worst case), per layer, per row tile or per column.

A ``b``-bit ADC reads a partial sum p as the code round(p / step), half to even, clamped to its window of
codes ``[code_min, code_max]``; the digital side takes code · step. The window (``device.adc_window``):

* ``symmetric``: a signed ADC, codes -(2^(b-1) - 1) .. 2^(b-1) - 1, zero at code 0 (aihwkit's ``out_bound``
  is such a symmetric full scale);
* ``asymmetric``: all 2^b codes over the calibrated range [low, high], the window's first code chosen with
  the range (CrossSim calibrates an ADC's (min, max) range): a column whose sums are mostly positive spends
  no codes on negative values it never sees. The offset is a whole number of steps, so the reading stays
  code · step.

The range rules (``device.adc_range``) that set [low, high] are in :mod:`.adc_ranges`.

Granularity (``device.adc_granularity``): ``layer`` (one range per layer), ``tile`` (one per row tile, all
of its columns), ``column`` (one per physical column: tile × weight slice × output channel, as aihwkit's
per-channel output scaling and NeuroSim's ``adc_axis``). Input (DAC) slices share their column's ADC.

Step (``device.adc_step``): ``pow2``, the smallest power of two whose window covers the range (the digital
side shifts: every reading an integer); or ``free``, the range divided by the codes, held as a fixed-point
number with :data:`STEP_FRACTION_BITS` fraction bits (never below one unit) and folded into the digital side
as a multiplier (:mod:`.cim` adds the products with that many fraction bits and rounds once).

Calibration sees the partial sums of the *ideal* crossbar (same tiles and slices, exact ADC, no noise) and
keeps, per column, the smallest and largest sum and a histogram of the sums (:class:`PartialSumProfile`):
exact integer bins for |sum| < 2^10, then :data:`BINS_PER_OCTAVE` bins per octave (relative width at most
1.6 %), mirrored for negative sums: a percentile is exact below 1,024 and within 1.6 % above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    import pandas as pd

STEP_FRACTION_BITS = 8
"""Fraction bits of a ``free`` ADC step in the digital rescale (a step is M / 2^8, M an integer)."""

EXACT_BINS = 1024  # |sum| < 2^10: one bin per integer
BINS_PER_OCTAVE = 64
OCTAVES = 30  # up to 2^40: beyond any partial sum of an 8-bit network
BINS = EXACT_BINS + OCTAVES * BINS_PER_OCTAVE
"""Bins of |sum|; the signed histogram has 2 × BINS: negative sums mirrored below, then 0 and positive."""


def magnitude_edges() -> tuple[np.ndarray, np.ndarray]:
    """Each |sum| bin's (low, high) edges; integer bins hold one value (low == high)."""
    exact = np.arange(EXACT_BINS, dtype=np.float64)
    k = np.arange(OCTAVES * BINS_PER_OCTAVE)
    octave, sub = np.divmod(k, BINS_PER_OCTAVE)
    base = EXACT_BINS * np.exp2(octave)
    low = base * (1 + sub / BINS_PER_OCTAVE)
    high = base * (1 + (sub + 1) / BINS_PER_OCTAVE)
    return np.concatenate([exact, low]), np.concatenate([exact, high])


def signed_edges() -> tuple[np.ndarray, np.ndarray]:
    """The signed histogram's (low, high) edges, ascending: -|sum| bins reversed, then the |sum| bins."""
    low, high = magnitude_edges()
    return np.concatenate([-high[::-1], low]), np.concatenate([-low[::-1], high])


FLOAT_BITS = {torch.float32: (torch.int32, 23, 127), torch.float64: (torch.int64, 52, 1023)}
"""Each float type's integer view, mantissa bits and exponent bias (IEEE 754)."""
SUB_BITS = BINS_PER_OCTAVE.bit_length() - 1
"""The mantissa's top bits that number a bin within its octave (BINS_PER_OCTAVE = 2^SUB_BITS)."""


def magnitude_bin(magnitude: torch.Tensor) -> torch.Tensor:
    """The |sum| bin of each magnitude (an integer-valued float32/float64 tensor, >= 0), in the matching
    integer type: the integer itself below 2^10, else its octave's bin (linear in the mantissa), read from the
    float's bits: with |sum| = 1.f · 2^e, (exponent, top SUB_BITS bits of f) is one integer, shifted out of
    them, and the bin is EXACT_BINS + (e - 10) · BINS_PER_OCTAVE + those bits of f."""
    int_type, mantissa_bits, bias = FLOAT_BITS[magnitude.dtype]
    octave_and_sub = magnitude.view(int_type) >> (mantissa_bits - SUB_BITS)
    logarithmic = octave_and_sub + (EXACT_BINS - ((bias + 10) << SUB_BITS))
    index = torch.where(magnitude < EXACT_BINS, magnitude.to(int_type), logarithmic)
    return index.clamp_(0, BINS - 1)


def signed_bin(values: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """The signed histogram's bin of each integer-valued sum (float32/float64), in the matching integer type;
    ``exact``: every |sum| is below 2^10 (its bin is itself, no logarithm needed). A negative sum's bin,
    BINS - 1 - index, is BINS + (index XOR -1)."""
    int_type = FLOAT_BITS[values.dtype][0]
    magnitude = values.abs()
    index = magnitude.to(int_type) if exact else magnitude_bin(magnitude)
    return (index ^ (values < 0).to(int_type).neg_()) + BINS


@dataclass(frozen=True)
class Geometry:
    """How a layer's partial sums are laid out: ``tiles`` × ``slices`` (weight cells) × ``outputs`` columns,
    in that order on dim 1 of the crossbar's partial-sum tensor."""

    tiles: int
    slices: int
    outputs: int

    @property
    def columns(self) -> int:
        return self.tiles * self.slices * self.outputs

    def groups(self, granularity: str) -> int:
        return {"layer": 1, "tile": self.tiles, "column": self.columns}[granularity]

    def group_of_column(self, granularity: str) -> np.ndarray:
        """The range group of every column (dim-1 index) of the partial sums."""
        column = np.arange(self.columns)
        if granularity == "layer":
            return np.zeros_like(column)
        if granularity == "tile":
            return column // (self.slices * self.outputs)
        return column

    def index_table(self, granularity: str) -> dict[str, list[int | None]]:
        """The (tile, cell slice, output column) each group stands for; ``None`` where it spans them all."""
        groups = self.groups(granularity)
        if granularity != "column":
            tiles = list(range(groups)) if granularity == "tile" else [None]
            return {"tile": tiles, "cell_slice": [None] * groups, "column": [None] * groups}
        tile, rest = np.divmod(np.arange(self.columns), self.slices * self.outputs)
        cell_slice, column = np.divmod(rest, self.outputs)
        return {"tile": tile.tolist(), "cell_slice": cell_slice.tolist(), "column": column.tolist()}


@dataclass(frozen=True)
class LayerSteps:
    """One layer's ADCs, one per range group (``granularity``): the step in units of the partial sum and the
    window of codes; the reading is step · clamp(round(p / step), code_min, code_max)."""

    geometry: Geometry
    granularity: str
    steps: np.ndarray  # (groups,) float64: integers for pow2 steps, multiples of 2^-8 for free ones
    code_min: np.ndarray  # (groups,) int64
    code_max: np.ndarray  # (groups,) int64
    layer_key: str = ""  # learned steps: the weights they were learned with (graph.weight_key)

    @classmethod
    def symmetric(cls, geometry: Geometry, granularity: str, steps: np.ndarray, adc_bits: int) -> LayerSteps:
        """ADCs of a symmetric window (codes ±(2^(b-1) - 1)) at ``steps``."""
        top = np.full(len(steps), adc_top(adc_bits), dtype=np.int64)
        return cls(geometry, granularity, np.asarray(steps, np.float64), -top, top)

    def per_column(self, values: np.ndarray) -> np.ndarray:
        """``values`` (one per group) for every column (dim 1) of the partial sums."""
        return values[self.geometry.group_of_column(self.granularity)]

    @property
    def integral(self) -> bool:
        """Every step a whole number: the readings are integers."""
        return bool(np.all(self.steps == np.round(self.steps)))

    def to_record(self) -> dict[str, object]:
        """As plain JSON values (:meth:`from_record` reads them back exactly: steps are dyadic)."""
        g = self.geometry
        return {
            "geometry": [g.tiles, g.slices, g.outputs],
            "granularity": self.granularity,
            "steps": self.steps.tolist(),
            "code_min": self.code_min.tolist(),
            "code_max": self.code_max.tolist(),
            "layer_key": self.layer_key,
        }

    @classmethod
    def from_record(cls, record: dict[str, object]) -> LayerSteps:
        return cls(
            Geometry(*record["geometry"]),
            record["granularity"],
            np.asarray(record["steps"], np.float64),
            np.asarray(record["code_min"], np.int64),
            np.asarray(record["code_max"], np.int64),
            record.get("layer_key", ""),
        )


class PartialSumProfile:
    """Per layer and column of the ideal crossbar's partial sums on the calibration sample: the smallest and
    largest sum and the signed histogram (:func:`signed_bin`)."""

    def __init__(self) -> None:
        self.geometry: dict[str, Geometry] = {}
        self.low: dict[str, torch.Tensor] = {}
        self.high: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}

    def add(self, name: str, geometry: Geometry, partial: torch.Tensor) -> None:
        """Add a batch of one layer's partial sums (slices·N, columns, H', W'), in place of their layout (no
        transposed copy)."""
        values = partial.detach()
        dims = [0, *range(2, values.dim())]
        low, high = (v.to(torch.float64).cpu() for v in (values.amin(dim=dims), values.amax(dim=dims)))
        shape = [1, geometry.columns] + [1] * (values.dim() - 2)
        offsets = (torch.arange(geometry.columns, device=values.device) * (2 * BINS)).reshape(shape)
        exact = max(-float(low.min()), float(high.max())) < EXACT_BINS  # every sum in an integer bin
        index = (signed_bin(values, exact) + offsets).reshape(-1)
        counts = torch.bincount(index, minlength=geometry.columns * 2 * BINS).reshape(-1, 2 * BINS).cpu()
        if name in self.counts:
            self.low[name] = torch.minimum(self.low[name], low)
            self.high[name] = torch.maximum(self.high[name], high)
            self.counts[name] += counts
        else:
            self.geometry[name], self.counts[name] = geometry, counts
            self.low[name], self.high[name] = low, high

    def grouped(self, name: str, granularity: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(smallest sum, largest sum, signed histogram (groups, 2 × BINS)) per group at ``granularity``."""
        group = torch.from_numpy(self.geometry[name].group_of_column(granularity))
        groups = self.geometry[name].groups(granularity)
        counts = torch.zeros((groups, 2 * BINS), dtype=torch.int64).index_add_(0, group, self.counts[name])
        low = torch.zeros(groups, dtype=torch.float64).scatter_reduce_(
            0, group, self.low[name], reduce="amin", include_self=False
        )
        high = torch.zeros(groups, dtype=torch.float64).scatter_reduce_(
            0, group, self.high[name], reduce="amax", include_self=False
        )
        return low.numpy(), high.numpy(), counts.numpy()


def codes(adc_bits: int, window: str) -> int:
    """Steps from the window's first code to its last: 2^b - 2 (symmetric: ±(2^(b-1) - 1)), 2^b - 1."""
    return 2**adc_bits - (2 if window == "symmetric" else 1)


def adc_top(adc_bits: int) -> int:
    """The largest code of a symmetric ``adc_bits`` ADC: 2^(b-1) - 1."""
    return 2 ** (adc_bits - 1) - 1


def cover(width: np.ndarray, adc_bits: int, window: str, step: str) -> np.ndarray:
    """The step whose window of codes spans ``width`` (high - low; symmetric: twice the largest |sum|): the
    smallest power of two (``pow2``), or width / codes in fixed point with :data:`STEP_FRACTION_BITS`
    fraction bits (``free``); at least one unit."""
    ratio = np.maximum(np.asarray(width, np.float64) / codes(adc_bits, window), 1.0)
    if step == "pow2":
        return np.exp2(np.ceil(np.log2(ratio) - 1e-12))
    unit = 2.0**STEP_FRACTION_BITS
    return np.maximum(np.round(ratio * unit), unit) / unit


def window_for(
    low: np.ndarray, high: np.ndarray, steps: np.ndarray, adc_bits: int, window: str
) -> tuple[np.ndarray, np.ndarray]:
    """The codes (min, max) of each group's window for the range [low, high] at ``steps``: ± the top code
    (symmetric), or 2^b codes centred on the range (asymmetric)."""
    n = codes(adc_bits, window)
    if window == "symmetric":
        top = np.full(len(steps), adc_top(adc_bits), dtype=np.int64)
        return -top, top
    first = np.round((low + high) / (2 * steps) - n / 2).astype(np.int64)
    return first, first + n


def adc_table(steps: dict[str, LayerSteps]) -> pd.DataFrame:
    """Every ADC as a table (the run's ``device/adc_steps.csv``): layer, granularity, the group's index, the
    tile, cell slice and output column it stands for (empty where it spans them), its step, its window of
    codes and the range of sums it reads without saturating (code_min · step .. code_max · step)."""
    import pandas as pd

    frames = []
    for name, layer in steps.items():
        index = layer.geometry.index_table(layer.granularity)
        frames.append(
            pd.DataFrame(
                {
                    "layer": name,
                    "granularity": layer.granularity,
                    "group": range(len(layer.steps)),
                    **{key: pd.array(values, dtype="Int64") for key, values in index.items()},
                    "adc_step": layer.steps,
                    "code_min": layer.code_min,
                    "code_max": layer.code_max,
                    "range_low": layer.code_min * layer.steps,
                    "range_high": layer.code_max * layer.steps,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)

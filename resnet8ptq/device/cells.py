"""A crossbar's cells as the arithmetic reads them: noisy (non-integer) cells in fixed point, cut into integer
digits whose convolutions are exact, and aihwkit's global drift compensation from the cells before and after
their drift (:mod:`resnet8ptq.device.cim` reads them)."""

from __future__ import annotations

import math

import torch

CELL_FRACTION_BITS = 16
"""Cells that are not integers (a noisy chip's: programming noise, drift, charge loss) are held in fixed
point, to 2^-16 of a level: far below those effects (aihwkit's PCM programming noise alone is about 1 % of
the range, 2.5 levels of an 8-bit cell), and read as integer digits whose convolutions are exact in float32
and are added in a fixed order, so a noisy chip reads the same on every kernel (CPU or GPU), in a few
float32 convolutions rather than one float64 convolution (several times slower on a CPU)."""


def cell_digits(cells: torch.Tensor, digit_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``cells`` (float64) rounded half to even to 2^-:data:`CELL_FRACTION_BITS` of a level and cut into
    signed ``digit_bits``-bit digits, lowest first: (digits (D, *cells.shape), integers in float64; their
    significance (D,), powers of two): Σ_d digit_d · significance_d = the rounded cells, exactly."""
    fixed = torch.round(cells * 2.0**CELL_FRACTION_BITS)
    sign, magnitude = torch.sign(fixed), fixed.abs()
    count = max(1, math.ceil(int(magnitude.max()).bit_length() / digit_bits))
    base, digits = 2.0**digit_bits, []
    for _ in range(count):
        digit = torch.remainder(magnitude, base)  # integers below 2^53: exact
        digits.append(sign * digit)
        magnitude = (magnitude - digit) / base
    significance = [2.0 ** (digit_bits * d - CELL_FRACTION_BITS) for d in range(count)]
    return torch.stack(digits), torch.tensor(significance, dtype=torch.float64)


def drift_compensation(programmed: list[torch.Tensor], drifted: list[tuple[torch.Tensor, int]]) -> float:
    """aihwkit's ``GlobalDriftCompensation`` for one layer: alpha = mean |y| of a known read right after
    programming over the same read at t_inference. Its read is one input at a time (one-hot inputs: the
    identity), whose outputs are the weights the cells hold, Σ_s cells_s·2^shift_s:
    alpha = Σ|W(t0)| / Σ|W(t)|, the cells after the ``program`` effects against after the ``perturb``
    effects. The digital side multiplies the layer's column sums by alpha."""
    before = sum(cells * 2.0**shift for cells, (_, shift) in zip(programmed, drifted, strict=True))
    after = sum(cells * 2.0**shift for cells, shift in drifted)
    now = float(after.abs().sum())
    return float(before.abs().sum()) / now if now else 1.0

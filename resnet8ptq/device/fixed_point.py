"""Integer requantization as TFLite and gemmlowp do it: a real scale as a 32-bit fixed-point multiplier and a
power-of-two shift, applied with a rounding doubling high multiply and a rounding right shift.

These are TFLite's ``QuantizeMultiplier``, ``SaturatingRoundingDoublingHighMul``, ``RoundingDivideByPOT`` and
``MultiplyByQuantizedMultiplier`` (tensorflow/lite/kernels/internal/common.h, quantization_util.cc, in the
default "double rounding" build), vectorized over int64 numpy arrays. Written out here because no library
exposes them to Python; the integer executor checks them bit for bit against LiteRT's reference kernels.

The functions take numpy int64 arrays or torch int64 tensors alike (operators only, ``where`` by type), so the
executor runs them in torch and a numpy reader of the exported parameters can call the same arithmetic.
"""

from __future__ import annotations

from typing import Any

import numpy as np

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def quantize_multiplier(real: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """``real`` (float64, >= 0) as (multiplier, shift) with real ≈ multiplier · 2^(shift - 31), the multiplier
    an int32 in [2^30, 2^31) (0 for a zero scale): TFLite's ``QuantizeMultiplier`` (frexp, then the
    fraction rounded half away from zero to 31 bits)."""
    real = np.atleast_1d(np.asarray(real, np.float64))
    if np.any(real < 0) or not np.all(np.isfinite(real)):
        raise ValueError(f"A requantization scale must be finite and >= 0, got {real}.")
    fraction, shift = np.frexp(real)
    multiplier = np.floor(fraction * 2**31 + 0.5).astype(np.int64)  # fraction >= 0: half away from zero
    carry = multiplier == 2**31
    multiplier = np.where(carry, multiplier // 2, multiplier)
    shift = np.where(carry, shift + 1, shift).astype(np.int64)
    underflow = shift < -31  # TFLite flushes such tiny scales to zero
    multiplier = np.where((real == 0) | underflow, 0, multiplier)
    shift = np.where((real == 0) | underflow, 0, shift)
    return multiplier, shift


Int = Any  # an int64 numpy array or torch tensor (or a Python int)


def _where(condition: Int, a: Int, b: Int) -> Int:
    if isinstance(condition, np.ndarray | np.bool_ | bool):
        return np.where(condition, a, b)
    import torch  # only for torch tensors, which means torch is loaded already

    return torch.where(condition, a, b)


def saturating_rounding_doubling_high_mul(a: Int, b: Int) -> Int:
    """gemmlowp's ``SaturatingRoundingDoublingHighMul``: the high 32 bits of 2·a·b, rounded to nearest (ties
    away from zero). ``b`` is a multiplier from :func:`quantize_multiplier` (>= 0), so the one overflow case
    (both INT32_MIN) cannot occur."""
    product = a * b
    nonnegative = product >= 0
    magnitude = _where(nonnegative, product + (1 << 30), (1 << 30) - 1 - product)  # |product + nudge|
    return _where(nonnegative, magnitude >> 31, -(magnitude >> 31))  # C's division: toward zero


def rounding_divide_by_pot(x: Int, exponent: Int) -> Int:
    """gemmlowp's ``RoundingDivideByPOT``: x / 2^exponent rounded to nearest, ties away from zero."""
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def multiply_by_quantized_multiplier(x: Int, multiplier: Int, shift: Int) -> Int:
    """TFLite's ``MultiplyByQuantizedMultiplier`` (int32 input): x · multiplier · 2^(shift - 31), rounded
    twice as TFLite does (the doubling high multiply, then the rounding shift). ``multiplier`` and ``shift``
    (int64) broadcast against ``x`` (per channel: shaped to the channel axis)."""
    left = shift * (shift > 0)
    right = -shift * (shift < 0)
    high = saturating_rounding_doubling_high_mul(x * (1 << left), multiplier)
    return rounding_divide_by_pot(high, right)


def multiply_by_quantized_multiplier_single_rounding(x: Int, multiplier: Int, shift: Int) -> Int:
    """The single-rounding form (TFLite's ``TFLITE_SINGLE_ROUNDING``, which LiteRT's reference
    FULLY_CONNECTED int8 kernel matches bit for bit here): (x · multiplier + 2^(30 - shift)) >> (31 - shift),
    i.e. x · multiplier · 2^(shift - 31) rounded half up."""
    total = 31 - shift
    return (x * multiplier + (1 << (total - 1))) >> total


ROUNDINGS = {
    "double": multiply_by_quantized_multiplier,
    "single": multiply_by_quantized_multiplier_single_rounding,
}
"""The requantization roundings by name (:attr:`resnet8ptq.device.graph.Conv.rounding`)."""


def effective_scale(multiplier: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """The real scale a (multiplier, shift) pair stands for: multiplier · 2^(shift - 31)."""
    return np.asarray(multiplier, np.float64) * np.exp2(np.asarray(shift, np.float64) - 31)

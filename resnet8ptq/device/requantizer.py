"""The requantizer's multiplier width (``device.requantizer_bits``): a chip whose requantizer multiplies the
accumulator by a ``bits``-bit fixed-point multiplier instead of TFLite/gemmlowp's 32-bit one.

Every (multiplier, shift) pair of the integer model (each conv/dense output's, a fused residual's, an add's
three, an average pool's) keeps the top ``bits - 1`` bits of its Q31 multiplier (in [2^30, 2^31)), rounded
half away from zero, the lower bits zero. The executor's doubling high multiply of the accumulator by that
multiplier is then exactly the ``bits``-bit multiplier's product shifted, so the device computes what such a
requantizer computes, bit for bit; at 32 bits the model is unchanged (the integer device stays exact against
the toolchains). Not narrowed: the free-step ADC's own fixed-point multiplier (``device.adc_step=free``,
:mod:`.cim`). The chip's cost prices the requantizer as an accumulator_bits x requantizer_bits multiplier
(:mod:`resnet8ptq.components.costs`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from resnet8ptq.device.graph import Add, AveragePool, Conv, IntegerModel

FULL_BITS = 32
"""TFLite/gemmlowp's multiplier width (``QuantizeMultiplier``: an int32)."""


def narrow_multiplier(multiplier: np.ndarray | int, shift: np.ndarray | int, bits: int) -> tuple:
    """``multiplier`` (>= 0, from :func:`~resnet8ptq.device.fixed_point.quantize_multiplier`) kept to its top
    ``bits - 1`` bits, rounded half away from zero; a rounding that carries to 2^31 halves it and adds one to
    ``shift``. Scalars in, scalars out (Python ints); arrays in, int64 arrays out."""
    scalar = np.ndim(multiplier) == 0
    multiplier, shift = np.asarray(multiplier, np.int64), np.asarray(shift, np.int64)
    drop = FULL_BITS - bits
    if drop > 0:
        kept = ((multiplier + (1 << (drop - 1))) >> drop) << drop
        carry = kept >= 1 << (FULL_BITS - 1)
        multiplier, shift = np.where(carry, kept >> 1, kept), np.where(carry, shift + 1, shift)
    return (int(multiplier), int(shift)) if scalar else (multiplier, shift)


def with_requantizer_bits(model: IntegerModel, bits: int) -> IntegerModel:
    """``model`` with every requantization multiplier narrowed to ``bits`` bits (``model`` itself at 32)."""
    if bits >= FULL_BITS:
        return model
    layers = []
    for layer in model.layers:
        if isinstance(layer, Conv):
            multiplier, shift = narrow_multiplier(layer.multiplier, layer.shift, bits)
            residual = layer.residual
            if residual is not None:
                narrowed = narrow_multiplier(residual.multiplier, residual.shift, bits)
                residual = replace(residual, multiplier=narrowed[0], shift=narrowed[1])
            layer = replace(layer, multiplier=multiplier, shift=shift, residual=residual)
        elif isinstance(layer, Add):
            pairs = [
                narrow_multiplier(m, s, bits)
                for m, s in zip(layer.input_multipliers, layer.input_shifts, strict=True)
            ]
            output = narrow_multiplier(layer.output_multiplier, layer.output_shift, bits)
            layer = replace(
                layer, input_multipliers=tuple(m for m, _ in pairs), input_shifts=tuple(s for _, s in pairs),
                output_multiplier=output[0], output_shift=output[1],
            )  # fmt: skip
        elif isinstance(layer, AveragePool) and not layer.rounding_divide:
            multiplier, shift = narrow_multiplier(layer.multiplier, layer.shift, bits)
            layer = replace(layer, multiplier=multiplier, shift=shift)
        layers.append(layer)
    note = f"requantizer multipliers narrowed to {bits} bits (device.requantizer_bits)"
    return replace(model, layers=layers, notes=[*model.notes, note])

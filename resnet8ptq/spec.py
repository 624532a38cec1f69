"""The value types every layer of the package shares: one quantization configuration (:class:`QuantSpec`),
what a saved model's layers hold (:class:`LayerPrecision`, :class:`TensorRange`) and how far they are from
FP32 (:class:`LayerError`, :func:`sqnr_db`). On the ground floor: it imports only the `dtype` and `calib`
schemas."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from resnet8ptq.calibration import CalibConfig
from resnet8ptq.dtype import DtypeConfig

if TYPE_CHECKING:
    from resnet8ptq.metrics import Metric

RAISED_BITS = 16
"""The width of a raised layer (mixed precision, ``raised_layers``): 16-bit activations or weights."""


@dataclass(frozen=True)
class QuantSpec:
    """One quantization configuration: the `dtype` and `calib` groups, `per_channel`, `reduce_range`, and the
    layers raised to 16 bits (`raised_layers`: layer names as in ``analysis/layer_sqnr.csv``)."""

    dtype: DtypeConfig
    calib: CalibConfig
    per_channel: bool = False
    reduce_range: bool = False  # weights in 7 bits (ORT's reduce_range): no u8s8 saturation without VNNI
    raised_layers: tuple[str, ...] = ()
    layer_bits: tuple[tuple[str, int], ...] = ()
    """Layers of their own width below 16 bits (`layer_bits`: (layer name, bits) pairs; weights 2..8,
    activations 4..8), e.g. a budgeted mix: they take precedence over ``dtype.*_bits``."""
    learned_ranges: tuple[TensorRange, ...] = ()
    """Activation ranges an `algo` step learned (block reconstruction): the backend stores these tensors
    with them instead of calibrating them."""

    def __post_init__(self) -> None:
        if self.reduce_range and self.dtype.weight_bits != 8:
            raise ValueError(
                f"reduce_range=true with dtype.weight_bits={self.dtype.weight_bits}: reduce_range means "
                f"7-bit weights; set dtype.weight_bits=7 instead, or reduce_range=false."
            )
        repeated = sorted({name for name in self.raised_layers if self.raised_layers.count(name) > 1})
        if repeated:
            raise ValueError(f"raised_layers names {repeated} more than once.")
        both = sorted(set(self.raised_layers) & {name for name, _ in self.layer_bits})
        if both:
            raise ValueError(f"layer_bits and raised_layers both name {both}: give each layer one width.")
        wrong = [f"{name}={bits}" for name, bits in self.layer_bits if not 2 <= bits <= 8]
        if wrong:
            raise ValueError(f"layer_bits {wrong}: expected 2..8 bits (16-bit layers are raised_layers).")

    def raised_storage(self, kind: str) -> str:
        """The storage type of a raised ``kind`` ("activation"/"weight") layer: activations int16 or uint16,
        with the signedness of the activation type; weights int16, symmetric (ORT's rule for signed weights;
        torch cannot dequantize uint16 weights per channel)."""
        if kind == "weight":
            return f"int{RAISED_BITS}"
        return self.dtype.activation.replace("8", str(RAISED_BITS))


@dataclass(frozen=True)
class TensorRange:
    """The calibrated range of one activation tensor."""

    tensor: str
    min: float
    max: float


class EvaluationImages(Protocol):
    """The images an evaluation target runs on: every test image (model input) with its label, the
    calibration sample, MLPerf Tiny's performance subset (indices of the test set). A run's
    :class:`resnet8ptq.inputs.RunInputs` is one."""

    test_images: np.ndarray
    test_labels: np.ndarray
    calibration_images: np.ndarray
    perf_subset: np.ndarray
    metric: Metric  # how the model's outputs are scored


@dataclass(frozen=True)
class LayerError:
    """Signal-to-quantization-noise ratio of one layer's weights or activations against the FP32 model."""

    layer: str
    kind: str  # "weight" | "activation"
    sqnr_db: float


def sqnr_db(signal_sq: float, noise_sq: float) -> float:
    """ORT's ``compute_signal_to_quantization_noice_ratio`` from sums of squares accumulated batch by batch
    (memory stays flat): 20·log10(‖x‖ / ‖x - y‖), each norm floored at float64 eps, so identical tensors
    give a large finite value (~300 dB and up) rather than infinity."""
    eps = float(np.finfo(float).eps)
    return 20 * math.log10(max(math.sqrt(signal_sq), eps) / max(math.sqrt(noise_sq), eps))


@dataclass(frozen=True)
class LayerPrecision:
    """How one layer of a saved quantized model is stored, read back from the file."""

    layer: str  # the name the per-layer SQNR analysis uses
    kind: str  # "weight" | "activation"
    dtype: str  # storage type, e.g. "int8", "uint16"
    bits: int  # activations: the width of the range the quantize op clamps to; weights: the fewest bits
    # holding every stored integer


def base_precision(layers: Sequence[LayerPrecision], kind: str) -> tuple[str, int]:
    """(storage type, bits) of the narrowest ``kind`` layers: the model's own width, apart from the raised
    layers. Raises if the model holds no such layer."""
    found = [layer for layer in layers if layer.kind == kind]
    if not found:
        raise RuntimeError(f"The quantized model has no quantized {kind}: it is not quantized.")
    narrowest = min(found, key=lambda layer: layer.bits)
    return narrowest.dtype, narrowest.bits

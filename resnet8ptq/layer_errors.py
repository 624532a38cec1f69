"""Per-layer SQNR of a quantized model against its FP32 model, written once for every toolchain.

NNCF's pattern: the measurement once, over a narrow backend primitive. A backend gives the tensor pairs to
compare (:class:`TensorPairs`: each quantized activation, batch by batch, and each conv/dense weight, as
(FP32 tensor, the quantized model's dequantized tensor)); :func:`measure` sums Σx² and Σ(x - y)² per layer in
float64 over the batches (memory stays flat) and turns them into dB with :func:`resnet8ptq.spec.sqnr_db`
(ORT's ``compute_signal_to_quantization_noice_ratio``, zero error floored at eps rather than infinite)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np

from resnet8ptq.spec import LayerError, sqnr_db

Pair = tuple[np.ndarray, np.ndarray]
"""(the FP32 model's tensor, the quantized model's tensor dequantized), of the same shape."""


class TensorPairs(Protocol):
    """What a backend gives :func:`measure`."""

    def activations(self, images: np.ndarray) -> Iterator[dict[str, Pair]]:
        """Batch by batch over ``images``, each compared activation's pair by layer name."""
        ...

    def weights(self) -> dict[str, Pair]:
        """Each conv/dense weight's pair by layer name (asked for after :meth:`activations`)."""
        ...


class SquareSums:
    """Σx² and Σ(x - y)² per layer, in float64, added pair by pair."""

    def __init__(self) -> None:
        self.sums: dict[str, tuple[float, float]] = {}

    def add(self, layer: str, reference: np.ndarray, measured: np.ndarray) -> None:
        x = np.asarray(reference, dtype=np.float64).ravel()
        error = x - np.asarray(measured, dtype=np.float64).ravel()
        signal, noise = self.sums.get(layer, (0.0, 0.0))
        self.sums[layer] = (signal + float(x @ x), noise + float(error @ error))

    def sqnr(self) -> dict[str, float]:
        return {layer: sqnr_db(*sums) for layer, sums in self.sums.items()}


def tensor_sqnr_db(reference: np.ndarray, measured: np.ndarray) -> float:
    """The SQNR (dB) of one pair of tensors, as :func:`measure` computes it."""
    sums = SquareSums()
    sums.add("", reference, measured)
    return sums.sqnr()[""]


def measure(pairs: TensorPairs, images: np.ndarray) -> list[LayerError]:
    """SQNR (dB) of every activation pair summed over ``images``, then of every weight pair."""
    if len(images) == 0:
        raise ValueError("No images to measure layer errors on.")
    activations = SquareSums()
    for batch in pairs.activations(images):
        for layer, (x, y) in batch.items():
            if np.shape(x) != np.shape(y):
                raise RuntimeError(
                    f"{layer}: the FP32 tensor has shape {np.shape(x)}, the quantized one {np.shape(y)}; the "
                    "models' tensors are matched wrongly."
                )
            activations.add(layer, x, y)
    weights = SquareSums()
    for layer, (x, y) in pairs.weights().items():
        weights.add(layer, x, y)
    return [LayerError(layer, "activation", value) for layer, value in activations.sqnr().items()] + [
        LayerError(layer, "weight", value) for layer, value in weights.sqnr().items()
    ]

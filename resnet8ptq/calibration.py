"""Calibration methods (minmax, entropy/KL, percentile): one meaning for every backend.

The ONNX Runtime backend hands these settings to ORT's own calibrators. Other backends collect the
activations of one tensor with :class:`RangeCollector`, which runs the very same ORT range algorithms
(``MinMaxCalibrater``'s reduction and ``HistogramCollector``) on the same data, so a range differs
between backends only if the activations themselves differ.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from omegaconf import MISSING

METHODS = ("minmax", "entropy", "percentile")


@dataclass
class CalibConfig:
    """The `calib` config group (`conf/calib/*.yaml`): a calibration method and its parameters, validated."""

    method: str = MISSING
    symmetric: bool = False
    num_bins: int | None = None
    num_quantized_bins: int | None = None
    percentile: float | None = None
    batch_size: int = 100

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"calib.method={self.method!r}: expected one of {', '.join(METHODS)}.")
        if self.method in ("entropy", "percentile") and (self.num_bins is None or self.num_bins < 2):
            raise ValueError(f"calib.num_bins={self.num_bins!r}: {self.method} needs >= 2 histogram bins.")
        if self.method == "entropy" and not (
            self.num_quantized_bins is not None and 2 <= self.num_quantized_bins < self.num_bins
        ):
            raise ValueError(
                f"calib.num_quantized_bins={self.num_quantized_bins!r} must be >= 2 and smaller than "
                f"calib.num_bins={self.num_bins}; equal values make KL calibration collapse to min-max."
            )
        if self.method == "percentile" and not (
            self.percentile is not None and 0.0 < self.percentile <= 100.0
        ):
            raise ValueError(f"calib.percentile={self.percentile!r}: expected a value in (0, 100].")
        if self.batch_size < 1:
            raise ValueError(f"calib.batch_size={self.batch_size!r}: expected a positive integer.")

    def ort_method(self):
        """The ``onnxruntime.quantization.CalibrationMethod`` for this spec."""
        from onnxruntime.quantization import CalibrationMethod

        return {
            "minmax": CalibrationMethod.MinMax,
            "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile,
        }[self.method]

    def ort_options(self) -> dict[str, object]:
        """``extra_options`` for ``onnxruntime.quantization.create_calibrator``."""
        options: dict[str, object] = {"symmetric": self.symmetric}
        if self.method in ("entropy", "percentile"):
            options["num_bins"] = self.num_bins
        if self.method == "entropy":
            options["num_quantized_bins"] = self.num_quantized_bins
        if self.method == "percentile":
            options["percentile"] = self.percentile
        return options


def batches(images: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    """Consecutive slices of ``images``, in order: the calibration order shared by all backends."""
    for start in range(0, len(images), batch_size):
        yield images[start : start + batch_size]


class RangeCollector:
    """Collects one tensor's values batch by batch, then computes its range with ORT's algorithms."""

    def __init__(self, spec: CalibConfig) -> None:
        self.spec = spec
        self._batches: list[np.ndarray] = []
        self._min: float = np.inf
        self._max: float = -np.inf

    def add(self, values: np.ndarray) -> None:
        """Record one batch of the tensor's values (float32)."""
        values = np.asarray(values, dtype=np.float32)
        if self.spec.method == "minmax":
            self._min = min(self._min, float(np.nanmin(values)))
            self._max = max(self._max, float(np.nanmax(values)))
        else:
            self._batches.append(values.copy())

    @property
    def empty(self) -> bool:
        return not self._batches and self._min == np.inf

    def compute(self) -> tuple[float, float]:
        """The calibrated (min, max), exactly as ORT's calibrator for the same method computes it."""
        if self.empty:
            raise ValueError("No calibration data was collected for this tensor.")
        if self.spec.method == "minmax":
            if self.spec.symmetric:
                bound = max(abs(self._min), abs(self._max))
                return -bound, bound
            return self._min, self._max
        from onnxruntime.quantization.calibrate import HistogramCollector

        collector = HistogramCollector(
            method=self.spec.method,
            symmetric=self.spec.symmetric,
            num_bins=self.spec.num_bins,
            num_quantized_bins=self.spec.num_quantized_bins,
            percentile=self.spec.percentile,
            scenario="same",
        )
        with contextlib.redirect_stdout(io.StringIO()):  # ORT prints progress lines
            collector.collect({"t": self._batches})
            low, high = collector.compute_collection_result()["t"][:2]
        return float(low), float(high)

"""Calibration methods (minmax, entropy/KL, percentile, mse): one meaning for every backend.

The ONNX Runtime backend hands these settings to ORT's own calibrators. Other backends collect the
activations of one tensor with :class:`RangeCollector`, which runs the very same ORT range algorithms
(``MinMaxCalibrater``'s reduction and ``HistogramCollector``) on the same data, so a range differs
between backends only if the activations themselves differ. Both take the entropy threshold from
:mod:`resnet8ptq.entropy_threshold`: ORT's search, vectorised, with the same results.

``mse`` is not one of ORT's methods: ORT's ``HistogramCollector`` collects the histogram (as for entropy),
and :func:`mse_range` picks the range whose quantization to the tensor's own integer grid (its bits, ORT's
scale/zero-point formula) has the least squared error over that histogram: the range setting the low-bit
PTQ literature starts from (Nagel et al., "A White Paper on Neural Network Quantization", 2021, sec. 3.4;
AIMET's and TensorRT's "mse"). Written here because ORT, which both backends calibrate with, has none.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from omegaconf import MISSING

METHODS = ("minmax", "entropy", "percentile", "mse")
WEIGHT_METHODS = ("minmax", "mse")
MSE_STEPS = 100
"""Candidate range ends per side for ``mse``: the calibrated min and max times k/100, k = 1..100."""


@dataclass
class CalibConfig:
    """The `calib` config group (`conf/calib/*.yaml`): a calibration method and its parameters, validated."""

    method: str = MISSING  # minmax | entropy | percentile | mse: how activation ranges are chosen
    symmetric: bool = False  # activation ranges symmetric about zero
    num_bins: int | None = None  # the histogram's bins (entropy, percentile, mse)
    num_quantized_bins: int | None = None  # entropy: the quantized bins KL divergence compares against
    percentile: float | None = None  # percentile: the share of values (0-100] the range keeps
    batch_size: int = 100  # calibration images per forward pass
    weights: str = "minmax"  # conv/gemm weight ranges: their min/max, or `mse` (per-channel clipping)

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_METHODS:
            raise ValueError(f"calib.weights={self.weights!r}: expected one of {', '.join(WEIGHT_METHODS)}.")
        if self.method not in METHODS:
            raise ValueError(f"calib.method={self.method!r}: expected one of {', '.join(METHODS)}.")
        if self.method in ("entropy", "percentile", "mse") and (self.num_bins is None or self.num_bins < 2):
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
            "mse": CalibrationMethod.Entropy,  # its calibrator collects the histogram mse_range reads
        }[self.method]

    def ort_options(self) -> dict[str, object]:
        """``extra_options`` for ``onnxruntime.quantization.create_calibrator``."""
        options: dict[str, object] = {"symmetric": self.symmetric}
        if self.method in ("entropy", "percentile", "mse"):
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

    def compute(self, qrange: tuple[int, int] | None = None) -> tuple[float, float]:
        """The calibrated (min, max), exactly as ORT's calibrator for the same method computes it; for
        ``mse``, :func:`mse_range` over ORT's histogram for the integer range ``qrange`` (required)."""
        if self.empty:
            raise ValueError("No calibration data was collected for this tensor.")
        if self.spec.method == "mse" and qrange is None:
            raise ValueError("calib=mse needs the tensor's integer range (qmin, qmax).")
        if self.spec.method == "minmax":
            if self.spec.symmetric:
                bound = max(abs(self._min), abs(self._max))
                return -bound, bound
            return self._min, self._max
        from resnet8ptq.entropy_threshold import HistogramCollector

        collector = HistogramCollector(
            method="entropy" if self.spec.method == "mse" else self.spec.method,
            symmetric=self.spec.symmetric,
            num_bins=self.spec.num_bins,
            num_quantized_bins=self.spec.num_quantized_bins,
            percentile=self.spec.percentile,
            scenario="same",
        )
        with contextlib.redirect_stdout(io.StringIO()):  # ORT prints progress lines
            collector.collect({"t": self._batches})
            if self.spec.method == "mse":
                return mse_range(collector.histogram_dict["t"], qrange, self.spec.symmetric)
            low, high = collector.compute_collection_result()["t"][:2]
        return float(low), float(high)


def mse_range(
    histogram: tuple, qrange: tuple[int, int], symmetric: bool = False, steps: int = MSE_STEPS
) -> tuple[float, float]:
    """The (min, max) whose quantization to ``qrange`` has the least squared error over ``histogram``.

    ``histogram`` is an entry of ORT's ``HistogramCollector.histogram_dict`` (counts, bin edges, data min,
    data max, threshold); every bin's count sits at its centre. Candidates are the data's min and max scaled
    by k/``steps``, k = 1..``steps``, each end on its own (ends at 0 stay at 0), or together when
    ``symmetric``; each is quantized with ORT's formula (range widened to hold 0, scale (max - min) /
    (qmax - qmin), zero point round(qmin - min / scale), round half to even, clip). Of equal errors the last
    candidate (the larger ends) wins."""
    counts, edges, data_min, data_max = (np.asarray(part, np.float64) for part in histogram[:4])
    used = counts > 0
    centres = ((edges[:-1] + edges[1:]) / 2)[used]
    return _least_error(centres, counts[used], float(data_min), float(data_max), qrange, symmetric, steps)


def mse_weight_range(
    values: np.ndarray, qrange: tuple[int, int], symmetric: bool, steps: int = MSE_STEPS
) -> tuple[float, float]:
    """``calib.weights=mse``: the clipping range of one weight (or one output channel of it) with the least
    squared error over its own values, by :func:`mse_range`'s search (every value counted once)."""
    values = np.asarray(values, np.float64).ravel()
    ones = np.ones_like(values)
    return _least_error(values, ones, float(values.min()), float(values.max()), qrange, symmetric, steps)


def _least_error(
    centres: np.ndarray,
    weights: np.ndarray,
    data_min: float,
    data_max: float,
    qrange: tuple[int, int],
    symmetric: bool,
    steps: int,
) -> tuple[float, float]:
    """:func:`mse_range`'s search over values ``centres`` counted ``weights`` times."""
    qmin, qmax = qrange
    fractions = np.arange(1, steps + 1) / steps
    if symmetric:
        bound = max(abs(float(data_min)), abs(float(data_max)))
        candidates = [(-bound * f, bound * f) for f in fractions]
    else:
        lows = float(data_min) * fractions if data_min < 0 else [float(min(data_min, 0.0))]
        highs = float(data_max) * fractions if data_max > 0 else [float(max(data_max, 0.0))]
        candidates = [(low, high) for low in lows for high in highs]
    ends = np.array(candidates)
    low, high = np.minimum(ends[:, 0], 0.0), np.maximum(ends[:, 1], 0.0)
    scale = (high - low) / (qmax - qmin)
    scale = np.where(scale > 0, scale, 1.0)
    zero_point = np.clip(np.round(qmin - low / scale), qmin, qmax)
    errors = np.empty(len(candidates))
    for start in range(0, len(candidates), 256):  # candidates x bins at most 256 x num_bins at a time
        s, z = scale[start : start + 256, None], zero_point[start : start + 256, None]
        dequantized = (np.clip(np.round(centres / s) + z, qmin, qmax) - z) * s
        errors[start : start + 256] = ((centres - dequantized) ** 2 * weights).sum(axis=1)
    best = int(np.flatnonzero(errors <= errors.min())[-1])  # the last of equals: the larger ends
    return float(candidates[best][0]), float(candidates[best][1])

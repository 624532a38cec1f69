"""A model scored on the full test set by its metric (:mod:`resnet8ptq.metrics`: top-1 accuracy, per class
and as a confusion matrix; an autoencoder's AUC), throughput from the same pass, and single-image latency."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from resnet8ptq.backends.base import Model, Predictor
from resnet8ptq.metrics import TOP1, Metric

EVAL_BATCH = 500
LATENCY_RUNS = 100
LATENCY_WARMUP = 10


@dataclass(frozen=True)
class TestSet:
    """The test inputs as the model takes them, their labels, and how the model's outputs are scored."""

    inputs: np.ndarray
    labels: np.ndarray
    metric: Metric = TOP1


@dataclass(frozen=True)
class Evaluation:
    """How a model did on the test set, and how long it took."""

    predictions: np.ndarray  # (N,) per sample (Metric.per_sample): the predicted label, the anomaly score
    labels: np.ndarray  # (N,) true labels
    probabilities: np.ndarray  # (N, ...) the model's outputs (a classifier's: its classes' probabilities)
    eval_seconds: float  # the timed pass, after the warm-up batch
    metric: Metric = TOP1

    @property
    def value(self) -> float:
        """The metric's value, a fraction in [0, 1] (top-1 accuracy, AUC)."""
        return self.metric.value(self.predictions, self.labels)

    @property
    def interval(self) -> tuple[float, float]:
        """The value's 95 % confidence interval."""
        return self.metric.interval(self.predictions, self.labels)

    @property
    def num_classes(self) -> int:
        """The classifier's number of classes (its outputs)."""
        return self.probabilities.shape[1]

    @property
    def correct(self) -> int:
        return int((self.predictions == self.labels).sum())

    @property
    def accuracy(self) -> float:
        """Top-1 accuracy as a fraction in [0, 1]: a classifier's :attr:`value`."""
        if self.metric.name != TOP1.name:
            raise ValueError(f"a model scored by {self.metric.title} has no top-1 accuracy")
        return self.value

    @property
    def confusion(self) -> np.ndarray:
        """(true, predicted) counts."""
        matrix = np.zeros((self.num_classes, self.num_classes), dtype=np.int64)
        np.add.at(matrix, (self.labels, self.predictions), 1)
        return matrix

    @property
    def throughput_img_s(self) -> float:
        """Images per second of the (warmed-up) evaluation pass at batch ``EVAL_BATCH``."""
        return len(self.labels) / self.eval_seconds

    def subset_accuracy(self, indices: np.ndarray) -> float:
        """Top-1 accuracy on the images at ``indices`` (a fraction), from the same predictions."""
        return subset_accuracy(self.predictions, self.labels, indices)

    @property
    def class_accuracy(self) -> np.ndarray:
        """Accuracy of each class (fraction of that class's images predicted correctly; NaN for a class the
        test set has no sample of)."""
        matrix = self.confusion
        counts = matrix.sum(axis=1)
        return np.divide(np.diag(matrix), counts, out=np.full(len(counts), np.nan), where=counts > 0)


def subset_accuracy(predictions: np.ndarray, labels: np.ndarray, indices: np.ndarray) -> float:
    """Top-1 accuracy on the samples at ``indices`` (a fraction); NaN for none (data without MLPerf Tiny's
    performance subset)."""
    if not len(indices):
        return float("nan")
    return float(np.mean(predictions[indices] == labels[indices]))


def evaluate(predict: Predictor, test: TestSet, desc: str = "Evaluating") -> Evaluation:
    """Run ``predict`` over all the ``test`` inputs in batches of ``EVAL_BATCH``, after one untimed warm-up
    batch (lazy initialisation, first-call allocations), so that the pass also measures throughput."""
    images = test.inputs
    predict(images[:EVAL_BATCH])
    probabilities = []
    start = time.perf_counter()
    for begin in tqdm(range(0, len(images), EVAL_BATCH), desc=desc, unit="batch", leave=False):
        probabilities.append(np.asarray(predict(images[begin : begin + EVAL_BATCH])))
    seconds = time.perf_counter() - start
    outputs = np.concatenate(probabilities)
    return scored(outputs, test, seconds)


def scored(outputs: np.ndarray, test: TestSet, seconds: float) -> Evaluation:
    """The evaluation of a model whose outputs on the ``test`` inputs are ``outputs``."""
    per_sample = test.metric.per_sample(outputs, test.inputs)
    return Evaluation(per_sample, np.asarray(test.labels), outputs, seconds, test.metric)


@dataclass(frozen=True)
class Evaluated:
    """A quantized model evaluated on the test set, as the device and microcontroller stages take it (the
    run's own model, or a published one): its name in progress and logs, its file, its reference
    evaluation."""

    name: str
    path: Path
    reference: Evaluation


def measure_latency(predict: Predictor, images: np.ndarray) -> float:
    """Median milliseconds of ``LATENCY_RUNS`` single-image calls (after ``LATENCY_WARMUP`` warm-up calls)."""
    singles = images[: max(LATENCY_RUNS, LATENCY_WARMUP)]
    for image in singles[:LATENCY_WARMUP]:
        predict(image[None])
    timings = []
    for image in singles[:LATENCY_RUNS]:
        start = time.perf_counter()
        predict(image[None])
        timings.append(time.perf_counter() - start)
    return float(np.median(timings)) * 1e3


@dataclass(frozen=True)
class Measured:
    """A model's forms evaluated on the test set (in the order they ran) and the single-image latency of the
    form whose speed counts; ``reused``: read from an earlier run's (:mod:`resnet8ptq.evaluation_cache`)."""

    evaluations: tuple[Evaluation, ...]
    latency_ms_b1: float
    reused: bool = False


Kept = Callable[[Path, Mapping[str, object], TestSet, Callable[[], Measured]], Measured]
"""Where measurements are kept: called with the model's file, its forms, the test set, and how to measure,
it returns an earlier run's measurement of them or measures and keeps it
(:meth:`resnet8ptq.evaluation_cache.EvaluationCache.measured`)."""


@dataclass(frozen=True)
class Baseline:
    """The FP32 model of one backend and how it did on the test set."""

    model: Model
    evaluation: Evaluation
    latency_ms_b1: float
    reused: bool = False  # the evaluation came from an earlier run's


def evaluate_baseline(model: Model, test: TestSet, name: str, kept: Kept | None = None) -> Baseline:
    """The FP32 model's score, throughput and latency on the test set (or an earlier run's, from ``kept``;
    None: measured, nothing kept)."""

    def measure() -> Measured:
        evaluation = evaluate(model.predict, test, desc=f"Evaluating {name}")
        return Measured((evaluation,), measure_latency(model.predict, test.inputs))

    found = measure() if kept is None else kept(model.path, {"fp32": True}, test, measure)
    return Baseline(model, found.evaluations[0], found.latency_ms_b1, found.reused)

"""Accuracy (overall, per class, confusion matrix) on the full test set, throughput from the same pass, and
single-image latency."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from resnet8ptq.backends.base import Model, Predictor

EVAL_BATCH = 500
LATENCY_RUNS = 100
LATENCY_WARMUP = 10


@dataclass(frozen=True)
class Evaluation:
    """What a model got right on the test set, and how long it took."""

    predictions: np.ndarray  # (N,) predicted labels
    labels: np.ndarray  # (N,) true labels
    probabilities: np.ndarray  # (N, 10)
    eval_seconds: float  # the timed pass, after the warm-up batch
    num_classes: int = 10

    @property
    def correct(self) -> int:
        return int((self.predictions == self.labels).sum())

    @property
    def accuracy(self) -> float:
        """Top-1 accuracy as a fraction in [0, 1]."""
        return self.correct / len(self.labels)

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
        return float(np.mean(self.predictions[indices] == self.labels[indices]))

    @property
    def class_accuracy(self) -> np.ndarray:
        """Accuracy of each class (fraction of that class's images predicted correctly)."""
        matrix = self.confusion
        return np.diag(matrix) / matrix.sum(axis=1)


def evaluate(
    predict: Predictor, images: np.ndarray, labels: np.ndarray, desc: str = "Evaluating"
) -> Evaluation:
    """Run ``predict`` over all ``images`` in batches of ``EVAL_BATCH``, after one untimed warm-up batch (lazy
    initialisation, first-call allocations), so that the pass also measures throughput."""
    predict(images[:EVAL_BATCH])
    probabilities = []
    start = time.perf_counter()
    for begin in tqdm(range(0, len(images), EVAL_BATCH), desc=desc, unit="batch", leave=False):
        probabilities.append(np.asarray(predict(images[begin : begin + EVAL_BATCH])))
    seconds = time.perf_counter() - start
    probs = np.concatenate(probabilities)
    return Evaluation(probs.argmax(axis=1), np.asarray(labels), probs, seconds)


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
class Baseline:
    """The FP32 model of one backend and how it did on the test set."""

    model: Model
    evaluation: Evaluation
    latency_ms_b1: float


def evaluate_baseline(model: Model, images: np.ndarray, labels: np.ndarray, name: str) -> Baseline:
    """The FP32 model's accuracy, throughput and latency on the test set."""
    evaluation = evaluate(model.predict, images, labels, desc=f"Evaluating {name}")
    return Baseline(model, evaluation, measure_latency(model.predict, images))

"""Accuracy (overall, per class, confusion matrix) on the full test set, and inference speed."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from resnet8ptq.backends.base import Predictor

EVAL_BATCH = 500
LATENCY_RUNS = 100
LATENCY_WARMUP = 10


@dataclass(frozen=True)
class Evaluation:
    """What a model got right on the test set, and how long it took."""

    predictions: np.ndarray  # (N,) predicted labels
    labels: np.ndarray  # (N,) true labels
    probabilities: np.ndarray  # (N, 10)
    eval_seconds: float
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
    def class_accuracy(self) -> np.ndarray:
        """Accuracy of each class (fraction of that class's images predicted correctly)."""
        matrix = self.confusion
        return np.diag(matrix) / matrix.sum(axis=1)


def evaluate(
    predict: Predictor, images: np.ndarray, labels: np.ndarray, desc: str = "Evaluating"
) -> Evaluation:
    """Run ``predict`` over all ``images`` in batches of ``EVAL_BATCH``."""
    probabilities = []
    start = time.perf_counter()
    for begin in tqdm(range(0, len(images), EVAL_BATCH), desc=desc, unit="batch", leave=False):
        probabilities.append(np.asarray(predict(images[begin : begin + EVAL_BATCH])))
    seconds = time.perf_counter() - start
    probs = np.concatenate(probabilities)
    return Evaluation(probs.argmax(axis=1), np.asarray(labels), probs, seconds)


@dataclass(frozen=True)
class Speed:
    """Inference speed: throughput at batch ``EVAL_BATCH`` and median single-image latency."""

    throughput_img_s: float
    latency_ms_b1: float


def measure_speed(predict: Predictor, images: np.ndarray) -> Speed:
    """Throughput over all ``images`` in batches of ``EVAL_BATCH`` (after one warm-up batch), and the
    median latency of ``LATENCY_RUNS`` single-image calls (after ``LATENCY_WARMUP`` warm-up calls)."""
    predict(images[:EVAL_BATCH])
    start = time.perf_counter()
    for begin in range(0, len(images), EVAL_BATCH):
        predict(images[begin : begin + EVAL_BATCH])
    throughput = len(images) / (time.perf_counter() - start)
    singles = images[: max(LATENCY_RUNS, LATENCY_WARMUP)]
    for image in singles[:LATENCY_WARMUP]:
        predict(image[None])
    timings = []
    for image in singles[:LATENCY_RUNS]:
        start = time.perf_counter()
        predict(image[None])
        timings.append(time.perf_counter() - start)
    return Speed(throughput, float(np.median(timings)) * 1e3)

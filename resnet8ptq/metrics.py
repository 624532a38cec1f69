"""How a model's outputs are scored (the model's ``metric``, conf/model/): top-1 accuracy for a classifier;
for an autoencoder (MLPerf Tiny's anomaly detection), the area under the ROC curve of each sample's anomaly
score over normal (label 0) and anomalous (label 1) samples, as MLPerf's ``01_test.py`` scores it
(``sklearn.metrics.roc_auc_score`` of each audio clip's mean over its frames of their mean squared
reconstruction error). A metric is one class here and one entry in :data:`METRICS`.

Each metric turns the model's outputs into one value per test input (:meth:`Metric.per_sample`: the
predicted class, the anomaly score): what a run's digests, the integer device and TFLite Micro compare with
the reference. Its value is a fraction in [0, 1], higher is better, logged under its own MLflow name
(:attr:`Metric.key`: ``accuracy``, ``auc``).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from resnet8ptq.errors import DataError
from resnet8ptq.statistics import CONFIDENCE, accuracy_interval


class Metric(ABC):
    """How a model's outputs are scored."""

    name: ClassVar[str]  # the model's `metric` setting
    key: ClassVar[str]  # its MLflow metrics' names: `<key>`, `<key>_ci_low`, `<key>_delta`, `<key>_device`
    title: ClassVar[str]  # in words, in logs and reports
    per_class: ClassVar[bool]  # the outputs are classes: per-class accuracy and a confusion matrix apply
    groups: np.ndarray | None = None  # per test input, the scored sample it belongs to (None: itself)

    @abstractmethod
    def per_sample(self, outputs: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        """(N,) one value per sample from the model's ``outputs`` on ``inputs``."""

    def first(self, count: int) -> Metric:
        """This metric over the first ``count`` test inputs only (their ``groups`` cut there)."""
        if self.groups is None:
            return self
        cut = copy.copy(self)
        cut.groups = self.groups[:count]
        return cut

    def samples(self, per_sample: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The scored samples' values and labels (each test input is one, unless the metric pools them)."""
        return np.asarray(per_sample), np.asarray(labels)

    @abstractmethod
    def agree(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """(N,) whether two models' per-sample values agree (the same class; the same score)."""

    @abstractmethod
    def value(self, per_sample: np.ndarray, labels: np.ndarray) -> float:
        """The metric over the samples, a fraction in [0, 1]."""

    @abstractmethod
    def interval(self, per_sample: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
        """The value's 95 % confidence interval (the test set's sampling error)."""

    @abstractmethod
    def classes(self, output_shape: tuple[int, ...]) -> int:
        """How many classes the labels have, for a model of this per-sample output shape."""

    @abstractmethod
    def check(self, input_shape: tuple, output_shape: tuple, labels: np.ndarray, model: str) -> str | None:
        """Why a model of these per-sample shapes cannot be scored on these labels (None: it can)."""


class TopOne(Metric):
    """Top-1 accuracy: the predicted class is the largest output; Wilson's interval."""

    name, key, title, per_class = "top1", "accuracy", "top-1 accuracy", True

    def per_sample(self, outputs: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        return np.asarray(outputs).argmax(axis=1)

    def agree(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        return np.asarray(first) == np.asarray(second)

    def value(self, per_sample: np.ndarray, labels: np.ndarray) -> float:
        return float(np.mean(per_sample == labels))

    def interval(self, per_sample: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
        return accuracy_interval(int(np.sum(per_sample == labels)), len(labels))

    def classes(self, output_shape: tuple[int, ...]) -> int:
        return output_shape[0]

    def check(self, input_shape: tuple, output_shape: tuple, labels: np.ndarray, model: str) -> str | None:
        if len(output_shape) != 1:
            shape = ", ".join(map(str, output_shape))
            return f"{model}: metric=top1 takes an output of shape (N, classes); the model's is (N, {shape})"
        top, classes = (int(labels.max()) if labels.size else -1), output_shape[0]
        if top >= classes:
            return f"{model}: the model has {classes} outputs (classes 0..{classes - 1}); labels reach {top}"
        return None


SCORE_RTOL = 1e-4
"""Two anomaly scores agree within this relative difference (float programs of one model differ in the last
bits of their outputs; one int8 output code of 640 moves a score by more)."""


class ReconstructionAuc(Metric):
    """An autoencoder's AUC: each input's anomaly score is the mean squared error of its reconstruction, a
    sample's the mean of its inputs' (``groups``: the sample of each test input, as MLPerf Tiny scores an
    audio clip by the mean over its frames; None: each input is a sample); the AUC is the Mann-Whitney
    statistic of the anomalous samples' scores over the normal ones' (ties count half, as
    ``roc_auc_score``'s), its interval DeLong's (DeLong, DeLong and Clarke-Pearson, Biometrics 1988; Sun and
    Xu's rank form, IEEE SPL 2014)."""

    name, key, title, per_class = "auc", "auc", "AUC", False

    def __init__(self, groups: np.ndarray | None = None) -> None:
        self.groups = groups

    def samples(self, per_sample: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The scored samples' anomaly scores and labels: each group's mean score and its label."""
        if self.groups is None:
            return np.asarray(per_sample, np.float64), np.asarray(labels)
        _, index = np.unique(self.groups, return_inverse=True)
        scores = np.bincount(index, weights=per_sample) / np.bincount(index)
        first = np.unique(index, return_index=True)[1]
        return scores, np.asarray(labels)[first]

    def per_sample(self, outputs: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        n = len(inputs)
        error = np.asarray(inputs, np.float64).reshape(n, -1) - np.asarray(outputs, np.float64).reshape(n, -1)
        return np.mean(error * error, axis=1)

    def agree(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        return np.isclose(first, second, rtol=SCORE_RTOL, atol=0.0)

    def value(self, per_sample: np.ndarray, labels: np.ndarray) -> float:
        return float(np.mean(_placements(*self.samples(per_sample, labels))[0]))

    def interval(self, per_sample: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
        from scipy.special import ndtri

        anomalous, normal = _placements(*self.samples(per_sample, labels))
        auc = float(np.mean(anomalous))
        variance = np.var(anomalous, ddof=1) / len(anomalous) + np.var(normal, ddof=1) / len(normal)
        half = float(ndtri(0.5 + CONFIDENCE / 2)) * float(np.sqrt(variance))
        return max(auc - half, 0.0), min(auc + half, 1.0)

    def classes(self, output_shape: tuple[int, ...]) -> int:
        return 2  # normal, anomalous

    def check(self, input_shape: tuple, output_shape: tuple, labels: np.ndarray, model: str) -> str | None:
        if None in input_shape or int(np.prod(input_shape)) != int(np.prod(output_shape)):
            return (
                f"{model}: metric=auc scores a reconstruction of the input; the model takes {input_shape}, "
                f"gives {output_shape}"
            )
        found = set(np.unique(labels).tolist())
        if found != {0, 1}:
            return (
                f"{model}: metric=auc needs test labels 0 (normal) and 1 (anomalous), both present; the data "
                f"has {sorted(found)[:5]}"
            )
        return None


def _placements(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's placement values: for each anomalous sample the fraction of normal samples it scores above
    (ties half), and for each normal sample the fraction of anomalous samples scoring above it; the AUC is the
    mean of either (Sun and Xu: from mid-ranks)."""
    from scipy.stats import rankdata

    scores, labels = np.asarray(scores, np.float64), np.asarray(labels)
    anomalous, normal = scores[labels == 1], scores[labels == 0]
    if not len(anomalous) or not len(normal):
        raise DataError("an AUC needs both normal (label 0) and anomalous (label 1) samples")
    every = rankdata(np.concatenate([anomalous, normal]))
    ranks_a, ranks_n = every[: len(anomalous)], every[len(anomalous) :]
    above = (ranks_a - rankdata(anomalous)) / len(normal)
    below = 1.0 - (ranks_n - rankdata(normal)) / len(anomalous)
    return above, below


def roc_points(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve of anomaly ``scores`` (label 1 anomalous): false and true positive rates at every
    threshold, from (0, 0) to (1, 1), tied scores one step (``sklearn.metrics.roc_curve`` without dropping
    collinear points)."""
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    ranked, positive = np.asarray(scores, np.float64)[order], np.asarray(labels)[order] == 1
    last = np.r_[np.flatnonzero(np.diff(ranked)), len(ranked) - 1]  # the last of each run of equal scores
    tp, fp = np.cumsum(positive)[last], np.cumsum(~positive)[last]
    return np.r_[0.0, fp / max(fp[-1], 1)], np.r_[0.0, tp / max(tp[-1], 1)]


TOP1 = TopOne()
METRICS: dict[str, Metric] = {metric.name: metric for metric in (TOP1, ReconstructionAuc())}


def as_accuracy(logged: dict[str, float], name: str) -> dict[str, float]:
    """A run's logged metrics with its metric's family (``auc``, ``auc_device``, ...) under the names of
    top-1 accuracy's (``accuracy``, ``accuracy_device``, ...): what a report that ranks every network by its
    own metric compares (``name``: the run's ``metric`` tag)."""
    key = METRICS[name].key if name in METRICS else TOP1.key
    return {(TOP1.key + n[len(key) :] if n.startswith(key) else n): value for n, value in logged.items()}


def metric(name: str, groups: np.ndarray | None = None) -> Metric:
    """The metric the model's ``metric`` setting names (``groups``: the data's ``test_groups``, which an AUC
    pools by)."""
    if name not in METRICS:
        from resnet8ptq.errors import ConfigError

        raise ConfigError(f"model.metric={name!r}: expected one of {', '.join(METRICS)}.")
    return ReconstructionAuc(groups) if name == "auc" and groups is not None else METRICS[name]

"""How outputs are scored: top-1 accuracy, and an autoencoder's AUC checked against scikit-learn (the
function MLPerf Tiny's anomaly-detection scripts score with) and against DeLong's pairwise definition."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score, roc_curve

from resnet8ptq.errors import ConfigError, DataError
from resnet8ptq.metrics import TOP1, ReconstructionAuc, metric, roc_points

AUC = ReconstructionAuc()


def scores_and_labels(seed: int, ties: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 400)
    scores = rng.normal(size=400) + 0.8 * labels
    return (np.round(scores, 1) if ties else scores), labels


@pytest.mark.parametrize("ties", [False, True])
def test_auc_equals_scikit_learn(ties: bool) -> None:
    scores, labels = scores_and_labels(0, ties)
    assert AUC.value(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_delong_interval_from_the_pairwise_definition() -> None:
    """DeLong's variance from its structural components computed pair by pair (O(n^2)), ties half."""
    scores, labels = scores_and_labels(1, ties=True)
    anomalous, normal = scores[labels == 1], scores[labels == 0]
    kernel = (anomalous[:, None] > normal[None, :]) + 0.5 * (anomalous[:, None] == normal[None, :])
    v10, v01 = kernel.mean(axis=1), kernel.mean(axis=0)
    auc = kernel.mean()
    half = 1.959963984540054 * np.sqrt(v10.var(ddof=1) / len(v10) + v01.var(ddof=1) / len(v01))
    low, high = AUC.interval(scores, labels)
    assert (low, high) == pytest.approx((auc - half, auc + half), abs=1e-12)


def test_roc_points_equal_scikit_learn() -> None:
    scores, labels = scores_and_labels(2, ties=True)
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    ours = roc_points(scores, labels)
    np.testing.assert_allclose(ours[0], fpr)
    np.testing.assert_allclose(ours[1], tpr)


def test_anomaly_score_is_the_mean_squared_reconstruction_error() -> None:
    inputs = np.array([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    outputs = np.array([[0.0, 1.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    np.testing.assert_array_equal(AUC.per_sample(outputs, inputs), [1.0, 0.0])


def test_top1_scores_the_largest_output() -> None:
    outputs = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    predicted = TOP1.per_sample(outputs, np.zeros((3, 4)))
    assert predicted.tolist() == [1, 0, 1]
    assert TOP1.value(predicted, np.array([1, 1, 1])) == pytest.approx(2 / 3)


def test_what_each_metric_refuses() -> None:
    assert AUC.check((640,), (640,), np.array([0, 1, 1]), "m") is None
    assert "reconstruction" in AUC.check((640,), (10,), np.array([0, 1]), "m")
    assert "both present" in AUC.check((640,), (640,), np.array([0, 0]), "m")
    assert "both present" in AUC.check((640,), (640,), np.array([0, 2]), "m")
    assert TOP1.check((32, 32, 3), (10,), np.array([0, 9]), "m") is None
    assert "labels reach 10" in TOP1.check((32, 32, 3), (10,), np.array([10]), "m")
    assert "(N, classes)" in TOP1.check((640,), (5, 128), np.array([0]), "m")
    with pytest.raises(DataError, match="both normal"):
        AUC.value(np.array([0.1, 0.2]), np.array([1, 1]))
    with pytest.raises(ConfigError, match="top1, auc"):
        metric("f1")


def test_scores_agree_within_their_tolerance_classes_exactly() -> None:
    assert AUC.agree(np.array([1.0, 1.0]), np.array([1.0 + 1e-6, 1.01])).tolist() == [True, False]
    assert TOP1.agree(np.array([3, 4]), np.array([3, 5])).tolist() == [True, False]


def test_an_audio_clips_frames_are_one_sample_scored_by_their_mean_error() -> None:
    """MLPerf Tiny's 01_test.py: a clip's score is the mean of its frames' reconstruction errors, the AUC over
    clips."""
    from resnet8ptq.metrics import ReconstructionAuc

    rng = np.random.default_rng(4)
    clips = rng.integers(0, 2, 30)
    groups = np.repeat(np.arange(30), 7)
    frames = rng.normal(size=210) + 0.5 * np.repeat(clips, 7)
    pooled = metric("auc", groups)
    assert isinstance(pooled, ReconstructionAuc) and metric("auc") is not pooled
    expected = roc_auc_score(clips, frames.reshape(30, 7).mean(axis=1))
    assert pooled.value(frames, np.repeat(clips, 7)) == pytest.approx(expected, abs=1e-12)
    assert AUC.value(frames, np.repeat(clips, 7)) != pytest.approx(expected, abs=1e-6)  # frames as samples

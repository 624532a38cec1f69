"""Confidence intervals and paired tests (resnet8ptq.statistics) against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from resnet8ptq.statistics import accuracy_interval, holm, mcnemar, significant


@pytest.mark.parametrize(("correct", "total"), [(8719, 10_000), (8650, 10_000), (0, 200), (200, 200), (7, 9)])
def test_wilson_interval_matches_its_closed_form(correct: int, total: int) -> None:
    z, p = 1.959964, correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    low, high = accuracy_interval(correct, total)
    assert low == pytest.approx(max(centre - half, 0.0), abs=1e-6)
    assert high == pytest.approx(min(centre + half, 1.0), abs=1e-6)
    assert low <= p <= high


def test_wilson_interval_narrows_with_more_images() -> None:
    small = accuracy_interval(87, 100)
    large = accuracy_interval(8700, 10_000)
    assert large[1] - large[0] < (small[1] - small[0]) / 5  # width ~ 1/sqrt(n)
    assert (large[1] - large[0]) * 50 == pytest.approx(0.66, abs=0.01), "±0.66 points near 87% on 10,000"


@pytest.mark.parametrize(("correct", "total"), [(5, 0), (-1, 10), (11, 10)])
def test_wilson_interval_rejects_impossible_counts(correct: int, total: int) -> None:
    with pytest.raises(ValueError, match=r"total=|correct="):
        accuracy_interval(correct, total)


def paired(only_a: int, only_b: int, both: int = 50, neither: int = 5) -> tuple[np.ndarray, np.ndarray]:
    a = np.array([True] * only_a + [False] * only_b + [True] * both + [False] * neither)
    b = np.array([False] * only_a + [True] * only_b + [True] * both + [False] * neither)
    return a, b


def test_mcnemar_counts_only_discordant_images() -> None:
    test = mcnemar(*paired(10, 0))
    assert (test.only_a, test.only_b) == (10, 0)
    assert test.p_value == pytest.approx(2 * 0.5**10)  # exact two-sided binomial
    assert mcnemar(*paired(10, 0, both=5000, neither=900)).p_value == pytest.approx(test.p_value)
    assert mcnemar(*paired(5, 5)).p_value == pytest.approx(1.0)
    assert mcnemar(*paired(0, 0)).p_value == 1.0  # identical predictions: no evidence of a difference
    assert mcnemar(*paired(3, 9)).p_value == pytest.approx(mcnemar(*paired(9, 3)).p_value)


def test_mcnemar_rejects_unpaired_arrays() -> None:
    with pytest.raises(ValueError, match="equally long"):
        mcnemar(np.ones(10, bool), np.ones(9, bool))


def test_holm_adjustment() -> None:
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> monotone: 0.02 0.03 0.06 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]).size == 0
    assert significant(0.049) and not significant(0.05) and not significant(float("nan"))


def test_interval_and_paired_test_agree_with_scipy_binomtest() -> None:
    """The special-function forms give what scipy.stats.binomtest gives (Wilson interval; two-sided p)."""
    from scipy.stats import binomtest

    for correct, total in [(8719, 10_000), (0, 200), (200, 200), (7, 9), (1, 1), (4321, 5000)]:
        expected = binomtest(correct, total).proportion_ci(confidence_level=0.95, method="wilson")
        assert accuracy_interval(correct, total) == pytest.approx((expected.low, expected.high), abs=1e-12)
    for only_a in range(0, 40, 3):
        for only_b in range(0, 40, 5):
            if only_a + only_b:
                expected = binomtest(only_a, only_a + only_b, 0.5).pvalue
                assert mcnemar(*paired(only_a, only_b)).p_value == pytest.approx(expected, rel=1e-9)

"""Is a difference in accuracy real? Confidence intervals of an accuracy and paired tests between two models
evaluated on the same test images.

scipy's special functions do the distributions: the normal quantile of the Wilson interval (``ndtri``) and the
binomial CDF of the exact McNemar test (``bdtr``). Those give the same figures as ``scipy.stats.binomtest``
(its Wilson interval and its two-sided test at p = 0.5; unit-tested against it), whose import takes about
1 s, once in every run's process, against 0.1 s for ``scipy.special``. Holm's correction is a few lines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import bdtr, ndtri

CONFIDENCE = 0.95  # of every interval the runs log and the report shows
ALPHA = 0.05  # significance level of the paired tests (after Holm's correction)


def accuracy_interval(correct: int, total: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of an accuracy of ``correct`` out of ``total`` images (fractions)."""
    if total <= 0:
        raise ValueError(f"an accuracy interval needs at least one image, got total={total}")
    if not 0 <= correct <= total:
        raise ValueError(f"correct={correct} is not between 0 and total={total}")
    z = float(ndtri(0.5 + confidence / 2))
    p, n = correct / total, total
    scale = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / scale
    low = 0.0 if correct == 0 else max(float(centre - half), 0.0)  # exactly 0 / 1 at the ends, not 1e-18
    high = 1.0 if correct == total else min(float(centre + half), 1.0)
    return low, high


@dataclass(frozen=True)
class PairedTest:
    """Exact McNemar test of two models on the same images: only the images where exactly one is right
    count; under "no difference" each of those is equally likely to favour either model."""

    only_a: int  # images model A gets right and model B wrong
    only_b: int  # images model B gets right and model A wrong
    p_value: float  # two-sided


def mcnemar(a_correct: np.ndarray, b_correct: np.ndarray) -> PairedTest:
    """Exact two-sided McNemar test of models A and B from their per-image correctness (boolean arrays over
    the same images, in the same order)."""
    a_correct, b_correct = np.asarray(a_correct, bool), np.asarray(b_correct, bool)
    if a_correct.shape != b_correct.shape or a_correct.ndim != 1:
        raise ValueError(
            "a paired test needs two equally long 1-D arrays, got shapes "
            f"{a_correct.shape} and {b_correct.shape}"
        )
    only_a = int((a_correct & ~b_correct).sum())
    only_b = int((b_correct & ~a_correct).sum())
    discordant = only_a + only_b
    # Two-sided at p = 0.5 (a symmetric distribution): twice the tail beyond the smaller count.
    p_value = 1.0 if discordant == 0 else 2 * float(bdtr(min(only_a, only_b), discordant, 0.5))
    return PairedTest(only_a, only_b, min(p_value, 1.0))


def holm(p_values: list[float] | np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (same order as given): reject where adjusted < ALPHA, and the chance
    of any false "significant" among the family stays below ALPHA."""
    p = np.asarray(p_values, float)
    if p.size == 0:
        return p
    order = np.argsort(p, kind="stable")
    scaled = p[order] * (p.size - np.arange(p.size))
    adjusted = np.minimum(np.maximum.accumulate(scaled), 1.0)
    result = np.empty_like(adjusted)
    result[order] = adjusted
    return result


def significant(p_value: float) -> bool:
    """Whether a (Holm-adjusted) p-value rejects "no difference" at ALPHA; False for a missing one."""
    return bool(np.isfinite(p_value) and p_value < ALPHA)

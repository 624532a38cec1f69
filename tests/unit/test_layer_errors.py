"""The per-layer SQNR routine every backend shares (resnet8ptq.layer_errors): sums over batches equal ORT's
formula on all tensors at once, a zero error is finite, wrongly paired tensors or no images are refused."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from resnet8ptq import layer_errors
from resnet8ptq.layer_errors import Pair


class Fixed:
    """Pairs from arrays: the activations cut into batches of 3 images, one weight."""

    def __init__(self, x: np.ndarray, y: np.ndarray, weight: Pair) -> None:
        self.x, self.y, self.weight = x, y, weight

    def activations(self, images: np.ndarray) -> Iterator[dict[str, Pair]]:
        for start in range(0, len(images), 3):
            yield {"act": (self.x[start : start + 3], self.y[start : start + 3])}

    def weights(self) -> dict[str, Pair]:
        return {"conv": self.weight}


def test_batched_sums_equal_the_formula_on_everything_at_once() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4, 5)).astype(np.float32)  # 8 images: batches of 3, 3 and 2
    y = x + rng.normal(scale=0.01, size=x.shape).astype(np.float32)
    w = rng.normal(size=(6, 3))
    errors = layer_errors.measure(Fixed(x, y, (w, w.round(1))), np.zeros(8))
    by = {(e.layer, e.kind): e.sqnr_db for e in errors}
    x64 = x.astype(np.float64)
    expected = 20 * math.log10(np.linalg.norm(x64) / np.linalg.norm(x64 - y))
    assert by[("act", "activation")] == pytest.approx(expected, abs=1e-9)
    assert by[("conv", "weight")] == pytest.approx(
        20 * math.log10(np.linalg.norm(w) / np.linalg.norm(w - w.round(1)))
    )
    same = layer_errors.measure(Fixed(x, x, (w, w)), np.zeros(8))
    assert all(math.isfinite(e.sqnr_db) and e.sqnr_db > 250 for e in same)  # zero error: floored, not inf


def test_wrong_pairs_and_no_images_are_refused() -> None:
    x = np.ones((4, 2))
    with pytest.raises(RuntimeError, match="act: the FP32 tensor has shape"):
        layer_errors.measure(Fixed(x, np.ones((4, 3)), (x, x)), np.zeros(4))
    with pytest.raises(ValueError, match="No images"):
        layer_errors.measure(Fixed(x, x, (x, x)), np.zeros(0))

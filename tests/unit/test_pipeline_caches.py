"""What a multirun's jobs in one process share: CIFAR-10 read and verified once, and with it each backend's
FP32 baseline evaluated once (its cache keys on the data object, which hashes by identity)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from resnet8ptq import pipeline
from resnet8ptq.backends.base import Model
from resnet8ptq.data import Cifar10


def _clear_caches() -> None:
    for cached in (pipeline.load_dataset, pipeline.test_set, pipeline.fp32_baseline):
        getattr(cached, "cache_clear", lambda: None)()  # a function that lost its cache fails the test


@pytest.fixture(autouse=True)
def _fresh_caches():
    _clear_caches()
    yield
    _clear_caches()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts reads of CIFAR-10 (a small stand-in) by root."""
    counts: Counter = Counter()

    def fake_load(root: Path, download: bool, md5_cache: Path) -> Cifar10:
        counts[str(root)] += 1
        images = np.zeros((20, 32, 32, 3), np.uint8)
        return Cifar10(images, np.arange(20) % 10, images, np.arange(20) % 10, "binary", Path(root))

    monkeypatch.setattr(pipeline, "load_cifar10", fake_load)
    return counts


class _CountingBackend:
    """Just enough of a backend for fp32_baseline: counts its FP32 model loads."""

    NAME = "fake"

    def __init__(self) -> None:
        self.loads = 0

    def load_fp32(self, onnx_path: Path, workdir: Path) -> Model:
        self.loads += 1
        return Model(lambda images: np.full((len(images), 10), 0.1, np.float32), onnx_path, onnx_path)


def test_the_data_is_read_once_per_process_and_root(reads: Counter) -> None:
    first = pipeline.load_dataset("/data/a", False, "/cache")
    assert pipeline.load_dataset("/data/a", False, "/cache") is first
    pipeline.load_dataset("/data/b", False, "/cache")
    assert reads == {"/data/a": 1, "/data/b": 1}


def test_runs_of_one_process_evaluate_each_fp32_baseline_once(reads: Counter, tmp_path: Path) -> None:
    backend = _CountingBackend()
    baselines = [
        pipeline.fp32_baseline(
            backend, tmp_path / "model.onnx", tmp_path, pipeline.load_dataset("/d", False, "/c")
        )
        for _run in range(3)
    ]
    assert backend.loads == 1 and reads == {"/d": 1}
    assert baselines[0] is baselines[1] is baselines[2]

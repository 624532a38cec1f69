"""What a multirun's jobs in one process share (resnet8ptq.shared): CIFAR-10 read and verified once, and with
it each backend's FP32 baseline evaluated once (its key holds the data object, which hashes by identity);
and nothing leaks between two Shared objects, so a test can run configurations side by side."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from resnet8ptq import datasets, inputs, mlperf
from resnet8ptq.backends.base import Model
from resnet8ptq.data import Cifar10
from resnet8ptq.shared import Shared
from resnet8ptq.stages import fp32


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts reads of CIFAR-10 (a small stand-in) by root."""
    counts: Counter = Counter()

    def fake_load(root: Path, download: bool, md5_cache: Path) -> Cifar10:
        counts[str(root)] += 1
        images = np.zeros((20, 32, 32, 3), np.uint8)
        return Cifar10(images, np.arange(20) % 10, images, np.arange(20) % 10, "binary", Path(root))

    monkeypatch.setattr(datasets, "load_cifar10", fake_load)
    monkeypatch.setattr(mlperf, "perf_subset_indices", lambda cache_dir: np.arange(5))
    return counts


def data(root: str) -> OmegaConf:
    """The `data` group's settings for CIFAR-10 under ``root`` (two calibration images per class)."""
    return OmegaConf.create(
        {"name": "cifar10", "root": root, "download": False, "calib_per_class": 2, "seed": 0, "path": None}
    )


def run_inputs(shared: Shared, root: str) -> inputs.RunInputs:
    """A run's inputs from the data under ``root`` (read through ``shared``)."""
    return inputs.run_inputs(OmegaConf.create({"data": data(root), "cache_dir": "/cache"}), shared)


class _CountingBackend:
    """Just enough of a backend for fp32_baseline: counts its FP32 model loads."""

    NAME = "fake"

    def __init__(self) -> None:
        self.loads = 0

    def load_fp32(self, onnx_path: Path, workdir: Path) -> Model:
        self.loads += 1
        return Model(lambda images: np.full((len(images), 10), 0.1, np.float32), onnx_path, onnx_path)


def test_the_data_is_read_once_per_process_and_root(reads: Counter) -> None:
    shared = Shared()
    first = inputs.load_dataset(shared, data("/data/a"), "/cache")
    assert inputs.load_dataset(shared, data("/data/a"), "/cache") is first
    inputs.load_dataset(shared, data("/data/b"), "/cache")
    assert reads == {"/data/a": 1, "/data/b": 1} and shared.kept("dataset") == 2


def test_runs_of_one_process_evaluate_each_fp32_baseline_once(reads: Counter, tmp_path: Path) -> None:
    shared, backend = Shared(), _CountingBackend()
    baselines = [
        fp32.fp32_baseline(
            shared,
            backend,
            tmp_path / "model.onnx",
            tmp_path,
            run_inputs(shared, "/d"),
        )
        for _run in range(3)
    ]
    assert backend.loads == 1 and reads == {"/d": 1}
    assert baselines[0] is baselines[1] is baselines[2]


def test_two_shared_objects_share_nothing(reads: Counter, tmp_path: Path) -> None:
    """Two configurations run side by side in one process, each with its own Shared: each reads its data and
    evaluates its baseline; the quantizations kept for a device sweep are apart too."""
    backend = _CountingBackend()
    first, second = Shared(), Shared()
    for shared in (first, second):
        fp32.fp32_baseline(shared, backend, tmp_path / "model.onnx", tmp_path, run_inputs(shared, "/d"))
    assert reads == {"/d": 2} and backend.loads == 2
    first.quantized.put("key", object())  # type: ignore[arg-type]
    assert second.quantized.get("key") is None and first.quantized.get("key") is not None


def test_the_recent_quantizations_keep_the_newest_two() -> None:
    recent = Shared().quantized
    for key in "abc":
        recent.put(key, key)  # type: ignore[arg-type]
    recent.put("b", "b")  # used again: the newest
    assert [recent.get(key) for key in "abc"] == [None, "b", "c"]
    recent.put("d", "d")
    assert [recent.get(key) for key in "bcd"] == ["b", None, "d"]

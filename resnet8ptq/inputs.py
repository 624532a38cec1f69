"""What one run works on, made once per run from the process's shared data (:mod:`resnet8ptq.shared`):
CIFAR-10 (verified), the test set as model input, the calibration sample, MLPerf Tiny's performance subset
and the datasets the run logs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mlflow.data.numpy_dataset import NumpyDataset
from omegaconf import DictConfig

from resnet8ptq.data import (
    BINARY_DIR,
    MD5_CACHE,
    PYTHON_DIR,
    Cifar10,
    calibration_indices,
    calibration_set,
    load_cifar10,
    to_model_input,
)
from resnet8ptq.mlperf import perf_subset_indices
from resnet8ptq.shared import Shared
from resnet8ptq.tracking.models import content_digest, numpy_dataset


def load_dataset(shared: Shared, root: str, download: bool, cache_dir: str) -> Cifar10:
    """CIFAR-10, verified and read once per ``shared`` (a multirun reuses it); the files' MD5s are kept in
    the cache directory until a file changes."""
    return shared.get(
        "dataset",
        (root, download, cache_dir),
        lambda: load_cifar10(Path(root), download=download, md5_cache=Path(cache_dir) / MD5_CACHE),
    )


@dataclass(frozen=True)
class LoggedDatasets:
    """The datasets a run logs as inputs: an FP32 run is evaluated on the test set, a quantized run also
    calibrated on the calibration sample."""

    fp32: dict[str, NumpyDataset]
    quantized: dict[str, NumpyDataset]


@dataclass(frozen=True)
class RunInputs:
    """What one run works on (:func:`run_inputs`): CIFAR-10, the test set as model input with its labels, the
    calibration sample (``per_class`` training images per class drawn with ``seed``), MLPerf Tiny's
    performance subset of the test set, and the datasets the run logs."""

    data: Cifar10
    test_images: np.ndarray
    test_labels: np.ndarray
    calibration_images: np.ndarray
    perf_subset: np.ndarray
    datasets: LoggedDatasets
    per_class: int
    seed: int

    @property
    def test_set_digest(self) -> str:
        """The content digest of the test images and labels, as the run logs its test-set dataset."""
        return self.datasets.fp32["evaluation"].digest

    def calibration_sample(self) -> dict[str, object]:
        """Which training images the calibration sample is, for a hardware team's export (crossbar.json)."""
        return {
            "split": "CIFAR-10 training batches data_batch_1..5, concatenated in file order (50,000 images)",
            "per_class": self.per_class,
            "seed": self.seed,
            "indices": calibration_indices(self.data.train_labels, self.per_class, self.seed).tolist(),
            "images": "NHWC raw 0-255 pixels as the model takes them (no normalisation)",
        }


def run_inputs(cfg: DictConfig, shared: Shared) -> RunInputs:
    """The run's :class:`RunInputs`: verified CIFAR-10, the stratified calibration sample of the training
    split, MLPerf Tiny's performance subset of the test split (the data, test set and datasets kept in
    ``shared``)."""
    data = load_dataset(shared, cfg.data.root, cfg.data.download, cfg.cache_dir)
    per_class, seed = cfg.data.calib_per_class, cfg.data.seed
    test_images, test_labels = test_set(shared, data)
    calibration_images, _ = calibration_set(data, per_class, seed)
    datasets = shared.get(
        "run_inputs", (data, per_class, seed), lambda: logged_datasets(shared, data, per_class, seed)
    )
    perf_subset = perf_subset_indices(Path(cfg.cache_dir))
    return RunInputs(
        data, test_images, test_labels, calibration_images, perf_subset, datasets, per_class, seed
    )


def logged_datasets(shared: Shared, data: Cifar10, per_class: int, seed: int) -> LoggedDatasets:
    """The test set and the calibration sample as MLflow datasets (digests from their contents)."""
    source = str(data.root / (BINARY_DIR if data.layout == "binary" else PYTHON_DIR))
    images, labels = test_set(shared, data)
    test = numpy_dataset("cifar10-test", images, labels, source, content_digest(images, labels))
    images, labels = calibration_set(data, per_class, seed)
    name = f"cifar10-train-calibration-{per_class}x10-seed{seed}"
    calibration = numpy_dataset(name, images, labels, source, content_digest(images, labels))
    return LoggedDatasets({"evaluation": test}, {"evaluation": test, "calibration": calibration})


def test_set(shared: Shared, data: Cifar10) -> tuple[np.ndarray, np.ndarray]:
    """All 10,000 test images as model input, with their labels (once per ``shared`` and dataset)."""
    return shared.get("test_set", (data,), lambda: (to_model_input(data.test_images), data.test_labels))

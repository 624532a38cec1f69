"""What one run works on, made once per run from the process's shared data (:mod:`resnet8ptq.shared`): the
`data` group's data set (:mod:`resnet8ptq.datasets`, CIFAR-10 verified), its test split and calibration
sample as model input, MLPerf Tiny's performance subset and the datasets the run logs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mlflow.data.numpy_dataset import NumpyDataset
from omegaconf import DictConfig, OmegaConf

from resnet8ptq.datasets import Dataset, load_cifar10_dataset, load_npz
from resnet8ptq.errors import ConfigError
from resnet8ptq.evaluate import TestSet
from resnet8ptq.metrics import TOP1, Metric, metric
from resnet8ptq.shared import Shared
from resnet8ptq.tracking.models import content_digest, numpy_dataset


def load_dataset(shared: Shared, data: DictConfig, cache_dir: str) -> Dataset:
    """The `data` group's data set, read and checked once per ``shared`` (a multirun reuses it); CIFAR-10's
    MD5s are kept in the cache directory until a file changes."""
    if data.name == "cifar10":
        from resnet8ptq.mlperf import perf_subset_indices

        key = (data.root, data.download, cache_dir, data.calib_per_class, data.seed)
        return shared.get(
            "dataset",
            key,
            lambda: load_cifar10_dataset(
                data.root,
                data.download,
                cache_dir,
                data.calib_per_class,
                data.seed,
                lambda: perf_subset_indices(Path(cache_dir)),
            ),
        )
    if data.name == "npz":
        return shared.get("dataset", ("npz", data.path), lambda: load_npz(data.path))
    raise ConfigError(f"data.name={data.name!r}: expected cifar10 or npz (conf/data/).")


@dataclass(frozen=True)
class LoggedDatasets:
    """The datasets a run logs as inputs: an FP32 run is evaluated on the test set, a quantized run also
    calibrated on the calibration sample."""

    fp32: dict[str, NumpyDataset]
    quantized: dict[str, NumpyDataset]


@dataclass(frozen=True)
class RunInputs:
    """What one run works on (:func:`run_inputs`): the data set, its test split as model input with its
    labels, the calibration sample, MLPerf Tiny's performance subset of the test split (empty where it has
    none), and the datasets the run logs."""

    dataset: Dataset
    datasets: LoggedDatasets
    metric: Metric = TOP1  # how the model's outputs are scored (the model's `metric`)

    @property
    def test_set(self) -> TestSet:
        """The test inputs, their labels and the metric, as an evaluation takes them."""
        return TestSet(self.test_images, self.test_labels, self.metric)

    @property
    def test_images(self) -> np.ndarray:
        """The test inputs, as the model takes them."""
        return self.dataset.test_inputs

    @property
    def test_labels(self) -> np.ndarray:
        return self.dataset.test_labels

    @property
    def calibration_images(self) -> np.ndarray:
        """The calibration inputs, as the model takes them."""
        return self.dataset.calibration_inputs

    @property
    def perf_subset(self) -> np.ndarray:
        return self.dataset.perf_subset

    @property
    def test_set_digest(self) -> str:
        """The content digest of the test inputs and labels, as the run logs its test-set dataset."""
        return self.datasets.fp32["evaluation"].digest

    def calibration_sample(self) -> dict[str, object]:
        """Which samples calibrate, for a hardware team's export (crossbar.json)."""
        return dict(self.dataset.calibration_sample)


def run_inputs(cfg: DictConfig, shared: Shared) -> RunInputs:
    """The run's :class:`RunInputs`: the `data` group's data set, the datasets it logs (kept in ``shared``)
    and the model's metric."""
    dataset = load_dataset(shared, cfg.data, cfg.cache_dir)
    logged = shared.get("run_inputs", (dataset,), lambda: logged_datasets(dataset))
    scored_by = metric(OmegaConf.select(cfg, "model.metric", default="top1"), dataset.test_groups)
    return RunInputs(dataset, logged, scored_by)


def logged_datasets(dataset: Dataset) -> LoggedDatasets:
    """The test set and the calibration sample as MLflow datasets (digests from their contents)."""
    source = str(dataset.source)
    images, labels = dataset.test_inputs, dataset.test_labels
    test = numpy_dataset(f"{dataset.name}-test", images, labels, source, content_digest(images, labels))
    images, labels = dataset.calibration_inputs, dataset.calibration_labels
    digest = content_digest(images) if labels is None else content_digest(images, labels)
    calibration = numpy_dataset(dataset.calibration_name, images, labels, source, digest)
    return LoggedDatasets({"evaluation": test}, {"evaluation": test, "calibration": calibration})

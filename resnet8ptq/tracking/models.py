"""Models and datasets of a run as MLflow entities: each model logged as an MLflow Model (a LoggedModel linked
to the run and its metrics), the test set and the calibration sample as run inputs."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping

import mlflow
import numpy as np
from mlflow.data.numpy_dataset import NumpyDataset
from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.tracking import MlflowClient
from mlflow.types import Schema, TensorSpec

from resnet8ptq.backends.base import MlflowFlavor


def signature(input_example: np.ndarray, classes: int) -> ModelSignature:
    """The model's inputs (float32, the example's per-sample shape: NHWC raw 0-255 pixels for CIFAR-10) and
    its ``classes`` class probabilities (-1: not known). Unnamed tensors: pyfunc passes the array."""
    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, *input_example.shape[1:]))]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, classes))]),
    )


FORBIDDEN_IN_MODEL_NAMES = "/:.%\"'"
"""Characters MLflow refuses in a logged model's name (``_validate_logged_model_name``)."""


def model_name(run_name: str) -> str:
    """A run's name as its logged model's name: each character MLflow refuses there becomes ``_`` (run names
    may hold them: ``cim-r128-adc4-p99.99``, ``cim-n0.02``); other names are kept as they are."""
    return "".join("_" if char in FORBIDDEN_IN_MODEL_NAMES else char for char in run_name)


def log_model(run_id: str, name: str, how: MlflowFlavor, input_example: np.ndarray, classes: int = -1) -> str:
    """Log a saved model as an MLflow Model of the run named ``name`` (the model's name: :func:`model_name`),
    of ``classes`` outputs (-1: not known); return its ``models:/<id>`` URI.

    The run's metrics logged so far are linked to the model (MLflow copies them), so log metrics first. The
    model is created in the run's experiment with the run's params: left to itself, ``Model.log`` puts it in
    the process's active experiment, which need not be the run's.
    """
    client = MlflowClient()
    run = client.get_run(run_id)
    name = model_name(name)
    model = client.create_logged_model(
        experiment_id=run.info.experiment_id, name=name, source_run_id=run_id, params=run.data.params
    )
    with quiet_downloads():  # MLflow downloads the logged model to check the input example
        info = Model.log(
            artifact_path=None,
            name=name,
            flavor=how.flavor,
            run_id=run_id,
            model_id=model.model_id,
            signature=signature(input_example, classes),
            input_example=input_example,
            pip_requirements=how.requirements,
            **how.arguments,
        )
    return info.model_uri


@contextlib.contextmanager
def quiet_downloads() -> Iterator[None]:
    """No MLflow progress bar per downloaded file (one per run would flood a sweep's log)."""
    setting = MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR
    before = setting.get_raw()
    setting.set(False)
    try:
        yield
    finally:
        if before is None:
            setting.unset()
        else:
            os.environ[setting.name] = before


def content_digest(*arrays: np.ndarray) -> str:
    """A short hash of the arrays' contents: the same data gives the same digest on every machine."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:16]


def numpy_dataset(
    name: str, images: np.ndarray, labels: np.ndarray | None, source: str, digest: str
) -> NumpyDataset:
    """A dataset entity for inputs and labels (None: unlabelled; ``digest``: a content hash the caller
    computed)."""
    return mlflow.data.from_numpy(images, targets=labels, source=source, name=name, digest=digest)


DUPLICATE_ROW = ("UNIQUE constraint failed", "duplicate key value", "Duplicate entry")
"""How SQLite, PostgreSQL and MySQL word a unique-key violation in the error MLflow passes on."""
INPUT_ATTEMPTS = 3


def log_datasets(run_id: str, datasets: Mapping[str, NumpyDataset]) -> None:
    """Log datasets as inputs of the run, each under its context (``evaluation``, ``calibration``).

    MLflow's SQL store looks a dataset up and inserts it if absent, without a lock: two runs logging the same
    dataset at once (two sweeps on one store) can both miss it, and the second insert then fails on the
    table's unique key. The row exists by then, so the call is repeated, and finds it."""
    inputs = [
        DatasetInput(Dataset(**dataset.to_dict()), tags=[InputTag("mlflow.data.context", context)])
        for context, dataset in datasets.items()
    ]
    client = MlflowClient()
    for attempt in range(1, INPUT_ATTEMPTS + 1):
        try:
            client.log_inputs(run_id, datasets=inputs)
            return
        except MlflowException as err:
            if attempt == INPUT_ATTEMPTS or not any(text in str(err) for text in DUPLICATE_ROW):
                raise

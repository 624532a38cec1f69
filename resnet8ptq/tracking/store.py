"""The MLflow tracking store: pointing MLflow at it, checking it answers, creating it safely."""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
from filelock import FileLock
from omegaconf import DictConfig


class TrackingError(RuntimeError):
    """The MLflow tracking server or store cannot be used."""


# The experiment's kind, for MLflow clients that read it. MLflow 3.17.2's UI does not: its GenAI/Model
# training switch decides the view (see runs_page), whatever the tag says.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def configure(mlflow_cfg: DictConfig) -> str:
    """Point MLflow at the configured store, check it answers, and return the experiment id (an experiment
    without a kind is tagged as model development)."""
    if mlflow_cfg.tracking_uri:
        mlflow.set_tracking_uri(mlflow_cfg.tracking_uri)
    uri = mlflow.get_tracking_uri()
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5):
                pass
        except (urllib.error.URLError, OSError) as err:
            raise TrackingError(
                f"MLflow tracking server {uri} is unreachable ({err}). Start it, or set "
                f"mlflow.tracking_uri to a reachable server (null = local sqlite:///mlflow.db)."
            ) from err
    try:
        with store_lock(uri):
            experiment = mlflow.set_experiment(mlflow_cfg.experiment)
            if EXPERIMENT_KIND_TAG not in experiment.tags:
                mlflow.MlflowClient().set_experiment_tag(
                    experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
                )
            return experiment.experiment_id
    except Exception as err:  # MLflow raises several types for unusable stores
        raise TrackingError(f"Cannot use MLflow tracking store {uri}: {err}") from err


def runs_page(experiment_id: str, uri: str | None = None) -> str:
    """Where the MLflow UI shows the experiment's runs table: MLflow 3.17 opens an experiment in its GenAI
    view unless the UI's workflow switch says "Model training", which ``workflowType=machine_learning`` sets
    (the browser then remembers it). A local store: the address `mlflow ui` serves by default."""
    uri = uri or mlflow.get_tracking_uri()
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def store_lock(uri: str) -> contextlib.AbstractContextManager:
    """For a SQLite store: a lock that makes processes of this machine create it one at a time.

    MLflow 3.17's SqlAlchemyStore migrates an empty database without a lock, so two sweeps starting
    together on a fresh store fail ("table runs already exists", "duplicate column name"); creating the
    experiment is a second race. Once the store exists MLflow's busy timeout (20 s) serialises writes.
    """
    if not uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    database = Path(uri.removeprefix("sqlite:///").split("?")[0]).resolve()
    digest = hashlib.sha256(str(database).encode()).hexdigest()[:16]
    return FileLock(Path(tempfile.gettempdir()) / f"resnet8ptq-store-{digest}.lock")

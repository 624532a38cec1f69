"""The MLflow tracking store: pointing MLflow at it, checking it answers, creating it safely."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sqlite3
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
from filelock import FileLock
from mlflow.entities import Experiment
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from resnet8ptq.errors import ReportError, TrackingError

# The experiment's kind, for MLflow clients that read it. MLflow 3.17.2's UI does not: its GenAI/Model
# training switch decides the view (see runs_page), whatever the tag says.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def configure(mlflow_cfg: DictConfig, cache_dir: Path | None = None, *, fail_fast: bool = False) -> str:
    """Point MLflow at the configured store and return the experiment id (an experiment without a kind is
    tagged as model development). A new SQLite store starts from ``cache_dir``'s empty store
    (:func:`seed_sqlite_store`) when given.

    ``fail_fast`` (the launching process, before any work): a tracking server that does not answer
    ``/health`` at once is an error. Otherwise (a run, a launcher's job: the sweep has reached the server
    already) MLflow's own HTTP retries apply, so a job that starts while the server is briefly down waits
    for it like every later request of the run (with MLflow's default settings, about 4 minutes)."""
    if mlflow_cfg.tracking_uri:
        mlflow.set_tracking_uri(mlflow_cfg.tracking_uri)
    uri = mlflow.get_tracking_uri()
    if fail_fast and uri.startswith(("http://", "https://")):
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
            database = sqlite_path(uri)
            seeded = cache_dir is not None and database is not None and seed(database, cache_dir)
            experiment = mlflow.set_experiment(mlflow_cfg.experiment)
            if seeded:
                relocate_default_experiment(database, experiment)
            if EXPERIMENT_KIND_TAG not in experiment.tags:
                mlflow.MlflowClient().set_experiment_tag(
                    experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
                )
            return experiment.experiment_id
    except TrackingError:
        raise
    except Exception as err:  # MLflow raises several types for unusable stores
        raise TrackingError(f"Cannot use MLflow tracking store {uri}: {err}") from err


def runs_page(experiment_id: str, uri: str | None = None) -> str:
    """Where the MLflow UI shows the experiment's runs table: MLflow 3.17 opens an experiment in its GenAI
    view unless the UI's workflow switch says "Model training", which ``workflowType=machine_learning`` sets
    (the browser then remembers it). A local store: the address `mlflow ui` serves by default."""
    uri = uri or mlflow.get_tracking_uri()
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (None for any other store)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?")[0]).resolve()


def check_store_exists(uri: str) -> None:
    """A local sqlite store must exist already for a reader (MLflow would silently create an empty one);
    raises :class:`~resnet8ptq.errors.ReportError` naming the missing file."""
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise ReportError(
            f"No MLflow store at {path}: run from the directory holding mlflow.db, or pass --tracking-uri."
        )


def seed(database: Path, cache_dir: Path) -> bool:
    """:func:`seed_sqlite_store`, with a failure to write ``cache_dir`` or the store said as such."""
    try:
        return seed_sqlite_store(database, cache_dir)
    except OSError as err:
        raise TrackingError(
            f"Cannot create the MLflow store {database} from the empty store kept in the cache directory "
            f"{cache_dir}: {err}. Point cache_dir (RESNET8PTQ_CACHE) and the store at writable places."
        ) from err


def seed_sqlite_store(database: Path, cache_dir: Path) -> bool:
    """Start a new SQLite store as a copy of an empty store that MLflow created once for this machine and
    MLflow version (in ``cache_dir``); return whether it did (False: the store exists).

    MLflow creates a store by running its schema migrations one by one (about 2 s here); the copy holds the
    same tables at the same schema revision and MLflow's Default experiment, which
    :func:`relocate_default_experiment` then points at this store's artifact root. Callers hold
    :func:`store_lock`.
    """
    if database.exists():
        return False
    template = cache_dir / f"mlflow-{mlflow.__version__}-empty-store.db"
    if not template.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(template.with_suffix(".lock")), tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            if not template.exists():
                scratch = Path(tmp) / "mlflow.db"
                MlflowClient(f"sqlite:///{scratch}").search_experiments()  # MLflow creates and migrates it
                os.replace(scratch, template)
    database.parent.mkdir(parents=True, exist_ok=True)
    partial = database.with_name(f".{database.name}.partial")
    shutil.copyfile(template, partial)
    os.replace(partial, database)  # never a half-copied store under the store's name
    return True


def relocate_default_experiment(database: Path, experiment: Experiment) -> None:
    """Point a seeded store's Default experiment (id 0) where MLflow would have put it in this store: beside
    ``experiment``, which MLflow just created there under the store's artifact root."""
    root = experiment.artifact_location.rstrip("/").rsplit("/", 1)[0]
    with contextlib.closing(sqlite3.connect(database)) as db, db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (f"{root}/0",))


def store_lock(uri: str) -> contextlib.AbstractContextManager:
    """For a SQLite store: a lock that makes processes of this machine create it one at a time.

    MLflow 3.17's SqlAlchemyStore migrates an empty database without a lock, so two sweeps starting
    together on a fresh store fail ("table runs already exists", "duplicate column name"); creating the
    experiment is a second race. Once the store exists MLflow's busy timeout (20 s) serialises writes.
    """
    database = sqlite_path(uri)
    if database is None:
        return contextlib.nullcontext()
    digest = hashlib.sha256(str(database).encode()).hexdigest()[:16]
    return FileLock(Path(tempfile.gettempdir()) / f"resnet8ptq-store-{digest}.lock")

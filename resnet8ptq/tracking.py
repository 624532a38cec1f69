"""MLflow: tracking set-up, the sweep (parent) run, and what each child run logs."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import subprocess
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow
from filelock import FileLock
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

PARENT_RUN_ENV = "RESNET8PTQ_PARENT_RUN_ID"
PROJECT_DIR = Path(__file__).resolve().parents[1]
# The settings that determine a run's result; their hash tags a run so that reruns can be recognised.
RESULT_KEYS = (
    "backend",
    "dtype",
    "calib",
    "per_channel",
    "data.calib_per_class",
    "data.seed",
    "model.sha256",
)


class TrackingError(RuntimeError):
    """The MLflow tracking server or store cannot be used."""


def configure(mlflow_cfg: DictConfig) -> str:
    """Point MLflow at the configured store, check it answers, and return the experiment id."""
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
        return mlflow.set_experiment(mlflow_cfg.experiment).experiment_id
    except Exception as err:  # MLflow raises several types for unusable stores
        raise TrackingError(f"Cannot use MLflow tracking store {uri}: {err}") from err


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def run_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config, flattened, plus the config-group choices (`backend`, `dtype`, `calib`)."""
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    if HydraConfig.initialized():
        choices = HydraConfig.get().runtime.choices
        params.update({group: choices[group] for group in ("backend", "dtype", "calib") if group in choices})
    return params


def config_hash(params: Mapping[str, Any]) -> str:
    """A short hash of the settings that determine a run's result."""
    relevant = {key: str(value) for key, value in params.items() if key.startswith(RESULT_KEYS)}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def git_commit() -> str:
    """The project's git commit (with `-dirty` for uncommitted changes), or `unknown`."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PROJECT_DIR, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=PROJECT_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


@contextlib.contextmanager
def child_run(
    experiment_id: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, Any]
) -> Iterator[str]:
    """A run under the current sweep run (if any), yielding its id.

    It ends FINISHED, or FAILED (KILLED on Ctrl-C) with the error recorded as tag `error` and
    artifact `error.txt`: never left RUNNING by an exception.
    """
    client = MlflowClient()
    all_tags = {"mlflow.runName": run_name, **tags}
    if parent := os.environ.get(PARENT_RUN_ENV):
        all_tags["mlflow.parentRunId"] = parent
    run_id = client.create_run(experiment_id, run_name=run_name, tags=all_tags).info.run_id
    try:
        client.log_batch(run_id, params=[Param(key, str(value)[:6000]) for key, value in params.items()])
        yield run_id
    except BaseException as err:
        client.set_tag(run_id, "error", f"{type(err).__name__}: {err}"[:5000])
        client.log_text(run_id, traceback.format_exc(), "error.txt")
        killed = isinstance(err, KeyboardInterrupt | SystemExit)
        client.set_terminated(run_id, "KILLED" if killed else "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")


def log_metrics(run_id: str, metrics: Mapping[str, float]) -> None:
    """Log a dict of metrics in one call."""
    timestamp = int(time.time() * 1000)
    entries = [Metric(key, float(value), timestamp, 0) for key, value in metrics.items()]
    MlflowClient().log_batch(run_id, metrics=entries)


def set_tags(run_id: str, tags: Mapping[str, str]) -> None:
    """Set a dict of tags in one call."""
    MlflowClient().log_batch(run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])


def log_artifacts(run_id: str, files: Iterable[tuple[str, Path]]) -> None:
    """Log each local file under its artifact directory (`""` for the root)."""
    client = MlflowClient()
    for artifact_dir, path in files:
        client.log_artifact(run_id, str(path), artifact_dir or None)


def sweep_lock(name: str) -> contextlib.AbstractContextManager:
    """A lock shared by the jobs of the current sweep on this machine (parallel launchers), else a no-op."""
    parent = os.environ.get(PARENT_RUN_ENV)
    if parent is None:
        return contextlib.nullcontext()
    return FileLock(Path(tempfile.gettempdir()) / f"resnet8ptq-{parent}-{name}.lock")


def find_sibling(experiment_id: str, **tags: str) -> str | None:
    """The id of a finished run under the current sweep run whose tags match, if one exists."""
    parent = os.environ.get(PARENT_RUN_ENV)
    if parent is None:
        return None
    conditions = [f"tags.mlflow.parentRunId = '{parent}'", "attributes.status = 'FINISHED'"]
    conditions += [f"tags.`{key}` = '{value}'" for key, value in tags.items()]
    runs = MlflowClient().search_runs([experiment_id], " and ".join(conditions), max_results=1)
    return runs[0].info.run_id if runs else None


class SweepRunCallback(Callback):
    """Hydra callback: one MLflow parent run per invocation (single run or sweep); jobs log under it.

    The parent is ended FINISHED when every child finished, FAILED otherwise, also when the sweep
    aborts with an exception (an atexit hook), so it is never left RUNNING. Then the comparison report
    (`resnet8ptq.report`, settings `report.enabled` and `report.max_drop_points`) is written into the
    run/sweep directory and logged to the parent; a report that fails only logs a warning.
    """

    def __init__(self) -> None:
        self._run_id: str | None = None
        self._report_enabled = True
        self._max_drop_points = 5.0

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start(config, Path(config.hydra.run.dir), "run")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start(config, Path(config.hydra.sweep.dir), "sweep")

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._end()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._end()

    def _start(self, config: DictConfig, output_dir: Path, kind: str) -> None:
        experiment_id = configure(config.mlflow)
        overrides = " ".join(config.hydra.overrides.task) or "(defaults)"
        run = MlflowClient().create_run(
            experiment_id,
            run_name=f"{kind} {output_dir.name}",
            tags={
                "sweep": "true",
                "sweep_kind": kind,
                "sweep_dir": str(output_dir.resolve()),
                "overrides": overrides[:5000],
                "git_commit": git_commit(),
            },
        )
        self._run_id = run.info.run_id
        self._report_enabled = bool(OmegaConf.select(config, "report.enabled", default=True))
        self._max_drop_points = float(OmegaConf.select(config, "report.max_drop_points", default=5.0))
        os.environ[PARENT_RUN_ENV] = self._run_id
        atexit.register(self._end)
        log.info("MLflow sweep run %s (experiment %s)", self._run_id, config.mlflow.experiment)

    def _end(self) -> None:
        if self._run_id is None:
            return
        run_id, self._run_id = self._run_id, None
        os.environ.pop(PARENT_RUN_ENV, None)
        client = MlflowClient()
        experiment_id = client.get_run(run_id).info.experiment_id
        children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
        ok = bool(children) and all(child.info.status == "FINISHED" for child in children)
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED if ok else RunStatus.FAILED))
        if self._report_enabled:
            self._report(run_id)

    def _report(self, run_id: str) -> None:
        """Write and log the comparison report of this invocation; a failure is logged, never raised."""
        try:
            from resnet8ptq.report import write_report  # matplotlib: only imported when reporting

            write_report(run_id, max_drop_points=self._max_drop_points)
        except Exception as err:
            log.warning("Comparison report for MLflow run %s failed: %s", run_id, err, exc_info=True)

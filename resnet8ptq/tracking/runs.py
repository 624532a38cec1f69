"""Child runs under the current sweep run: created, logged in batches, always ended (never left RUNNING),
found again (siblings, finished configurations)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from resnet8ptq.drawing import Drawing
from resnet8ptq.tracking.search import where
from resnet8ptq.tracking.sweep import current_sweep_run, sweep_lock

log = logging.getLogger(__name__)

SOURCE_TAGS = {"mlflow.source.name": "run.py", "mlflow.source.type": "LOCAL"}
"""What MLflow's runs table shows as a run's Source."""
REUSED_TAG_PREFIX = "reused."
"""Sweep-run tag prefix: `reused.<config_hash>` = the id of the earlier FINISHED run a sweep reused."""


def process_tags() -> dict[str, str]:
    """`host` and `pid` of this process: what tells a killed run (process gone) from a running one."""
    return {"host": socket.gethostname(), "pid": str(os.getpid())}


@contextlib.contextmanager
def child_run(
    experiment_id: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, Any]
) -> Iterator[str]:
    """A run under the current sweep run (if any), yielding its id.

    It ends FINISHED, or FAILED (KILLED on Ctrl-C) with the error recorded as tag `error` and
    artifact `error.txt`: never left RUNNING by an exception.
    """
    client = MlflowClient()
    all_tags = {"mlflow.runName": run_name, **SOURCE_TAGS, **tags, **process_tags()}
    if "git_commit" in tags:
        all_tags["mlflow.source.git.commit"] = tags["git_commit"].removesuffix("-dirty")
    if parent := current_sweep_run():
        all_tags["mlflow.parentRunId"] = parent
    run_id = client.create_run(experiment_id, run_name=run_name, tags=all_tags).info.run_id
    try:
        client.log_batch(run_id, params=[Param(key, str(value)[:6000]) for key, value in params.items()])
        yield run_id
    except BaseException as err:
        # Recording the error must not keep the run from ending (e.g. a full disk under the artifacts).
        with contextlib.suppress(Exception):
            client.set_tag(run_id, "error", f"{type(err).__name__}: {err}"[:5000])
        with contextlib.suppress(Exception):
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


def log_artifacts(run_id: str, files: Iterable[tuple[str, Path | Drawing]]) -> None:
    """Log each local file under its artifact directory (`""` for the root), a chart once it is drawn."""
    client = MlflowClient()
    for artifact_dir, path in files:
        local = path.path() if isinstance(path, Drawing) else path
        client.log_artifact(run_id, str(local), artifact_dir or None)


def find_sibling(experiment_id: str, **tags: str) -> str | None:
    """The id of a finished run under the current sweep run whose tags match, if one exists."""
    parent = current_sweep_run()
    if parent is None:
        return None
    conditions = {"tags.mlflow.parentRunId": parent, "attributes.status": "FINISHED"}
    conditions |= {f"tags.{key}": value for key, value in tags.items()}
    runs = MlflowClient().search_runs([experiment_id], where(conditions), max_results=1)
    return runs[0].info.run_id if runs else None


@contextlib.contextmanager
def first_in_sweep(experiment_id: str, **tags: str) -> Iterator[bool]:
    """Whether no finished run with these tags is under the current sweep run yet, holding the sweep's lock
    for them (parallel jobs of one sweep get here together): log that run inside the block to log it once."""
    with sweep_lock("-".join(f"{key}-{value}" for key, value in sorted(tags.items()))):
        yield find_sibling(experiment_id, **tags) is None


def skip_finished(experiment_id: str, run_name: str, config_hash: str) -> str | None:
    """If a quantized run with this config_hash already FINISHED in the experiment (any sweep): log that
    this configuration is skipped, note it on the sweep run (tag `skipped.<config_hash>`, and
    `reused.<config_hash>` = that run's id, which the sweep's report includes) and return that run's id.
    None when there is no such run."""
    conditions = {"tags.config_hash": config_hash, "tags.quantized": "true", "attributes.status": "FINISHED"}
    runs = MlflowClient().search_runs(
        [experiment_id],
        where(conditions),
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    if not runs:
        return None
    previous = runs[0]
    accuracy = previous.data.metrics.get("accuracy", float("nan"))
    note = f"run {previous.info.run_id} (accuracy {accuracy:.4f}) FINISHED with config_hash {config_hash}"
    log.info("Skipping %s: %s; rerun=true runs it again", run_name, note)
    if parent := current_sweep_run():
        MlflowClient().set_tag(parent, f"skipped.{config_hash}", f"{run_name}: {note}"[:5000])
        MlflowClient().set_tag(parent, f"{REUSED_TAG_PREFIX}{config_hash}", previous.info.run_id)
    return previous.info.run_id

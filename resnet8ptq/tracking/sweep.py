"""The sweep (parent) run of one invocation: created before the jobs, ended FINISHED or FAILED after them.

Jobs find it through the environment variable ``RESNET8PTQ_PARENT_RUN_ID`` (launchers pass the environment
on to their worker processes) and log their runs under it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from filelock import FileLock
from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient

from resnet8ptq.tracking.search import search_all

log = logging.getLogger(__name__)

PARENT_RUN_ENV = "RESNET8PTQ_PARENT_RUN_ID"


def current_sweep_run() -> str | None:
    """The id of the sweep run this process's jobs log under, if any."""
    return os.environ.get(PARENT_RUN_ENV)


def start_sweep_run(experiment_id: str, name: str, tags: Mapping[str, str]) -> str:
    """Create the sweep run (tag ``sweep=true``) and make it the parent of this process's runs."""
    run_id = (
        MlflowClient().create_run(experiment_id, run_name=name, tags={"sweep": "true", **tags}).info.run_id
    )
    os.environ[PARENT_RUN_ENV] = run_id
    return run_id


def end_sweep_run(run_id: str) -> str:
    """End the sweep run FINISHED when it has children (or skipped configurations) that all FINISHED, else
    FAILED; return the status."""
    os.environ.pop(PARENT_RUN_ENV, None)
    client = MlflowClient()
    run = client.get_run(run_id)
    children = search_all(client, [run.info.experiment_id], {"tags.mlflow.parentRunId": run_id})
    skipped = [key for key in run.data.tags if key.startswith("skipped.")]
    if skipped:
        log.info(
            "%d configuration(s) skipped: already FINISHED (tags skipped.* of run %s)", len(skipped), run_id
        )
    ok = bool(children or skipped) and all(child.info.status == "FINISHED" for child in children)
    status = RunStatus.to_string(RunStatus.FINISHED if ok else RunStatus.FAILED)
    client.set_terminated(run_id, status)
    return status


def tag_sweep_error(message: str) -> None:
    """Record a job's error on the sweep run (the job may have failed before starting a run of its own)."""
    if parent := current_sweep_run():
        with contextlib.suppress(Exception):  # recording the error must never hide it
            MlflowClient().set_tag(parent, "error", message[:5000])


UNSUPPORTED_TAG_PREFIX = "unsupported."


def tag_sweep_unsupported(job: str, message: str) -> None:
    """Record on the sweep run that its backend refused a job's configuration (tag ``unsupported.<job>``)."""
    if parent := current_sweep_run():
        MlflowClient().set_tag(parent, f"{UNSUPPORTED_TAG_PREFIX}{job}", message[:5000])


def sweep_lock(name: str) -> contextlib.AbstractContextManager:
    """A lock shared by the jobs of the current sweep on this machine (parallel launchers), else a no-op."""
    parent = current_sweep_run()
    if parent is None:
        return contextlib.nullcontext()
    return FileLock(Path(tempfile.gettempdir()) / f"resnet8ptq-{parent}-{name}.lock")

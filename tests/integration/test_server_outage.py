"""A tracking-server blip does not lose a run (issue #30): a job that starts while the server is down waits
for it through MLflow's HTTP retries, as every later request of a run does; only the launching process's
pre-flight check, before any work, fails at once. Needs only `mlflow server` (SQLite backend): ~40 s."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from resnet8ptq.errors import TrackingError
from resnet8ptq.tracking.store import configure
from tests.integration.servers import free_port, mlflow_server

pytestmark = pytest.mark.server


def test_a_job_starting_during_an_outage_waits_for_the_server(tmp_path: Path) -> None:
    port = free_port()
    store = f"sqlite:///{tmp_path / 'server.db'}"
    server_args = ("--artifacts-destination", str(tmp_path / "artifacts"))
    with mlflow_server(store, tmp_path / "first.log", *server_args, port=port) as url:
        settings = OmegaConf.create({"tracking_uri": url, "experiment": "outage"})
        experiment_id = configure(settings)

    outcome: dict[str, object] = {}

    def job_start() -> None:
        try:
            outcome["experiment_id"] = configure(settings)
        except Exception as err:  # reported by the assertions below
            outcome["error"] = err

    job = threading.Thread(target=job_start, daemon=True)
    down_since = time.monotonic()
    job.start()
    time.sleep(3)
    assert job.is_alive(), f"the job did not wait for the server: {outcome}"
    with mlflow_server(store, tmp_path / "second.log", *server_args, port=port):
        job.join(timeout=240)
        outage = time.monotonic() - down_since
    assert outcome == {"experiment_id": experiment_id}, f"after an outage of {outage:.0f} s"

    start = time.monotonic()  # the server is down again: the pre-flight check names it at once
    with pytest.raises(TrackingError, match=rf"{url} is unreachable"):
        configure(settings, fail_fast=True)
    assert time.monotonic() - start < 10

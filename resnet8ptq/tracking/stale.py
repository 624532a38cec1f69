"""Runs left RUNNING by a killed process: recognised by their `host` and `pid` tags and marked KILLED."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)


def close_stale_runs(experiment_id: str, client: MlflowClient | None = None) -> list[str]:
    """Mark KILLED the RUNNING runs of this host whose process is gone; return their ids.

    A process killed without a chance to end its runs (SIGKILL, the OOM killer, a power loss) leaves them
    RUNNING. Runs are matched by their `host` and `pid` tags; runs of other hosts (and runs without
    those tags) are left alone with a warning, since their processes cannot be checked from here.
    """
    client = client or MlflowClient()
    host = socket.gethostname()
    closed = []
    for run in client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        run_host, pid = run.data.tags.get("host"), run.data.tags.get("pid", "")
        if run_host != host or not pid.isdigit():
            log.warning(
                "MLflow run %s (%s) is RUNNING on host %s, pid %s: not checked from %s. If its process is "
                "gone, end it: MlflowClient().set_terminated('%s', 'KILLED')",
                run.info.run_id,
                run.info.run_name,
                run_host or "unknown",
                pid or "unknown",
                host,
                run.info.run_id,
            )
            continue
        if _process_alive(int(pid), run.info.start_time):
            continue
        reason = f"process {pid} on {host} ended without ending this run (killed?); marked KILLED"
        client.set_tag(run.info.run_id, "error", reason)
        client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.KILLED))
        log.warning("MLflow run %s (%s): %s", run.info.run_id, run.info.run_name, reason)
        closed.append(run.info.run_id)
    return closed


def _process_alive(pid: int, since_ms: int) -> bool:
    """Whether process ``pid`` runs and started no later than ``since_ms`` (so it is not a newer
    process that reuses the pid). Zombies count as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists (another user's)
    try:  # Linux: state and start time from /proc (elsewhere: trust os.kill)
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        state, start_ticks = fields[0], int(fields[19])  # fields 3 and 22 of proc_pid_stat(5)
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, IndexError, StopIteration, ValueError):
        return True
    started = boot + start_ticks / os.sysconf("SC_CLK_TCK")
    return state not in ("Z", "X") and started <= since_ms / 1000 + 1.0

"""MLflow: tracking set-up, the sweep (parent) run, and what each child run logs."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import socket
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
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from resnet8ptq import hardware

log = logging.getLogger(__name__)

PARENT_RUN_ENV = "RESNET8PTQ_PARENT_RUN_ID"
PROJECT_DIR = Path(__file__).resolve().parents[1]
# The settings that determine a run's result (with the model and library versions, see `config_hash`);
# their hash tags a quantized run so that a rerun of the same configuration is recognised and skipped.
RESULT_KEYS = (
    "backend",
    "dtype",
    "calib",
    "per_channel",
    "reduce_range",
    "native_tolerance_points",
    "data.calib_per_class",
    "data.seed",
)
# Config-group choice labels that run_params adds: only the groups' content counts (dtype=u8s8 is
# dtype.activation=uint8 + dtype.weight=int8).
GROUP_CHOICES = ("backend", "dtype", "calib")


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
        with store_lock(uri):
            return mlflow.set_experiment(mlflow_cfg.experiment).experiment_id
    except Exception as err:  # MLflow raises several types for unusable stores
        raise TrackingError(f"Cannot use MLflow tracking store {uri}: {err}") from err


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


def config_hash(params: Mapping[str, Any], identity: Mapping[str, str]) -> str:
    """A short hash of what determines a run's result: the RESULT_KEYS settings in ``params`` plus
    ``identity`` (the model's actual content and the library versions). Paths, the tracking store,
    `rerun` and the report settings do not count."""
    prefixes = tuple(f"{key}." for key in RESULT_KEYS)
    relevant = {
        key: str(value)
        for key, value in params.items()
        if key not in GROUP_CHOICES and (key in RESULT_KEYS or key.startswith(prefixes))
    }
    relevant.update(identity)
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def process_tags() -> dict[str, str]:
    """`host` and `pid` of this process: what tells a killed run (process gone) from a running one."""
    return {"host": socket.gethostname(), "pid": str(os.getpid())}


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
    all_tags = {"mlflow.runName": run_name, **tags, **process_tags()}
    if parent := os.environ.get(PARENT_RUN_ENV):
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


def skip_finished(experiment_id: str, run_name: str, config_hash: str) -> float | None:
    """If a quantized run with this config_hash already FINISHED in the experiment (any sweep): log that
    this configuration is skipped, note it on the sweep run (tag `skipped.<config_hash>`) and return
    that run's accuracy. None when there is no such run."""
    runs = MlflowClient().search_runs(
        [experiment_id],
        f"tags.config_hash = '{config_hash}' and tags.quantized = 'true' and attributes.status = 'FINISHED'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    if not runs:
        return None
    previous = runs[0]
    accuracy = previous.data.metrics.get("accuracy", float("nan"))
    note = f"run {previous.info.run_id} (accuracy {accuracy:.4f}) FINISHED with config_hash {config_hash}"
    log.info("Skipping %s: %s; rerun=true runs it again", run_name, note)
    if parent := os.environ.get(PARENT_RUN_ENV):
        MlflowClient().set_tag(parent, f"skipped.{config_hash}", f"{run_name}: {note}"[:5000])
    return accuracy


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


def _check_writable(directory: Path) -> None:
    """Exit before any work when the run/sweep directory cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise SystemExit(
            f"Cannot write the output directory {directory}: {err}. "
            "Point hydra.run.dir (hydra.sweep.dir with -m) at a writable directory."
        ) from err


class SweepRunCallback(Callback):
    """Hydra callback: one MLflow parent run per invocation (single run or sweep); jobs log under it.

    At the start it exits (one line, no traceback) when the output directory cannot be written or the
    tracking store cannot be used, and marks KILLED the runs that killed processes left RUNNING
    (`close_stale_runs`). The parent is ended FINISHED when every child finished (or its configuration
    was skipped as already FINISHED), FAILED otherwise (a failed job's error is tagged on it), also when
    the sweep aborts with an exception (an atexit hook), so it is never left RUNNING. Then the comparison
    report (`resnet8ptq.report`, settings `report.enabled` and `report.max_drop_points`) is written into
    the run/sweep directory and logged to the parent; a report that fails only logs a warning.
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

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Tag a failed job's error on the sweep run (it may have failed before starting a run of its own)."""
        parent = os.environ.get(PARENT_RUN_ENV)
        if job_return.status != JobStatus.FAILED or parent is None:
            return
        err = job_return._return_value  # the exception (the public property re-raises it)
        message = str(err) if isinstance(err, CompactHydraException) else f"{type(err).__name__}: {err}"
        with contextlib.suppress(Exception):
            MlflowClient().set_tag(parent, "error", message[:5000])

    def _start(self, config: DictConfig, output_dir: Path, kind: str) -> None:
        try:
            experiment_id = configure(config.mlflow)
        except TrackingError as err:  # Hydra would only warn about a failing callback and run the jobs
            raise SystemExit(f"TrackingError: {err}") from err
        _check_writable(output_dir)
        close_stale_runs(experiment_id)
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
                **hardware.detect().tags(),
                **process_tags(),
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
        run = client.get_run(run_id)
        children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
        skipped = [key for key in run.data.tags if key.startswith("skipped.")]
        if skipped:
            log.info(
                "%d configuration(s) skipped: already FINISHED (tags skipped.* of run %s)",
                len(skipped),
                run_id,
            )
        ok = bool(children or skipped) and all(child.info.status == "FINISHED" for child in children)
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

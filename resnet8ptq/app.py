"""The Hydra application around the pipeline: the task each job runs, and the sweep callback.

This is the entry-point layer: it alone turns errors into exits. Known failures (settings, data, model,
tracking store, full disk) become :class:`RunFailed`, which Hydra prints as one line without a traceback.
"""

from __future__ import annotations

import atexit
import errno
import functools
import logging
import re
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from resnet8ptq import hardware
from resnet8ptq.config import ReportConfig
from resnet8ptq.errors import ConfigError, DataError, ModelError, TrackingError, Unsupported
from resnet8ptq.metrics import metric
from resnet8ptq.search.objectives import (
    REFUSED,
    SearchConfig,
    is_optuna,
    objective_values,
    sweep_tags,
    trial_tag,
)
from resnet8ptq.tracking.identity import git_commit
from resnet8ptq.tracking.runs import process_tags
from resnet8ptq.tracking.stale import close_stale_runs
from resnet8ptq.tracking.store import configure, runs_page
from resnet8ptq.tracking.sweep import (
    current_sweep_run,
    end_sweep_run,
    start_sweep_run,
    tag_sweep_error,
    tag_sweep_unsupported,
)

log = logging.getLogger(__name__)

# Write failures that say what is wrong with the machine, not with the code.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
KNOWN_ERRORS = (ConfigError, DataError, ModelError, TrackingError)


class RunFailed(CompactHydraException):
    """A known failure (settings, data, model, tracking store, disk): printed as its message, no traceback."""


def job_tag(job: str) -> str:
    """A job's overrides as the name of a tag on the sweep run: characters MLflow refuses made ``_``, and no
    empty, ``.`` or ``..`` path segment, which MLflow also refuses in a name (a tracking URI's ``sqlite:////``
    had failed the skipped job's tag, and with it the sweep)."""
    name = re.sub(r"[^\w\-.:/]", "_", job.replace("=", "-"))
    return "/".join(part for part in name.split("/") if part not in ("", ".", ".."))[:200]


def task(cfg: DictConfig) -> float | list[float] | None:
    """One job: the pipeline on this configuration (with ``target.max_drop_points``, the mixed-precision steps
    to that target); returns the run's ``search.objectives`` as it logged them (one: a float, what a sweeper
    optimises; several: a list), also for a run it resumes. None when the job belongs to a sweep and its
    backend refuses the configuration (:class:`Unsupported`): an Optuna search records the trial as failed
    and goes on.

    A failure is tagged on the sweep run (the job may fail before it has a run of its own) and re-raised,
    known failures as :class:`RunFailed`.
    """
    from resnet8ptq.errors import TargetNotReached
    from resnet8ptq.memory import keep_freed_memory
    from resnet8ptq.pipeline import run as run_one  # the libraries: imported when a job runs, not at start-up
    from resnet8ptq.search.budget import run_within_budget
    from resnet8ptq.search.target import reach_target
    from resnet8ptq.shared import PROCESS

    run = functools.partial(run_one, shared=PROCESS)  # the jobs of this process share PROCESS

    keep_freed_memory()  # in every process that runs a job: launchers' workers too
    hydra_cfg = HydraConfig.get()
    output_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        objectives = search_settings(cfg).objectives
        if cfg.target.max_bops is not None or cfg.target.max_weight_bits is not None:
            run_id = run_within_budget(cfg, output_dir, run, PROCESS)
        elif cfg.target.max_drop_points is not None:
            run_id = reach_target(cfg, output_dir, run)
        else:
            run_id = run(cfg, output_dir)
        key = metric(cfg.model.metric).key
        values = objective_values(MlflowClient().get_run(run_id).data.metrics, objectives, run_id, key)
        record_trial(run_id)
        return values[0] if len(values) == 1 else values
    except Unsupported as err:  # a sweep goes on without it; a single run fails
        if hydra_cfg.mode != RunMode.MULTIRUN:
            failure = RunFailed(f"Unsupported: {err}")
            tag_sweep_error(str(failure))
            raise failure from err
        job = " ".join(hydra_cfg.overrides.task)
        log.warning("Skipped %s: %s", job, err)
        tag_sweep_unsupported(job_tag(job), str(err))
        record_trial(f"{REFUSED}{err}")
        return None
    except (*KNOWN_ERRORS, TargetNotReached) as err:  # the run is FAILED (or the target missed), recorded
        failure = RunFailed(f"{type(err).__name__}: {err}")
        tag_sweep_error(str(failure))
        raise failure from err
    except OSError as err:
        if err.errno not in DISK_ERRNOS:
            tag_sweep_error(f"{type(err).__name__}: {err}")
            raise
        failure = RunFailed(
            f"{type(err).__name__}: {err}. The run writes to its output directory {output_dir}, "
            f"the model cache {cfg.cache_dir} and the MLflow store: free space there or point them elsewhere."
        )
        tag_sweep_error(str(failure))
        raise failure from err
    except Exception as err:
        tag_sweep_error(f"{type(err).__name__}: {err}")
        raise


def search_settings(cfg: DictConfig) -> SearchConfig:
    """The `search` settings, validated (ConfigError names a bad objective)."""
    try:
        return OmegaConf.to_object(cfg.search)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def record_trial(outcome: str) -> None:
    """In an Optuna search, note on the sweep run which run this job's trial was (or why it has none)."""
    hydra_cfg = HydraConfig.get()
    parent = current_sweep_run()
    if parent and hydra_cfg.mode == RunMode.MULTIRUN and is_optuna(hydra_cfg.sweeper):
        MlflowClient().set_tag(parent, trial_tag(hydra_cfg.job.num), outcome[:5000])


class SweepRunCallback(Callback):
    """One MLflow parent run per invocation (single run or sweep); the jobs log under it.

    At the start it stops the invocation (one line, no traceback) when the output directory cannot be written
    or the tracking store cannot be used, and marks KILLED the runs that killed processes left RUNNING. At the
    end (also when the sweep aborts: an atexit hook) it ends the parent FINISHED or FAILED, then writes the
    comparison report into the run/sweep directory and logs it to the parent; a failing report only warns.

    Hydra turns any ``Exception`` raised in a callback into a warning and runs the jobs anyway, so a failed
    pre-flight check stops the invocation with ``SystemExit`` carrying the message, which Hydra prints.
    """

    def __init__(self) -> None:
        self._run_id: str | None = None
        self._report = ReportConfig()
        self._register_as: str | None = None
        self._experiment_id = ""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start(config, Path(config.hydra.run.dir), "run")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start(config, Path(config.hydra.sweep.dir), "sweep")

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._end()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._end()

    def _start(self, config: DictConfig, output_dir: Path, kind: str) -> None:
        try:
            search = search_settings(config)
            check_registration(config.mlflow)
            experiment_id = configure(config.mlflow, Path(config.cache_dir), fail_fast=True)
            check_writable(output_dir)
        except (ConfigError, TrackingError, OutputDirError) as err:
            raise SystemExit(f"{type(err).__name__}: {err}") from err
        close_stale_runs(experiment_id)
        overrides = " ".join(config.hydra.overrides.task) or "(defaults)"
        sweeper = config.hydra.sweeper if kind == "sweep" else None
        self._run_id = start_sweep_run(
            experiment_id,
            f"{overrides[:200]} @ {datetime.now():%H:%M}",
            {
                "sweep_kind": kind,
                "sweep_dir": str(output_dir.resolve()),
                "overrides": overrides[:5000],
                "git_commit": git_commit(),
                **hardware.detect().tags(),
                **process_tags(),
                **(sweep_tags(sweeper, search.objectives) if is_optuna(sweeper) else {}),
            },
        )
        self._report = ReportConfig(**config.report)
        self._register_as = config.mlflow.register_as
        self._experiment_id = experiment_id
        atexit.register(self._end)
        log.info("MLflow sweep run %s (experiment %s)", self._run_id, config.mlflow.experiment)

    def _end(self) -> None:
        if self._run_id is None:
            return
        run_id, self._run_id = self._run_id, None
        end_sweep_run(run_id)
        if self._report.enabled:
            write_report_safely(run_id, self._report)
        if self._register_as:
            from resnet8ptq.report.registry import register_most_accurate

            register_most_accurate(run_id, self._register_as, self._report.max_drop_points)
        log.info("Runs in the MLflow UI (`make ui` for a local store): %s", runs_page(self._experiment_id))


def check_registration(settings: DictConfig) -> None:
    """ConfigError when ``mlflow.register_as`` asks to register a model the runs will not log."""
    if settings.register_as and not settings.log_models:
        raise ConfigError(
            f"mlflow.register_as={settings.register_as} with mlflow.log_models=false: only a logged MLflow "
            "Model can be registered. Set mlflow.log_models=true, or leave register_as unset."
        )


def write_report_safely(run_id: str, settings: ReportConfig) -> None:
    """Write and log the comparison report of a sweep run; a failure is logged, never raised."""
    try:
        from resnet8ptq.report.writer import write_report  # pandas, SciPy: only imported when reporting

        write_report(
            run_id, max_drop_points=settings.max_drop_points, chip_drop_points=settings.chip_drop_points
        )
    except Exception as err:
        log.warning("Comparison report for MLflow run %s failed: %s", run_id, err, exc_info=True)


class OutputDirError(OSError):
    """The run/sweep output directory cannot be written."""


def check_writable(directory: Path) -> None:
    """Raise OutputDirError unless ``directory`` can be created and written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise OutputDirError(
            f"Cannot write the output directory {directory}: {err}. "
            "Point hydra.run.dir (hydra.sweep.dir with -m) at a writable directory."
        ) from err

"""Sweeps through Hydra's parallel launchers, end to end through the CLI: no run lost, one parent per sweep.

* `hydra/launcher=joblib` (hydra-joblib-launcher): jobs in parallel worker processes on this machine;
* `hydra/launcher=submitit_local` (hydra-submitit-launcher): jobs as submitit subprocesses, as on SLURM
  (`hydra/launcher=slurm`, conf/hydra/launcher/slurm.yaml, is tested against a tracking server in
  tests/integration/test_remote_tracking.py);
* `hydra/launcher=ray` (hydra-ray-launcher, local mode): only where it is installed, see test_ray_local_sweep.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq.tracking.sweep import PARENT_RUN_ENV

pytestmark = pytest.mark.slow


def runs_in(workdir: Path) -> list[Run]:
    """Every run of the sweep's experiment in the default store (sqlite:///mlflow.db) of ``workdir``."""
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet8ptq")
    return client.search_runs([experiment.experiment_id])


def check_sweep(runs: list[Run], quantized: int) -> tuple[Run, list[Run]]:
    """One parent, FINISHED, with one FP32 baseline per backend and ``quantized`` quantized runs, all
    FINISHED under it; returns the parent and the quantized runs."""
    parents = [r for r in runs if r.data.tags.get("sweep") == "true"]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    parent = parents[0]
    children = [r for r in runs if r is not parent]
    assert {r.data.tags.get("mlflow.parentRunId") for r in children} == {parent.info.run_id}
    assert [r.info.run_name for r in children if r.info.status != "FINISHED"] == []
    assert parent.info.status == "FINISHED", parent.data.tags.get("error")
    backends = {r.data.tags["backend"] for r in children}
    baselines = sorted(r.data.tags["backend"] for r in children if r.data.tags["quantized"] == "false")
    assert baselines == sorted(backends), "exactly one FP32 baseline per backend and sweep"
    runs_quantized = [r for r in children if r.data.tags["quantized"] == "true"]
    assert len(runs_quantized) == quantized, [r.info.run_name for r in runs_quantized]
    assert all(r.data.metrics["accuracy"] >= 0.855 for r in runs_quantized)
    return parent, runs_quantized


def overlapping(runs: list[Run]) -> bool:
    """Whether at least two of the runs were running at the same time."""
    spans = sorted((r.info.start_time, r.info.end_time) for r in runs)
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


def test_joblib_parallel_sweep_loses_no_run(run_cli, tmp_path: Path) -> None:
    """4 configurations, 2 worker processes writing to one SQLite store at the same time."""
    result = run_cli(
        tmp_path,
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "backend=onnx",
        "dtype=int8,u8s8",
        "calib=minmax,percentile",
        "report.enabled=false",
        "layer_analysis=false",
        "mlflow.log_models=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "database is locked" not in result.stderr
    # No helper process is spawned from a loky worker (resnet8ptq/spawning.py): no traceback.
    assert "cannot find context for 'loky'" not in result.stderr and "Traceback" not in result.stderr
    _, quantized = check_sweep(runs_in(tmp_path), quantized=4)
    configurations = {(r.data.params["dtype"], r.data.params["calib"]) for r in quantized}
    assert configurations == {(d, c) for d in ("int8", "u8s8") for c in ("minmax", "percentile")}
    assert overlapping(quantized), "the joblib jobs did not run in parallel"


def test_submitit_local_sweep(run_cli, tmp_path: Path) -> None:
    """2 configurations as submitit jobs (subprocesses that inherit the environment: the parent run id)."""
    lean = ("layer_analysis=false", "mlflow.log_models=false", "report.enabled=false")
    result = run_cli(
        tmp_path, "-m", "hydra/launcher=submitit_local", "backend=onnx", "dtype=int8,uint8", *lean
    )
    assert result.returncode == 0, result.stderr[-3000:]
    check_sweep(runs_in(tmp_path), quantized=2)
    # Each job ran through submitit: its pickled result lies in the sweep's .submitit folder.
    assert len(list((tmp_path / "runs" / "multirun").glob("*/*/.submitit/*/*_result.pkl"))) == 2


def test_ray_local_sweep(
    run_cli, assets_dir: Path, model_cache: Path, canonical_model, tmp_path: Path
) -> None:
    """`hydra/launcher=ray` on a local Ray instance started by the sweep (hydra-ray-launcher).

    Not in requirements.lock: hydra-ray-launcher 1.2.2 (the newest) requires cloudpickle<3, joblib 1.6.0
    (the joblib launcher's) requires cloudpickle>=3, so pip cannot install both. It runs in an environment
    of its own (docs/scaling.md).
    """
    pytest.importorskip(
        "hydra_plugins.hydra_ray_launcher",
        reason="hydra-ray-launcher not installed: it needs cloudpickle<3, the locked joblib 1.6.0 needs >=3",
    )
    env = {k: v for k, v in os.environ.items() if k != PARENT_RUN_ENV and not k.startswith("MLFLOW_")}
    env.update(RESNET8PTQ_ASSETS=str(assets_dir), RESNET8PTQ_CACHE=str(model_cache), RAY_AUTH_MODE="disabled")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = ["-m", "hydra/launcher=ray", "backend=onnx", "dtype=int8,uint8"]
    result = run_cli(tmp_path, *args, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    check_sweep(runs_in(tmp_path), quantized=2)

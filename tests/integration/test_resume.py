"""Resume and stale runs: a sweep killed with SIGKILL is closed (KILLED) by the next invocation, which skips
the configurations that already FINISHED; what `config_hash` covers; how a dead process is recognised."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

import resnet8ptq.config  # noqa: F401  (registers base_config)
from resnet8ptq.backends.onnx.backend import OnnxRuntimeBackend
from resnet8ptq.model import MODEL_FILENAME, conversion_key
from resnet8ptq.resolve import result_identity
from resnet8ptq.tracking.stale import _process_alive, close_stale_runs
from resnet8ptq.tracking.store import store_lock

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SWEEP = (
    "-m",
    "backend=onnx",
    "dtype=int8,uint8",
    "report.enabled=false",
    "layer_analysis=false",
    "mlflow.log_models=false",
)  # lean: not tested


def store(workdir: Path) -> tuple[MlflowClient, str]:
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    with store_lock(uri):  # never while a CLI process creates the store
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("resnet8ptq")
    return client, experiment.experiment_id if experiment else ""


def all_runs(workdir: Path) -> list[Run]:
    client, experiment_id = store(workdir)
    return client.search_runs([experiment_id]) if experiment_id else []


def quantized(runs: list[Run], dtype: str) -> list[Run]:
    return [r for r in runs if r.data.tags.get("quantized") == "true" and r.data.params.get("dtype") == dtype]


def wait_until_second_job_runs(proc: subprocess.Popen, workdir: Path, timeout: float = 600) -> list[Run]:
    """Poll the store until the int8 run FINISHED and the uint8 run is RUNNING (the sweep's second job), as
    one snapshot of the store shows them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before it was killed: {(workdir / 'err.txt').read_text()[-3000:]}")
        runs = all_runs(workdir) if (workdir / "mlflow.db").exists() else []
        done = [r for r in quantized(runs, "int8") if r.info.status == "FINISHED"]
        if done and [r for r in quantized(runs, "uint8") if r.info.status == "RUNNING"]:
            return runs
        time.sleep(0.2)
    pytest.fail("the sweep's second job did not start in time")


def test_killed_sweep_is_closed_and_resumed(
    cli_env: dict[str, str], run_cli, initialised_store: Path, model_cache: Path, tmp_path: Path
) -> None:
    """The sweep calibrates and evaluates afresh (a cache of its own, the converted model only), so that its
    uint8 job runs for seconds, not the moment a cached evaluation takes, and is caught RUNNING."""
    shutil.copy(initialised_store, tmp_path / "mlflow.db")
    cache = shutil.copytree(
        model_cache, tmp_path / "cache", ignore=shutil.ignore_patterns("calib", "algo", "eval")
    )
    sweep = (*SWEEP, f"cache_dir={cache}")
    with (tmp_path / "err.txt").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "run.py"), *sweep], cwd=tmp_path, env=cli_env, stdout=err, stderr=err
        )
        try:
            before = wait_until_second_job_runs(proc, tmp_path)
        finally:
            proc.send_signal(signal.SIGKILL)  # no atexit hook, no `finally`: the runs stay RUNNING
            proc.wait()
    running = [r for r in before if r.info.status == "RUNNING"]
    assert {r.data.tags.get("sweep") for r in running} == {"true", None}  # the parent and the uint8 job
    assert all(r.data.tags["pid"] == str(proc.pid) for r in running)
    assert all(r.data.tags["host"] == socket.gethostname() for r in running)

    resumed = run_cli(tmp_path, *sweep)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Skipping onnx-int8-int8-minmax-pt" in resumed.stdout
    runs = {r.info.run_id: r for r in all_runs(tmp_path)}
    for killed in running:
        after = runs[killed.info.run_id]
        assert after.info.status == "KILLED"
        assert f"process {proc.pid} on {socket.gethostname()}" in after.data.tags["error"]
    assert not [r for r in runs.values() if r.info.status == "RUNNING"]

    int8, uint8 = quantized([*runs.values()], "int8"), quantized([*runs.values()], "uint8")
    assert len(int8) == 1 and int8[0].info.status == "FINISHED", "the finished configuration was not rerun"
    new_uint8 = next(r for r in uint8 if r.info.status == "FINISHED")
    assert (
        new_uint8.data.tags["config_hash"] == next(iter(quantized(running, "uint8"))).data.tags["config_hash"]
    )
    parent = runs[new_uint8.data.tags["mlflow.parentRunId"]]
    assert parent.info.status == "FINISHED"
    assert parent.data.tags[f"skipped.{int8[0].data.tags['config_hash']}"].startswith(
        "onnx-int8-int8-minmax-pt"
    )
    children = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == ["onnx-fp32", "onnx-uint8-uint8-minmax-pt"]

    # Everything done: a third invocation only skips (no runs but its parent, which ends FINISHED).
    again = run_cli(tmp_path, *sweep)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("Skipping onnx-") == 2
    new = [r for r in all_runs(tmp_path) if r.info.run_id not in runs]
    assert len(new) == 1 and new[0].data.tags["sweep"] == "true" and new[0].info.status == "FINISHED"
    assert sorted(k for k in new[0].data.tags if k.startswith("skipped.")) == sorted(
        f"skipped.{r.data.tags['config_hash']}" for r in (int8[0], new_uint8)
    )


# --- config_hash -------------------------------------------------------------------------------------------


def test_identity_is_the_model_content(assets_dir: Path, tmp_path: Path) -> None:
    """model.sha256=null: the file's own sha256 counts, so another .h5 at the same path is another result."""
    h5 = tmp_path / MODEL_FILENAME
    h5.write_bytes((assets_dir / "models" / MODEL_FILENAME).read_bytes())
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"model.path={h5}", "model.sha256=null", f"cache_dir={tmp_path}"])
        official = compose("config")
    onnx = OnnxRuntimeBackend()
    identity = result_identity(cfg, onnx)
    assert (
        identity["model"] == result_identity(official, onnx)["model"] == conversion_key(official.model.sha256)
    )
    assert identity["version.onnxruntime"]
    h5.write_bytes(h5.read_bytes() + b"\0")
    assert result_identity(cfg, onnx)["model"] != identity["model"]
    h5.unlink()
    assert result_identity(cfg, onnx)["model"] == "unknown"  # such a run fails, and is never skipped


# --- stale runs --------------------------------------------------------------------------------------------


def test_dead_and_reused_pids_are_recognised() -> None:
    now_ms = int(time.time() * 1000)
    assert _process_alive(os.getpid(), now_ms)
    # The same pid, but a run that started before this process: the pid was reused, the run's process is gone.
    assert not _process_alive(os.getpid(), now_ms - 10 * 24 * 3600 * 1000)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not _process_alive(child.pid, now_ms)


def test_only_dead_runs_of_this_host_are_closed(
    initialised_store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.copy(initialised_store, tmp_path / "mlflow.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment("stale")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tags = {
        "dead": {"host": socket.gethostname(), "pid": str(dead.pid)},
        "alive": {"host": socket.gethostname(), "pid": str(os.getpid())},
        "elsewhere": {"host": "another-host.example", "pid": str(dead.pid)},
        "untagged": {},
    }
    ids = {
        name: client.create_run(experiment_id, tags=t, run_name=name).info.run_id for name, t in tags.items()
    }
    closed = close_stale_runs(experiment_id, client)
    assert closed == [ids["dead"]]
    status = {name: client.get_run(run_id).info.status for name, run_id in ids.items()}
    assert status == {"dead": "KILLED", "alive": "RUNNING", "elsewhere": "RUNNING", "untagged": "RUNNING"}
    assert "another-host.example" in caplog.text and ids["elsewhere"] in caplog.text

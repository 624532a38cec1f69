"""A shared MLflow tracking server: PostgreSQL backend store, artifacts proxied by the server.

Starts a throw-away PostgreSQL cluster (Debian's `postgresql` package, binaries under
/usr/lib/postgresql/<version>/bin) on 127.0.0.1 with a free port, an `mlflow server` on top of it
(needs `psycopg2-binary`), runs a sweep through the CLI against it and reads the result back over HTTP.
Then the cluster case: a sweep with `hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml, submitit)
submitted to a one-node stand-in for sbatch/srun/sacct that runs each array task with a clean
environment, as `sbatch --export=NONE` does, logging to the same server.
Without the PostgreSQL binaries or psycopg2 the server tests skip, except in CI (`CI` set) where they fail.
The unreachable-server test needs neither.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq.tracking.sweep import PARENT_RUN_ENV
from tests.integration.servers import free_port, mlflow_server, stop, wait_until

pytestmark = [pytest.mark.server, pytest.mark.slow]

QUANTIZED_METRICS = {"accuracy", "accuracy_delta", "model_size_bytes", "size_ratio", "throughput_img_s"}
QUANTIZED_ARTIFACTS = {
    "model/model_quantized.onnx",
    "config/resolved_config.yaml",
    "calibration/calibration_ranges.csv",
    "evaluation/confusion_matrix.png",
}


def missing(message: str) -> None:
    """Skip for a missing prerequisite, but fail in CI, which must provide it."""
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI must provide it)")
    pytest.skip(message)


def postgres_bindir() -> Path | None:
    """The newest Debian PostgreSQL server binaries (package `postgresql`), else initdb on PATH."""
    candidates = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if candidates:
        return candidates[-1]
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass(frozen=True)
class Postgres:
    port: int
    database: str

    @property
    def uri(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{self.database}"


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A fresh PostgreSQL cluster in a temporary directory on 127.0.0.1:<free port> with database `mlflow`.

    PostgreSQL refuses to run as root: as root the server runs as the `postgres` user (which owns the
    directory). Trust authentication on 127.0.0.1 only; fsync off (a throw-away cluster).
    """
    bindir = postgres_bindir()
    if bindir is None:
        missing("PostgreSQL server binaries not found: install the Debian package `postgresql`")
    try:
        import psycopg2
    except ImportError:
        missing("psycopg2 not installed: `pip install psycopg2-binary` (mlflow's PostgreSQL driver)")
    as_root = os.geteuid() == 0
    if as_root:
        try:
            import pwd

            pg_user = pwd.getpwnam("postgres")
        except KeyError:
            missing("running as root but there is no `postgres` user to run PostgreSQL as")
    root = Path(tempfile.mkdtemp(prefix="resnet8ptq-pg-"))  # not under pytest's 0700 root-owned tmp
    data, log = root / "data", root / "postgres.log"
    if as_root:
        os.chown(root, pg_user.pw_uid, pg_user.pw_gid)
    user = {"user": pg_user.pw_uid, "group": pg_user.pw_gid, "extra_groups": []} if as_root else {}
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    process = None
    try:
        subprocess.run(
            [bindir / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            cwd=root,
            env=env,
            capture_output=True,
            check=True,
            timeout=120,
            **user,
        )
        port = free_port()
        with log.open("w") as out:
            if as_root:
                os.chown(log, pg_user.pw_uid, pg_user.pw_gid)
            process = subprocess.Popen(
                [
                    bindir / "postgres",
                    "-D",
                    data,
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-k",
                    root,  # the Unix socket stays in the temporary directory, not /var/run/postgresql
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                ],
                cwd=root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **user,
            )

        def accepting() -> bool:
            try:
                psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres").close()
            except psycopg2.OperationalError:
                return False
            return True

        wait_until(accepting, 120, "PostgreSQL", log, process)
        connection = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("CREATE DATABASE mlflow")
        connection.close()
        yield Postgres(port, "mlflow")
    except subprocess.CalledProcessError as err:
        pytest.fail(f"initdb failed: {err.stderr.decode(errors='replace')[-3000:]}")
    finally:
        if process is not None:
            stop(process, signal.SIGINT)  # PostgreSQL's "fast" shutdown
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Server:
    url: str
    artifacts: Path


@pytest.fixture(scope="module")
def server(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`mlflow server` with the PostgreSQL backend store, proxying artifacts to a local directory."""
    root = tmp_path_factory.mktemp("tracking-server")
    artifacts = root / "artifacts"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    # grace: uvicorn and MLflow's job runner take >10 s to wind down, and there is no state to keep
    with mlflow_server(
        postgres.uri,
        root / "server.log",
        "--artifacts-destination",
        str(artifacts),
        cwd=root,
        env=env,
        grace=5,
    ) as url:
        yield Server(url, artifacts)


@pytest.fixture(scope="module")
def sweep(run_cli, server: Server, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Run]]:
    """`run.py -m backend=onnx dtype=int8,uint8` against the server; every run of the experiment."""
    workdir = tmp_path_factory.mktemp("remote-sweep")
    result = run_cli(workdir, "-m", "backend=onnx", "dtype=int8,uint8", f"mlflow.tracking_uri={server.url}")
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(server.url)
    experiment = client.get_experiment_by_name("resnet8ptq")
    return workdir, client.search_runs([experiment.experiment_id])


def test_nothing_is_tracked_locally(sweep: tuple[Path, list[Run]]) -> None:
    workdir, _ = sweep
    assert not (workdir / "mlflow.db").exists() and not (workdir / "mlruns").exists()


def test_runs_are_in_postgres_grouped_and_finished(sweep: tuple[Path, list[Run]], postgres: Postgres) -> None:
    _, runs = sweep
    parents = [r for r in runs if r.data.tags.get("sweep") == "true"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in runs if r not in parents]
    assert len(children) == 3  # the FP32 baseline + int8 + uint8
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert all(r.info.status == "FINISHED" for r in children)
    assert sorted(r.data.tags["quantized"] for r in children) == ["false", "true", "true"]
    assert sorted(r.data.params["dtype"] for r in children if r.data.tags["quantized"] == "true") == [
        "int8",
        "uint8",
    ]

    import psycopg2

    with (
        contextlib.closing(
            psycopg2.connect(host="127.0.0.1", port=postgres.port, user="postgres", dbname=postgres.database)
        ) as connection,
        connection.cursor() as cursor,
    ):
        cursor.execute("SELECT run_uuid, status FROM runs")
        assert dict(cursor.fetchall()) == {r.info.run_id: r.info.status for r in runs}


def test_metrics_and_artifacts_through_the_server(sweep: tuple[Path, list[Run]], server: Server) -> None:
    _, runs = sweep
    client = MlflowClient(server.url)
    baseline = next(r for r in runs if r.data.tags.get("quantized") == "false")
    assert baseline.data.metrics["accuracy"] == 0.8719
    for run in (r for r in runs if r.data.tags.get("quantized") == "true"):
        assert run.data.metrics.keys() >= QUANTIZED_METRICS
        assert run.data.metrics["accuracy"] >= 0.855
        assert run.info.artifact_uri.startswith("mlflow-artifacts:"), "artifacts must be proxied"
        paths, pending = set(), [None]
        while pending:
            for item in client.list_artifacts(run.info.run_id, pending.pop()):
                (pending.append(item.path) if item.is_dir else paths.add(item.path))
        assert paths >= QUANTIZED_ARTIFACTS
        local = mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id, artifact_path="model/model_quantized.onnx", tracking_uri=server.url
        )
        assert Path(local).stat().st_size == run.data.metrics["model_size_bytes"]
        # The bytes live in the server's --artifacts-destination, uploaded over HTTP by the client.
        stored = list(server.artifacts.rglob(f"{run.info.run_id}/artifacts/model/model_quantized.onnx"))
        assert len(stored) == 1 and stored[0].read_bytes() == Path(local).read_bytes()


def test_unreachable_server_fails_fast_before_any_work(run_cli, tmp_path: Path) -> None:
    """A tracking URI nobody listens on: a clear error naming it, non-zero exit, no data or model touched."""
    uri = f"http://127.0.0.1:{free_port()}"  # bound then closed: nothing listens there
    cache = tmp_path / "fresh-cache"
    for mode in ([], ["-m"]):
        start = time.monotonic()
        result = run_cli(
            tmp_path,
            *mode,
            f"mlflow.tracking_uri={uri}",
            f"data.root={tmp_path / 'no-data'}",
            "data.download=false",
            f"cache_dir={cache}",
            timeout=60,
        )
        elapsed = time.monotonic() - start
        assert result.returncode != 0, result.stderr[-3000:]
        assert elapsed < 20, f"took {elapsed:.1f} s to fail"
        assert uri in result.stderr and "unreachable" in result.stderr, result.stderr[-3000:]
        assert "TrackingError" in result.stderr and "DataError" not in result.stderr
    assert not cache.exists(), "the model cache was touched before the tracking server was checked"
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()


# sbatch / srun / sacct for one node (the tests' own machine): sbatch runs the array's tasks one after the
# other in the background with only FAKE_SLURM_KEEP of the environment (like --export=NONE plus a login
# profile); srun runs its command with SLURM's output patterns; sacct reports the tasks' states.
FAKE_SLURM = r"""#!{python}
import os, re, subprocess, sys
from pathlib import Path

STATE = Path(os.environ.get("FAKE_SLURM_STATE", "."))
KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "RESNET8PTQ_ASSETS", "RESNET8PTQ_CACHE")
tool = Path(sys.argv[0]).name
if sys.argv[1:2] == ["--run"]:  # sbatch's background runner
    job, script, tasks = sys.argv[2], sys.argv[3], sys.argv[4:]  # tasks: array indices, none for one job
    for task in tasks or [None]:
        name = job if task is None else f"{{job}}_{{task}}"
        (STATE / name).write_text("RUNNING")
        env = {{key: os.environ[key] for key in KEEP if key in os.environ}}
        env.update(SLURM_JOB_ID=name.replace("_", "0"), SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1",
                   SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_JOB_NODELIST="node1")
        if task is not None:
            env.update(SLURM_ARRAY_JOB_ID=job, SLURM_ARRAY_TASK_ID=task)
        code = subprocess.run(["bash", script], env=env).returncode
        (STATE / name).write_text("COMPLETED" if code == 0 else "FAILED")
elif tool == "sbatch":
    script = sys.argv[-1]
    array = re.search(r"^#SBATCH --array=(\d+)-(\d+)", open(script).read(), re.M)
    tasks = [str(t) for t in range(int(array[1]), int(array[2]) + 1)] if array else []
    job = str(1000 + len(list(STATE.glob("runner-*"))))
    for name in [f"{{job}}_{{task}}" for task in tasks] or [job]:
        (STATE / name).write_text("PENDING")
    runner = subprocess.Popen([sys.executable, sys.argv[0], "--run", job, script, *tasks],
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (STATE / f"runner-{{job}}.pid").write_text(str(runner.pid))
    print(f"Submitted batch job {{job}}")
elif tool == "srun":
    args, files = sys.argv[1:], {{}}
    while args[0].startswith("--"):
        flag = args.pop(0)
        if flag in ("--output", "--error"):
            files[flag] = args.pop(0)
    subst = {{"%A": "SLURM_ARRAY_JOB_ID", "%a": "SLURM_ARRAY_TASK_ID", "%j": "SLURM_JOB_ID"}}
    for flag, path in files.items():
        for pattern, var in subst.items():
            path = path.replace(pattern, os.environ.get(var, ""))
        files[flag] = open(path.replace("%t", "0"), "a")
    sys.exit(subprocess.run(args, stdout=files.get("--output"), stderr=files.get("--error")).returncode)
elif tool == "sacct":
    jobs = [sys.argv[i + 1] for i, arg in enumerate(sys.argv) if arg == "-j"]
    print("JobID|State|NodeList")
    for path in sorted(STATE.glob("1*")):
        if path.name.split("_")[0] in jobs:
            print(f"{{path.name}}|{{path.read_text()}}|node1")
"""


@pytest.fixture
def fake_slurm(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """sbatch, srun and sacct: yields the directory holding the fake jobs' states and the environment
    variables that put the tools on PATH. Afterwards a task runner still going (a failed test) is ended
    with its jobs (its process group)."""
    bindir, state = tmp_path / "slurm-bin", tmp_path / "slurm-state"
    bindir.mkdir()
    state.mkdir()
    tool = bindir / "fake-slurm"
    tool.write_text(FAKE_SLURM.format(python=sys.executable))
    tool.chmod(0o755)
    for name in ("sbatch", "srun", "sacct"):
        (bindir / name).symlink_to(tool)
    yield state, {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_STATE": str(state)}
    for pid_file in state.glob("runner-*.pid"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)


def test_slurm_sweep_logs_to_the_shared_server(
    run_cli,
    assets_dir: Path,
    model_cache: Path,
    canonical_model,
    server: Server,
    fake_slurm: tuple[Path, dict[str, str]],
    tmp_path: Path,
) -> None:
    """`hydra/launcher=slurm`: one array task per configuration, grouped under the sweep's parent run.

    The tasks run without the submitting environment (no RESNET8PTQ_PARENT_RUN_ID, no MLFLOW_*): the
    parent run id reaches them through the launcher's `setup` lines, the server through the job config.
    """
    state, slurm_env = fake_slurm
    workdir = tmp_path / "cluster"
    workdir.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if k != PARENT_RUN_ENV and not k.startswith("MLFLOW_")},
        "RESNET8PTQ_ASSETS": str(assets_dir),
        "RESNET8PTQ_CACHE": str(model_cache),
        **slurm_env,
    }
    # Configurations the first sweep did not run (a FINISHED configuration may be skipped as done).
    args = ["-m", "hydra/launcher=slurm", "backend=onnx", "dtype=u8s8", "per_channel=false,true"]
    result = run_cli(workdir, *args, f"mlflow.tracking_uri={server.url}", env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in state.glob("*_*")) == ["1000_0", "1000_1"]  # one array, two tasks
    # (submitit returns on the tasks' result files; the runner records the exit a moment later)
    wait_until(lambda: {p.read_text() for p in state.glob("*_*")} <= {"COMPLETED", "FAILED"}, 30, "tasks")
    assert {p.read_text() for p in state.glob("*_*")} == {"COMPLETED"}

    client = MlflowClient(server.url)
    experiment = client.get_experiment_by_name("resnet8ptq")
    sweep_dirs = {str(p.resolve()) for p in (workdir / "runs" / "multirun").glob("*/*")}
    parents = [
        r
        for r in client.search_runs([experiment.experiment_id], "tags.sweep = 'true'")
        if r.data.tags["sweep_dir"] in sweep_dirs
    ]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0].info.run_id
    children = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent}'")
    assert sorted(r.info.run_name for r in children) == [
        "onnx-fp32",
        "onnx-uint8-int8-minmax-pc",
        "onnx-uint8-int8-minmax-pt",
    ]
    assert all(r.info.status == "FINISHED" for r in children)
    assert not (workdir / "mlflow.db").exists()

    # What submitit handed sbatch: the project's resources and the parent run id written into the script.
    (script,) = (workdir / "runs" / "multirun").rglob("*_submission.sh")
    text = script.read_text()
    for line in (
        "#SBATCH --array=0-1%2",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=8GB",
        "#SBATCH --time=30",
        "#SBATCH --job-name=resnet8ptq",
        f"export RESNET8PTQ_PARENT_RUN_ID={parent}",
    ):
        assert line in text.splitlines(), f"{line!r} not in {script}:\n{text}"

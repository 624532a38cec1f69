"""Fixtures of the integration tier: the real CIFAR-10 and model (RESNET8PTQ_ASSETS, default ../shared), the
converted model, an MLflow store, `run.py` run as a user would (forked from a process that has imported the
libraries: tests/integration/cli_zygote.py), and one sweep of the three toolchains that several modules
check."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq.data import BINARY_DIR, Cifar10, calibration_set, load_cifar10, to_model_input
from resnet8ptq.model import MODEL_FILENAME, MODEL_SHA256, CanonicalModel, canonical_onnx, resolve_source
from resnet8ptq.tracking.store import seed_sqlite_store
from resnet8ptq.tracking.sweep import PARENT_RUN_ENV
from tests.integration.cli_zygote import Zygote, needs_fresh_interpreter

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def assets_dir() -> Path:
    """$RESNET8PTQ_ASSETS, else `shared/` beside the repository; must hold cifar-10-batches-bin/."""
    default = REPO.parent / "shared"
    path = Path(os.environ.get("RESNET8PTQ_ASSETS") or default).resolve()
    if not (path / BINARY_DIR).is_dir():
        pytest.fail(
            f"CIFAR-10 test data not found: {path / BINARY_DIR} does not exist. Set RESNET8PTQ_ASSETS to a "
            f"directory containing {BINARY_DIR}/ (default: {default})."
        )
    return path


@pytest.fixture(scope="session")
def cifar(assets_dir: Path) -> Cifar10:
    """The real CIFAR-10, verified and loaded once per test session."""
    return load_cifar10(assets_dir, download=False)


@pytest.fixture(scope="session")
def data(cifar: Cifar10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The default calibration sample (100 per class, seed 42, as `run.py`), the test images as the model
    takes them, and the test labels."""
    calibration, _ = calibration_set(cifar, 100, 42)
    return calibration, to_model_input(cifar.test_images), cifar.test_labels


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cache directory for converted models, shared by the whole test session (converted once)."""
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def canonical_model(assets_dir: Path, model_cache: Path) -> CanonicalModel:
    """The canonical FP32 ONNX model converted from the MLPerf Tiny .h5."""
    h5, sha256 = resolve_source(assets_dir / "models" / MODEL_FILENAME, MODEL_SHA256, model_cache)
    return canonical_onnx(h5, sha256, model_cache)


@pytest.fixture(scope="session")
def initialised_store(tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Path:
    """An MLflow SQLite database with MLflow's tables and no runs, made as the tool makes a new store (a copy
    of the per-machine empty store in the cache directory). Copied into a working directory as `mlflow.db`,
    it is a store as after earlier use; the CLI still creates the `resnet8ptq` experiment there, with its
    artifacts under that directory's ./mlruns."""
    path = tmp_path_factory.mktemp("initialised-store") / "mlflow.db"
    assert seed_sqlite_store(path, model_cache)
    return path


@pytest.fixture(scope="session")
def cli_env(assets_dir: Path, model_cache: Path, canonical_model: CanonicalModel) -> dict[str, str]:
    """The environment `run.py` runs in under test: the test assets, the session's converted model."""
    env = {**os.environ, "RESNET8PTQ_ASSETS": str(assets_dir), "RESNET8PTQ_CACHE": str(model_cache)}
    env.pop(PARENT_RUN_ENV, None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


@pytest.fixture(scope="session")
def cli_zygote(cli_env: dict[str, str]) -> Iterator[Zygote]:
    """A process that has imported the libraries a run imports, and forks `run.py` for each CLI call
    (tests/integration/cli_zygote.py): one per worker, started at its first CLI call."""
    zygote = Zygote(cli_env)
    yield zygote
    zygote.close()


@pytest.fixture(scope="session")
def run_cli(cli_env: dict[str, str], cli_zygote: Zygote):
    """Run `python run.py ARGS` in a working directory, as a user would; return the finished process.
    The environment is `cli_env` unless ``env`` is given. Forked from :func:`cli_zygote`, unless the
    environment changes what is read at start-up or the test asks for a new interpreter (``fresh``)."""

    def run(
        cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900, fresh: bool = False
    ) -> subprocess.CompletedProcess[str]:
        env = cli_env if env is None else env
        if not fresh and not needs_fresh_interpreter(env, cli_zygote.env):
            return cli_zygote.run(list(args), cwd, env, timeout)
        return subprocess.run(
            [sys.executable, str(REPO / "run.py"), *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture(scope="session")
def sweep_store(run_cli, initialised_store: Path, tmp_path_factory: pytest.TempPathFactory):
    """Run `python run.py ARGS` in a new working directory with a store of its own; return the directory
    and its quantized runs, oldest first (the command must succeed)."""

    def sweep(name: str, *args: str) -> tuple[Path, list[Run]]:
        workdir = tmp_path_factory.mktemp(name)
        shutil.copy(initialised_store, workdir / "mlflow.db")
        result = run_cli(workdir, *args)
        assert result.returncode == 0, result.stderr[-3000:]
        client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("resnet8ptq")
        runs = client.search_runs(
            [experiment.experiment_id], "tags.quantized = 'true'", order_by=["attributes.start_time ASC"]
        )
        return workdir, runs

    return sweep


MCU_IMAGES = 1000
TOOLCHAIN_SWEEP = (
    *("-m", "backend=onnx,torch,tflite", "dtype=int8", "per_channel=true", "device=integer"),
    f"mcu.images={MCU_IMAGES}",
)
"""The issue-12 command: the three toolchains' int8 beside MLPerf Tiny's own model; each also on the ideal
integer device (issue 22). TFLite Micro runs the first MCU_IMAGES test images: on all 10,000 it took 280 of
the sweep's 800 s on one core of an AMD EPYC Zen 3 (tests/integration/test_mcu.py checks the cut)."""
REGISTERED = "resnet8-best"


@dataclass
class Sweeps:
    workdir: Path
    client: MlflowClient
    first: Run  # the sweep that ran every configuration
    second: Run  # the same command again: every configuration reused
    children: list[Run]  # the first sweep's runs
    first_log: str


@pytest.fixture(scope="session")
def sweeps(run_cli, initialised_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Sweeps:
    """`run.py` + TOOLCHAIN_SWEEP (registering its most accurate model), then the same command again."""
    workdir = tmp_path_factory.mktemp("toolchains")
    shutil.copy(initialised_store, workdir / "mlflow.db")
    first = run_cli(workdir, *TOOLCHAIN_SWEEP, f"mlflow.register_as={REGISTERED}", timeout=1800)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli(workdir, *TOOLCHAIN_SWEEP, timeout=1800)
    assert second.returncode == 0, second.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet8ptq")
    parents = client.search_runs(
        [experiment.experiment_id], "tags.sweep = 'true'", order_by=["attributes.start_time ASC"]
    )
    assert len(parents) == 2
    children = client.search_runs(
        [experiment.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'"
    )
    return Sweeps(workdir, client, *parents, children, first.stdout + first.stderr)


@pytest.fixture(scope="session")
def onnx_backend(model_cache: Path):
    """Make ONNX Runtime's backend as a run makes it, with its calibration ranges kept in the session's cache
    directory (as `run.py` keeps them in its `cache_dir`): the tests that calibrate the same model on the
    same images in the same way compute the ranges once (resnet8ptq/backends/onnx/calibration_cache.py)."""
    from resnet8ptq.backends.onnx.backend import OnnxRuntimeBackend

    def make(native: bool = True) -> OnnxRuntimeBackend:
        backend = OnnxRuntimeBackend(native=native)
        backend.cache_dir = model_cache
        return backend

    return make

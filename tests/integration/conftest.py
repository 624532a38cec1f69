"""Fixtures of the integration tier: the real CIFAR-10 and model (RESNET8PTQ_ASSETS, default ../shared), the
converted model, an MLflow store, and `run.py` run as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from resnet8ptq.data import BINARY_DIR, Cifar10, load_cifar10
from resnet8ptq.model import MODEL_FILENAME, MODEL_SHA256, CanonicalModel, canonical_onnx, resolve_h5
from resnet8ptq.tracking.sweep import PARENT_RUN_ENV

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
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Cache directory for converted models, shared by the whole test session (converted once)."""
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def canonical_model(assets_dir: Path, model_cache: Path) -> CanonicalModel:
    """The canonical FP32 ONNX model converted from the MLPerf Tiny .h5."""
    h5, sha256 = resolve_h5(assets_dir / "models" / MODEL_FILENAME, MODEL_SHA256, model_cache)
    return canonical_onnx(h5, sha256, model_cache)


@pytest.fixture(scope="session")
def initialised_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite database with MLflow's tables created and no runs. Copied into a working directory
    as `mlflow.db`, it spares a CLI invocation the ~6 s of creating them; the CLI still creates the
    `resnet8ptq` experiment there, with its artifacts under that directory's ./mlruns."""
    path = tmp_path_factory.mktemp("initialised-store") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture(scope="session")
def cli_env(assets_dir: Path, model_cache: Path, canonical_model: CanonicalModel) -> dict[str, str]:
    """The environment `run.py` runs in under test: the test assets, the session's converted model."""
    env = {**os.environ, "RESNET8PTQ_ASSETS": str(assets_dir), "RESNET8PTQ_CACHE": str(model_cache)}
    env.pop(PARENT_RUN_ENV, None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


@pytest.fixture(scope="session")
def run_cli(cli_env: dict[str, str]):
    """Run `python run.py ARGS` in a working directory, as a user would; return the finished process.
    The environment is `cli_env` unless ``env`` is given."""

    def run(
        cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(REPO / "run.py"), *args],
            cwd=cwd,
            env=cli_env if env is None else env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run

"""Determinism: the same configuration run twice, in two processes (with different hash seeds, side by side),
gives the same accuracy and the same quantized model file."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from resnet8ptq.model import CanonicalModel

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def twice(
    commands: list[list[str]], cwds: list[Path], env: dict[str, str]
) -> list[subprocess.CompletedProcess]:
    """Run the commands side by side, each with its own PYTHONHASHSEED (set iteration orders differ)."""

    def one(i: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            commands[i],
            cwd=cwds[i],
            env={**env, "PYTHONHASHSEED": str(i + 1)},
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )

    with ThreadPoolExecutor(len(commands)) as pool:
        results = list(pool.map(one, range(len(commands))))
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return results


def quantized_run(workdir: Path) -> tuple[float, bytes]:
    """(accuracy, quantized model bytes) of the one quantized run in workdir's store."""
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("resnet8ptq").experiment_id
    (run,) = client.search_runs([experiment_id], "tags.quantized = 'true'")
    assert run.info.status == "FINISHED"
    assert run.data.tags["calib.reused"] == "false"  # calibrated in this process
    assert run.data.tags["eval.reused"] == "false"  # and evaluated in it
    local = mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id, artifact_path="model/model_quantized.onnx", tracking_uri=uri
    )
    return run.data.metrics["accuracy"], Path(local).read_bytes()


def test_onnx_runs_are_identical(
    cli_env: dict[str, str], initialised_store: Path, model_cache: Path, tmp_path: Path
) -> None:
    """Each process calibrates itself: a cache directory of its own, the session's converted model without
    any calibration ranges or evaluations (`calib.reused`, `eval.reused` would otherwise hand the second the
    first one's)."""
    args = ["backend=onnx", "dtype=u8s8", "calib=entropy", "per_channel=true", "report.enabled=false"]
    args += ["backend.native=false", "layer_analysis=false", "mlflow.log_models=false"]  # not compared
    workdirs = [tmp_path / "a", tmp_path / "b"]
    commands = []
    for workdir in workdirs:
        workdir.mkdir()
        shutil.copy(initialised_store, workdir / "mlflow.db")
        unshared = shutil.ignore_patterns("calib", "algo", "eval")
        cache = shutil.copytree(model_cache, workdir / "cache", ignore=unshared)
        commands.append([sys.executable, str(REPO / "run.py"), *args, f"cache_dir={cache}"])
    twice(commands, workdirs, cli_env)
    (accuracy_a, model_a), (accuracy_b, model_b) = map(quantized_run, workdirs)
    assert accuracy_a == accuracy_b
    assert hashlib.sha256(model_a).hexdigest() == hashlib.sha256(model_b).hexdigest()


# The torch backend in a fresh process, as the pipeline drives it (the CLI's extra FP32 baseline, runtime form
# and layer analysis would triple the time): prints the reference accuracy and the model file's sha256.
TORCH_RUN = """
import hashlib, json, sys
from pathlib import Path
from hydra import compose, initialize_config_dir
import resnet8ptq.config
from resnet8ptq.config import quant_spec
from resnet8ptq.resolve import make_backend
from resnet8ptq.shared import Shared
from resnet8ptq.data import calibration_set, load_cifar10, to_model_input
from resnet8ptq.evaluate import TestSet, evaluate

conf, assets, onnx_path, workdir, *overrides = sys.argv[1:]
with initialize_config_dir(config_dir=conf, version_base="1.3"):
    cfg = compose("config", overrides=overrides)
data = load_cifar10(assets, download=False)
calibration, _ = calibration_set(data, cfg.data.calib_per_class, cfg.data.seed)
images, labels = to_model_input(data.test_images), data.test_labels
backend = make_backend(cfg, Shared())
quantized = backend.quantize(Path(onnx_path), calibration, quant_spec(cfg), Path(workdir) / "model")
accuracy = evaluate(quantized.reference, TestSet(images, labels)).accuracy
print(json.dumps({"accuracy": accuracy, "sha256": hashlib.sha256(quantized.path.read_bytes()).hexdigest()}))
"""


def test_torch_runs_are_identical(
    cli_env: dict[str, str], assets_dir: Path, canonical_model: CanonicalModel, tmp_path: Path
) -> None:
    pytest.importorskip("torchao")
    commands = [
        [
            sys.executable,
            "-c",
            TORCH_RUN,
            str(REPO / "conf"),
            str(assets_dir),
            str(canonical_model.onnx_path),
            str(tmp_path / name),
            "backend=torch",
            "dtype=int8",
            "per_channel=true",
            "backend.native=false",
        ]
        for name in ("a", "b")
    ]
    results = twice(commands, [REPO, REPO], cli_env)
    a, b = (json.loads(result.stdout.strip().splitlines()[-1]) for result in results)
    assert a["accuracy"] == b["accuracy"] > 0.85
    assert a["sha256"] == b["sha256"]

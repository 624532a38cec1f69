"""End to end through the CLI: a sweep of ORT runs and what MLflow holds afterwards; a lean run (no MLflow
Models, no layer analysis) in a copy of the package with a stage added as one module (resnet8ptq/stages/):
the stage's metric logged, defined, reported and explorable."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from resnet8ptq import hardware
from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.digests import model_digest, predictions_digest, ranges_digest
from resnet8ptq.execution import NATIVE, NATIVE_MISMATCH
from resnet8ptq.spec import TensorRange

pytestmark = pytest.mark.slow

QUANTIZED_METRICS = {
    "accuracy",
    "accuracy_reference",
    "accuracy_delta",
    "model_size_bytes",
    "fp32_size_bytes",
    "size_ratio",
    "throughput_img_s",
    "latency_ms_b1",
    "calib_seconds",
    "quantize_seconds",
    "eval_seconds",
    "layer_analysis_seconds",
    "sqnr_activation_min_db",
    "sqnr_weight_min_db",
    *(f"class_acc/{name}" for name in CLASS_NAMES),
}
QUANTIZED_TAGS = {
    "backend",
    "dtype.activation",
    "dtype.weight",
    "per_channel",
    "calib",
    "quantized",
    "execution",
    "execution_reason",
    "eval.reused",
    "reduce_range",
    "hardware.cpu",
    "hardware.isa",
    "hardware.cores",
    "hardware.kernel_path",
    "git_commit",
    "version.onnxruntime",
    "version.onnx",
    "version.tf2onnx",
    "data.verified",
    "model.sha256",
    "digest.model",
    "digest.calibration_ranges",
    "digest.predictions",
    "config_hash",
    "model_uri",
    "sqnr_worst_layer",
}
QUANTIZED_ARTIFACTS = {
    "model/model_quantized.onnx",
    "config/resolved_config.yaml",
    "calibration/calibration_ranges.csv",
    "evaluation/confusion_matrix.png",
    "evaluation/confusion_matrix.csv",
    "evaluation/class_accuracy.csv",
    "evaluation/class_accuracy.png",
    "analysis/layer_sqnr.csv",
    "analysis/layer_sqnr.png",
}
REPO = Path(__file__).resolve().parents[2]
DTYPES = {"int8": ("int8", "int8"), "uint8": ("uint8", "uint8"), "u8s8": ("uint8", "int8")}


def runs_in(workdir: Path) -> list[Run]:
    """Every run in the MLflow store a bare `mlflow ui` in ``workdir`` would show."""
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet8ptq")
    return client.search_runs([experiment.experiment_id])


def artifact_paths(workdir: Path, run: Run) -> set[str]:
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    paths, pending = set(), [None]
    while pending:
        for item in client.list_artifacts(run.info.run_id, pending.pop()):
            (pending.append(item.path) if item.is_dir else paths.add(item.path))
    return paths


@pytest.fixture(scope="module")
def sweep(run_cli, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Run]]:
    workdir = tmp_path_factory.mktemp("sweep")
    result = run_cli(workdir, "-m", "backend=onnx", "dtype=int8,uint8,u8s8")
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir, runs_in(workdir)


def test_store_is_mlflows_default_location(sweep: tuple[Path, list[Run]]) -> None:
    workdir, runs = sweep
    assert (workdir / "mlflow.db").is_file() and (workdir / "mlruns").is_dir()
    logged = next(r for r in runs if r.data.tags.get("quantized") == "true")
    assert list((workdir / "mlruns").rglob(f"{logged.info.run_id}/artifacts/model/model_quantized.onnx"))
    assert (workdir / "runs" / "multirun").is_dir()


def test_sweep_is_grouped_under_one_parent(sweep: tuple[Path, list[Run]]) -> None:
    _, runs = sweep
    parents = [r for r in runs if r.data.tags.get("sweep") == "true"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in runs if r not in parents]
    assert len(children) == 4  # one FP32 baseline + 3 quantized
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert all(r.info.status == "FINISHED" for r in children)


def test_fp32_baseline_run(sweep: tuple[Path, list[Run]]) -> None:
    _, runs = sweep
    baselines = [r for r in runs if r.data.tags.get("quantized") == "false"]
    assert len(baselines) == 1, "the FP32 baseline is logged once per sweep and backend"
    assert baselines[0].data.metrics["accuracy"] == 0.8719
    assert baselines[0].data.tags["backend"] == "onnx"


def test_quantized_runs_are_complete(sweep: tuple[Path, list[Run]]) -> None:
    workdir, runs = sweep
    fp32 = next(r for r in runs if r.data.tags.get("quantized") == "false").data.metrics["accuracy"]
    quantized = [r for r in runs if r.data.tags.get("quantized") == "true"]
    assert sorted(r.data.params["dtype"] for r in quantized) == sorted(DTYPES)
    for run in quantized:
        metrics, tags = run.data.metrics, run.data.tags
        assert metrics.keys() >= QUANTIZED_METRICS, QUANTIZED_METRICS - metrics.keys()
        assert tags.keys() >= QUANTIZED_TAGS, QUANTIZED_TAGS - tags.keys()
        assert artifact_paths(workdir, run) >= QUANTIZED_ARTIFACTS
        assert metrics["accuracy"] >= 0.855
        assert metrics["accuracy_delta"] == pytest.approx(metrics["accuracy"] - fp32, abs=1e-12)
        assert (tags["dtype.activation"], tags["dtype.weight"]) == DTYPES[run.data.params["dtype"]]
        assert metrics["size_ratio"] == pytest.approx(
            metrics["model_size_bytes"] / metrics["fp32_size_bytes"]
        )
        assert metrics["model_size_bytes"] < 0.5 * metrics["fp32_size_bytes"]
        assert tags["quantized"] == "true" and tags["backend"] == "onnx"
        assert run.data.params["backend"] == "onnx" and run.data.params["per_channel"] == "False"


def test_the_storage_types_share_one_calibration(sweep: tuple[Path, list[Run]]) -> None:
    """The three storage types calibrate the same model on the same images: the ranges are computed once
    (or by an earlier run of this session's cache) and the later runs take them, with the seconds they took
    (`calib.reused`; resnet8ptq/backends/onnx/calibration_cache.py)."""
    _, runs = sweep
    quantized = sorted(
        (r for r in runs if r.data.tags.get("quantized") == "true"), key=lambda r: r.info.start_time
    )
    assert [r.data.tags["calib.reused"] for r in quantized[1:]] == ["true", "true"]
    assert len({r.data.metrics["calib_seconds"] for r in quantized}) == 1
    assert len({r.data.tags["digest.calibration_ranges"] for r in quantized}) == 1


def test_a_new_store_takes_the_evaluations_the_cache_kept(
    run_cli, sweep: tuple[Path, list[Run]], tmp_path: Path
) -> None:
    """The sweep's uint8 configuration again, into a new store with the session's cache: its FP32 baseline
    and its quantized model are not evaluated again (`eval.reused`; resnet8ptq/evaluation_cache.py) and the
    runs hold the sweep's predictions, accuracy, speed and seconds."""
    result = run_cli(tmp_path, "backend=onnx", "dtype=uint8", "report.enabled=false")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Evaluating" not in result.stderr  # no progress bar: no pass over the test set
    again = {r.data.tags["quantized"]: r for r in runs_in(tmp_path) if "quantized" in r.data.tags}
    before = {
        r.data.tags["quantized"]: r
        for r in sweep[1]
        if r.data.tags.get("quantized") == "false" or r.data.params.get("dtype") == "uint8"
    }
    assert again.keys() == before.keys() == {"true", "false"}
    for kind, run in again.items():
        earlier = before[kind]
        assert run.data.tags["eval.reused"] == "true", kind
        assert earlier.data.tags["eval.reused"] in ("true", "false")  # "true": another module's run was first
        assert run.data.tags["digest.predictions"] == earlier.data.tags["digest.predictions"]
        for name in ("accuracy", "throughput_img_s", "latency_ms_b1", "eval_seconds"):
            assert run.data.metrics[name] == earlier.data.metrics[name], (kind, name)
    predictions = [
        pd.read_csv(mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id, artifact_path="evaluation/predictions.csv",
            tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}",
        ))
        for workdir, run in ((tmp_path, again["true"]), (sweep[0], before["true"]))
    ]  # fmt: skip
    assert predictions[0].equals(predictions[1])


def test_every_run_carries_digests_of_what_it_made(sweep: tuple[Path, list[Run]]) -> None:
    """The digests are those of the files the run logged: its model, its predictions, its ranges; the FP32
    run has its model's and predictions'; three quantizations, three model digests."""
    workdir, runs = sweep
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    for run in runs:
        tags, run_id = run.data.tags, run.info.run_id
        if "quantized" not in tags:
            continue  # the parent
        (name,) = [
            item.path for item in client.list_artifacts(run_id, "model") if item.path.endswith(".onnx")
        ]
        assert tags["digest.model"] == model_digest(Path(client.download_artifacts(run_id, name)))
        predicted = pd.read_csv(client.download_artifacts(run_id, "evaluation/predictions.csv"))["predicted"]
        assert tags["digest.predictions"] == predictions_digest(predicted.to_numpy())
        if tags["quantized"] == "true":
            table = pd.read_csv(client.download_artifacts(run_id, "calibration/calibration_ranges.csv"))
            ranges = [TensorRange(r.tensor, r.min, r.max) for r in table.itertuples()]
            assert tags["digest.calibration_ranges"] == ranges_digest(ranges)
    quantized = [r.data.tags["digest.model"] for r in runs if r.data.tags.get("quantized") == "true"]
    assert len(set(quantized)) == len(quantized) == 3


def test_every_run_records_the_hardware(sweep: tuple[Path, list[Run]]) -> None:
    _, runs = sweep
    assert len(runs) == 5  # parent, FP32 baseline, 3 quantized
    for run in runs:
        assert {
            k: v for k, v in run.data.tags.items() if k.startswith("hardware.")
        } == hardware.detect().tags()


def test_reference_and_native_accuracy(sweep: tuple[Path, list[Run]]) -> None:
    """`accuracy` is the reference semantics; where ORT's fused integer kernels ran, their accuracy and gap
    are logged and `execution` says whether they matched. Without an int8 dot product (AVX2), ORT's
    uint8 x int8 kernels saturate on this model (measured: -1.39 points) and the run says so."""
    _, runs = sweep
    quantized = {r.data.params["dtype"]: r for r in runs if r.data.tags.get("quantized") == "true"}
    for dtype, run in quantized.items():
        metrics, tags = run.data.metrics, run.data.tags
        assert metrics["accuracy"] == metrics["accuracy_reference"]
        assert tags["execution"] in (NATIVE, NATIVE_MISMATCH), (dtype, tags["execution_reason"])
        assert "integer kernels" in tags["execution_reason"]
        gap = metrics["kernel_gap_points"]
        assert gap == pytest.approx(100 * (metrics["accuracy_native"] - metrics["accuracy"]), abs=1e-6)
        assert (tags["execution"] == NATIVE) == (abs(gap) <= 0.3), (dtype, gap)
    for dtype in ("int8", "uint8"):  # no saturating u8 x s8 pairs: the kernels match on every CPU
        assert quantized[dtype].data.tags["execution"] == NATIVE, quantized[dtype].data.tags[
            "execution_reason"
        ]
    u8s8 = quantized["u8s8"].data.tags
    if hardware.detect().has_int8_dot_product:
        assert u8s8["execution"] == NATIVE, u8s8["execution_reason"]
    else:
        assert u8s8["execution"] == NATIVE_MISMATCH, u8s8["execution_reason"]
        assert "vpmaddubsw" in u8s8["execution_reason"] and "reduce_range=true" in u8s8["execution_reason"]


def test_logged_model_is_the_measured_file(sweep: tuple[Path, list[Run]]) -> None:
    workdir, runs = sweep
    run = next(r for r in runs if r.data.tags.get("quantized") == "true")
    local = mlflow.artifacts.download_artifacts(
        run_id=run.info.run_id,
        artifact_path="model/model_quantized.onnx",
        tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}",
    )
    assert Path(local).stat().st_size == run.data.metrics["model_size_bytes"]


def test_class_accuracies_average_to_accuracy(sweep: tuple[Path, list[Run]]) -> None:
    _, runs = sweep
    for run in runs:
        if "accuracy" in run.data.metrics:
            per_class = [run.data.metrics[f"class_acc/{name}"] for name in CLASS_NAMES]
            assert sum(per_class) / 10 == pytest.approx(run.data.metrics["accuracy"], abs=1e-12)


def test_failed_run_ends_failed_with_the_error(run_cli, tmp_path: Path) -> None:
    result = run_cli(tmp_path, "data.root=/nonexistent/cifar", "data.download=false")
    assert result.returncode != 0
    assert "/nonexistent/cifar" in result.stderr
    runs = runs_in(tmp_path)
    assert {r.info.status for r in runs} == {"FAILED"}
    child = next(r for r in runs if r.data.tags.get("quantized") == "true")
    assert "DataError" in child.data.tags["error"] and "/nonexistent/cifar" in child.data.tags["error"]


TOY = '''
"""A toy stage: the share of test images the quantized model predicts as an airplane."""

import numpy as np

from resnet8ptq.stages import Stage, StageResult


class ToyStage(Stage):
    name = "toy"
    order = 45  # after the device, before the microcontroller
    metrics = {"toy_airplane_share": "share of the test images predicted as airplane (a toy stage)"}
    tags = {"toy.seen": "how many predictions the toy stage read"}

    def run(self, inputs, record):
        predictions = record["quantize"].made.result.reference.predictions
        assert len(inputs.test_labels) == len(predictions)
        share = float(np.mean(predictions == 0))
        return StageResult({"toy_airplane_share": share}, {"toy.seen": str(len(predictions))})


STAGE = ToyStage()
'''

PROBE = """
import json, sys
from pathlib import Path

import pandas as pd
from mlflow.tracking import MlflowClient

import resnet8ptq.explore as ex
from resnet8ptq.stages import registered
from resnet8ptq.tracking import schema

client = MlflowClient(f"sqlite:///{sys.argv[1]}/mlflow.db")
experiment = client.get_experiment_by_name("resnet8ptq")
runs = client.search_runs([experiment.experiment_id])
quantized = next(r for r in runs if r.data.tags.get("quantized") == "true" and "reference" not in r.data.tags)
fp32 = next(r for r in runs if r.data.tags.get("quantized") == "false")
predictions = pd.read_csv(client.download_artifacts(quantized.info.run_id, "evaluation/predictions.csv"))
table = ex.runs_table([r for r in runs if r.data.tags.get("sweep") != "true"])
print(json.dumps({
    "stages": [stage.name for stage in registered()],
    "metric": quantized.data.metrics.get("toy_airplane_share"),
    "airplane_share": float((predictions["predicted"] == 0).mean()),
    "tag": quantized.data.tags.get("toy.seen"),
    "fp32_has_it": "toy_airplane_share" in fp32.data.metrics,
    "undefined": schema.undefined("metric", set(quantized.data.metrics)) + schema.undefined(
        "tag", {t for t in quantized.data.tags if not t.startswith("mlflow.")}
    ),
    "columns": ex.table_columns(table),
    "report": (Path(sys.argv[2]) / "report.md").read_text(),
}))
"""


@pytest.fixture(scope="module")
def lean_run(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """`run.py -m backend=onnx mlflow.log_models=false layer_analysis=false` in a copy of the package (with
    run.py and conf/) that has a toy stage added to ``resnet8ptq/stages/`` and nothing else changed: the run's
    working directory, and what the probe read back (the stages, the toy's metric and tag, the report, the
    explorer's columns)."""
    root = tmp_path_factory.mktemp("copy")
    shutil.copytree(REPO / "resnet8ptq", root / "resnet8ptq", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "conf", root / "conf")
    shutil.copy(REPO / "run.py", root / "run.py")
    (root / "resnet8ptq" / "stages" / "toy.py").write_text(textwrap.dedent(TOY))
    (root / "probe.py").write_text(PROBE)
    work = tmp_path_factory.mktemp("lean")
    env = {**cli_env, "PYTHONPATH": str(root)}
    args = ["-m", "backend=onnx", "mlflow.log_models=false", "layer_analysis=false", "hydra.sweep.dir=sweep"]
    done = subprocess.run(
        [sys.executable, str(root / "run.py"), *args], cwd=work, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    probe = subprocess.run(
        [sys.executable, str(root / "probe.py"), str(work), str(work / "sweep")],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    return work, json.loads(probe.stdout.strip().splitlines()[-1])


def test_lean_run_skips_the_mlflow_models_and_the_layer_analysis(
    lean_run: tuple[Path, dict], sweep: tuple[Path, list[Run]]
) -> None:
    """`mlflow.log_models=false layer_analysis=false`: the same evaluation, the model file as an artifact and
    the datasets as inputs, but no MLflow Model (LoggedModel, `model_uri`) and no per-layer SQNR."""
    workdir = lean_run[0]
    runs = runs_in(workdir)
    assert {r.info.status for r in runs} == {"FINISHED"}
    quantized = next(r for r in runs if r.data.tags.get("quantized") == "true")
    fp32 = next(r for r in runs if r.data.tags.get("quantized") == "false")
    lean_metrics = {"layer_analysis_seconds", "sqnr_activation_min_db", "sqnr_weight_min_db"}
    assert quantized.data.metrics.keys() >= QUANTIZED_METRICS - lean_metrics
    assert not quantized.data.metrics.keys() & lean_metrics
    default = next(r for r in sweep[1] if r.data.params.get("dtype") == "int8")  # same settings, full records
    assert quantized.data.metrics["accuracy"] == default.data.metrics["accuracy"]  # the same work
    for run in (quantized, fp32):
        assert "model_uri" not in run.data.tags and "sqnr_worst_layer" not in run.data.tags
        assert {i.dataset.name for i in run.inputs.dataset_inputs} >= {"cifar10-test"}
    paths = artifact_paths(workdir, quantized)
    assert paths >= QUANTIZED_ARTIFACTS - {"analysis/layer_sqnr.csv", "analysis/layer_sqnr.png"}
    assert not {p for p in paths if "layer_sqnr" in p}
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    assert client.search_logged_models([quantized.info.experiment_id]) == []


def test_the_added_stage_runs_in_its_order_and_logs_its_result(lean_run: tuple[Path, dict]) -> None:
    found = lean_run[1]
    assert found["stages"] == ["fp32", "published", "quantize", "layers", "device", "costs", "toy", "mcu"]
    assert found["metric"] == pytest.approx(found["airplane_share"]) and 0 < found["metric"] < 1
    assert found["tag"] == "10000"
    assert not found["fp32_has_it"]  # the FP32 baseline's run is not a stage's run


def test_the_schema_defines_what_the_added_stage_declares(lean_run: tuple[Path, dict]) -> None:
    assert lean_run[1]["undefined"] == []


def test_the_added_stage_is_reported_and_explorable(lean_run: tuple[Path, dict]) -> None:
    found = lean_run[1]
    section = found["report"].split("## Added stages")[1].split("\n## ")[0]
    assert "share of the test images predicted as airplane" in section
    assert f"| onnx int8 minmax | {found['metric']:.4g} |" in section
    assert "toy_airplane_share" in found["columns"]

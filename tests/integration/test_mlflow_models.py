"""MLflow the way its users expect it, after a real sweep of the three toolchains run twice (`sweeps`, in
conftest): every run's model logged as an MLflow Model that predicts what the run measured (and serves over
HTTP), the datasets as run inputs, the parent run named after its overrides, a resumed sweep that still
reports everything, the recommended model in the Model Registry."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow.entities import Run

from resnet8ptq.data import Cifar10, to_model_input
from resnet8ptq.tracking import schema
from resnet8ptq.tracking.store import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG
from tests.integration.conftest import REGISTERED, TOOLCHAIN_SWEEP, Sweeps
from tests.integration.servers import free_port, served

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def test_images(cifar: Cifar10) -> tuple[np.ndarray, np.ndarray]:
    return to_model_input(cifar.test_images), np.asarray(cifar.test_labels)


def published(run: Run) -> bool:
    """A published model's run (MLPerf Tiny's own int8 .tflite), not a configuration of the sweep."""
    return "reference" in run.data.tags


def probabilities(output: object) -> np.ndarray:
    """A pyfunc's output as an array: mlflow.onnx returns {output name: array}, the .pt2 pyfunc an array."""
    if isinstance(output, dict):
        (output,) = output.values()
    return np.asarray(output)


def test_parent_runs_are_named_from_their_overrides(sweeps: Sweeps) -> None:
    for parent in (sweeps.first, sweeps.second):
        name, _, clock = parent.info.run_name.rpartition(" @ ")
        assert name.startswith(" ".join(TOOLCHAIN_SWEEP[1:])), parent.info.run_name
        assert len(clock) == 5 and clock[2] == ":", parent.info.run_name


def test_experiment_opens_on_its_runs(sweeps: Sweeps) -> None:
    experiment = sweeps.client.get_experiment(sweeps.first.info.experiment_id)
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    link = f"#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning"
    assert link in sweeps.first_log, "the sweep prints where the UI shows its runs"


def test_every_run_logs_a_model_that_predicts_what_the_run_measured(
    sweeps: Sweeps, test_images, recwarn: pytest.WarningsRecorder
) -> None:
    """ONNX models load as mlflow.onnx pyfuncs, which run ORT with all optimisations, and .tflite models as
    pyfuncs on LiteRT's default kernels: the runtime form, so they reproduce `accuracy_native` where integer
    kernels ran. The .pt2 pyfunc runs the program eagerly: the reference semantics, `accuracy`. The model
    carries the run's metrics and links back to it."""
    images, labels = test_images
    mlflow.set_tracking_uri(f"sqlite:///{sweeps.workdir / 'mlflow.db'}")
    assert len(sweeps.children) == 7, "3 FP32, 3 quantized, MLPerf Tiny's published int8 model"
    for run in sweeps.children:
        metrics, uri = run.data.metrics, run.data.tags["model_uri"]
        model = mlflow.pyfunc.load_model(uri)
        accuracy = float(np.mean(probabilities(model.predict(images)).argmax(axis=1) == labels))
        runtime = run.data.tags["backend"] in ("onnx", "tflite") and "accuracy_native" in metrics
        expected = metrics["accuracy_native"] if runtime else metrics["accuracy"]
        assert accuracy == expected, (run.info.run_name, accuracy, expected)
        logged = sweeps.client.get_logged_model(uri.removeprefix("models:/"))
        assert logged.source_run_id == run.info.run_id and logged.name == run.info.run_name
        assert {m.key: m.value for m in logged.metrics}["accuracy"] == metrics["accuracy"]
        assert model.metadata.get_input_schema().inputs[0].shape == (-1, 32, 32, 3)
    # The pyfuncs' predict takes np.ndarray (a type hint MLflow documents as "no schema inference"): MLflow
    # does not warn, on loading them, that type hints are missing.
    assert not [w for w in recwarn if "Add type hints" in str(w.message)]


@pytest.mark.server
def test_onnx_model_serves_over_http(sweeps: Sweeps, test_images, tmp_path: Path) -> None:
    run = next(
        r for r in sweeps.children if r.data.tags["backend"] == "onnx" and r.data.tags["quantized"] == "true"
    )
    uri, port, log = run.data.tags["model_uri"], free_port(), tmp_path / "serve.log"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{sweeps.workdir / 'mlflow.db'}",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # it runs uvicorn
    }
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager", "local"]
    url = f"http://127.0.0.1:{port}"
    arguments = [*command, "-h", "127.0.0.1", "-p", str(port)]
    with served(arguments, log, f"{url}/ping", f"mlflow models serve on {url}", sweeps.workdir, env):
        images = test_images[0][:8]
        request = urllib.request.Request(
            f"{url}/invocations",
            data=json.dumps({"inputs": images.tolist()}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answered = probabilities(json.loads(response.read())["predictions"])
    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    local = probabilities(mlflow.pyfunc.load_model(uri).predict(images))
    np.testing.assert_allclose(answered, local, rtol=1e-5, atol=1e-6)


def test_datasets_are_run_inputs(sweeps: Sweeps) -> None:
    for run in sweeps.children:
        inputs = {
            next(t.value for t in d.tags if t.key == "mlflow.data.context"): d.dataset
            for d in run.inputs.dataset_inputs
        }
        calibrated = run.data.tags["quantized"] == "true" and not published(run)
        expected = {"evaluation", "calibration"} if calibrated else {"evaluation"}
        assert set(inputs) == expected, run.info.run_name
        assert inputs["evaluation"].name == "cifar10-test"
        if "calibration" in inputs:
            assert inputs["calibration"].name == "cifar10-train-calibration-100x10-seed42"
            assert inputs["calibration"].digest != inputs["evaluation"].digest
    digests = {d.dataset.digest for r in sweeps.children for d in r.inputs.dataset_inputs}
    assert len(digests) == 2, "the same data has the same digest in every run"


def test_resumed_sweep_reports_everything_it_covers(sweeps: Sweeps) -> None:
    second = sweeps.second
    assert second.info.status == "FINISHED"
    experiment_id = second.info.experiment_id
    assert not sweeps.client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{second.info.run_id}'")
    reused = {v for k, v in second.data.tags.items() if k.startswith("reused.")}
    quantized = {
        r.info.run_id for r in sweeps.children if r.data.tags["quantized"] == "true" and not published(r)
    }
    assert reused == quantized
    report = (Path(second.data.tags["sweep_dir"]) / "report.md").read_text()
    assert "Nothing to report" not in report
    assert "reused from earlier sweeps: 3 configurations that had already FINISHED" in report
    for backend in ("onnx", "torch", "tflite"):
        for label in (f"{backend} fp32", f"{backend} int8 minmax per-channel @int"):  # on the integer device
            assert f"| {label} |" in report, label
    assert "| mlperf int8 (published) |" in report, "the earlier sweep's published model's run, reused"


def test_most_accurate_model_is_registered(sweeps: Sweeps) -> None:
    (version,) = sweeps.client.search_model_versions(f"name = '{REGISTERED}'")
    quantized = [r for r in sweeps.children if r.data.tags["quantized"] == "true" and not published(r)]
    # The report's Best accuracy: in this device sweep (device=integer), the accuracy on the device.
    best = max(quantized, key=lambda r: r.data.metrics["accuracy_device"])
    assert version.tags["source_run"] == best.info.run_id
    assert version.source == best.data.tags["model_uri"]
    assert sweeps.first.data.tags["registered_model"].startswith(f"{REGISTERED} version 1")


def _artifact_paths(client: mlflow.MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    paths = set()
    for item in client.list_artifacts(run_id, path):
        paths |= _artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return paths


def test_every_name_the_runs_wrote_is_in_the_schema(sweeps: Sweeps) -> None:
    """Every metric, tag (MLflow's own aside) and artifact path of every run of both sweeps (parents, FP32
    baselines, quantized, device and microcontroller runs, MLPerf's published model) is defined in
    resnet8ptq/tracking/schema.py, which docs/mlflow.md lists (tests/unit/test_schema.py)."""
    runs = sweeps.client.search_runs([sweeps.first.info.experiment_id])
    written: dict[str, set[str]] = {"metric": set(), "tag": set(), "artifact": set()}
    for run in runs:
        written["metric"] |= set(run.data.metrics)
        written["tag"] |= {tag for tag in run.data.tags if not tag.startswith("mlflow.")}
        written["artifact"] |= _artifact_paths(sweeps.client, run.info.run_id)
    assert len(runs) >= len(sweeps.children) + 2 and all(written.values())  # the children and both parents
    assert {kind: schema.undefined(kind, names) for kind, names in written.items()} == {
        "metric": [],
        "tag": [],
        "artifact": [],
    }

"""The repository's second CIFAR-10 network (model=dscnn: depthwise-separable blocks, ReLU6, max pooling;
trained by scripts/train_dscnn_cifar10.py) on real data through the three toolchains and the integer device:
each toolchain's int8 model within 1.5 points of its FP32 model, and the integer device as close to each
toolchain's reference as it is for ResNet8 (tests/integration/test_device.py): exact for TFLite, a few near
ties for ONNX Runtime's and PyTorch's float references. The microcontroller path, the layer analysis and
the MLflow Models are left out (ResNet8's tests cover them) to keep CI short."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.test_device import DIFFERING_LIMITS

SWEEP = ("-m", "model=dscnn", "backend=onnx,torch,tflite", "dtype=int8", "per_channel=true", "device=integer")
QUICK = ("mcu.enabled=false", "layer_analysis=false", "mlflow.log_models=false", "report.enabled=false")


@pytest.fixture(scope="module")
def dscnn_runs(run_cli, initialised_store: Path, tmp_path_factory: pytest.TempPathFactory) -> list:
    workdir = tmp_path_factory.mktemp("dscnn")
    shutil.copy(initialised_store, workdir / "mlflow.db")
    result = run_cli(workdir, *SWEEP, *QUICK)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet8ptq")
    return client.search_runs([experiment.experiment_id], "tags.model = 'dscnn'")


def test_each_toolchain_keeps_the_networks_accuracy(dscnn_runs: list) -> None:
    fp32 = {run.data.tags["backend"]: run for run in dscnn_runs if run.data.tags["quantized"] == "false"}
    quantized = {run.data.tags["backend"]: run for run in dscnn_runs if run.data.tags["quantized"] == "true"}
    assert set(fp32) == set(quantized) == {"onnx", "torch", "tflite"}
    for backend, run in quantized.items():
        baseline = fp32[backend].data.metrics["accuracy"]
        assert baseline > 0.7, f"{backend}: FP32 {baseline}"  # the trained network, not a broken conversion
        drop = baseline - run.data.metrics["accuracy"]
        assert drop < 0.015, f"{backend}: int8 {run.data.metrics['accuracy']} vs FP32 {baseline}"
    onnx_fp32, torch_fp32 = fp32["onnx"].data.metrics["accuracy"], fp32["torch"].data.metrics["accuracy"]
    assert abs(onnx_fp32 - torch_fp32) < 0.001  # one canonical model in both


def test_the_integer_device_agrees_with_each_toolchains_reference(dscnn_runs: list) -> None:
    """As for ResNet8: TFLite's reference kernels exactly; ORT's and PyTorch's float references up to near
    ties (measured 10 and 46 of 10,000 predictions on an AMD EPYC Zen 3), within half a point."""
    for run in dscnn_runs:
        if run.data.tags["quantized"] == "true":
            metrics, backend = run.data.metrics, run.data.tags["backend"]
            if backend == "tflite":
                assert metrics["device_differing_predictions"] == 0
                assert metrics["accuracy_device"] == metrics["accuracy"]
            else:
                assert metrics["device_differing_predictions"] <= DIFFERING_LIMITS[backend], backend
                assert round(abs(metrics["accuracy_device"] - metrics["accuracy"]), 6) <= 0.005

"""A crossbar sweep on the real model (issue 22): one quantization, several devices; the ADC's bits decide the
device's accuracy. Its own module, so that it runs in another xdist worker than the shared sweep."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

CIM_SWEEP = (
    "-m",
    "backend=onnx",
    "dtype=int8",
    "per_channel=true",
    "device=cim",
    "device.rows=128",
    "device.adc_bits=4,8",
    "layer_analysis=false",
    "mlflow.log_models=false",
)


@pytest.fixture(scope="module")
def cim_runs(run_cli, initialised_store: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Run]:
    workdir = tmp_path_factory.mktemp("cim")
    shutil.copy(initialised_store, workdir / "mlflow.db")
    result = run_cli(workdir, *CIM_SWEEP)
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet8ptq")
    runs = client.search_runs(
        [experiment.experiment_id], "tags.quantized = 'true'", order_by=["attributes.start_time ASC"]
    )
    return runs


def test_a_device_sweep_quantizes_once(cim_runs: list[Run]) -> None:
    first, second = cim_runs
    assert [r.data.tags["device.adc_bits"] for r in cim_runs] == ["4", "8"]
    assert second.data.tags["device.quantization_run"] == first.info.run_name
    assert "device.quantization_run" not in first.data.tags
    for key in ("quantize_seconds", "calib_seconds", "accuracy"):
        assert first.data.metrics[key] == second.data.metrics[key]
    assert first.data.tags["config_hash"] != second.data.tags["config_hash"]


def test_adc_bits_decide_the_device_accuracy(cim_runs: list[Run]) -> None:
    """A 4-bit ADC over 128-row partial sums loses most of the accuracy; 8 bits keep it within 2 points."""
    coarse, fine = (r.data.metrics for r in cim_runs)
    assert coarse["accuracy_device"] < fine["accuracy_device"] - 0.1
    assert fine["accuracy_device"] > fine["accuracy"] - 0.02

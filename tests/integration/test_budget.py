"""Mixed precision under a bit-operations budget through the CLI, on the real model and data: uniform W4A4 and
the mix chosen for W4A4's own BOPs in both backends (the same mix, its widths read back from each saved model,
within the budget, its sensitivity logged), the report's Pareto plot, and budgets refused before any work
(the other refusals, e.g. a budget beside `target.max_drop_points`: tests/unit/test_budget.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow

W4A4_BOPS = 221_290_496  # ResNet8 with the first and last layers at 8 bits, the rest W4A4 (tests/unit)
W4A4_WEIGHT_BITS = 313_728
SUM_ORDER = 1e-12  # relative: float sums of the same 14 positive terms in two orders differ by ~1e-16 each
BUDGET = (
    "-m",
    "backend=onnx,torch",
    "backend.native=false",
    "dtype=u8s8",
    "per_channel=true",
    "calib=mse",
    "dtype.weight_bits=4",
    "dtype.activation_bits=4",
    "dtype.first_last_bits=8",
    f"target.max_bops=null,{W4A4_BOPS}",
    "target.weight_choices=[2,4,8]",
    "target.activation_choices=[4,8]",
    "data.calib_per_class=20",
    "mlflow.log_models=false",
    "layer_analysis=false",
)


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def quantized_runs(workdir: Path) -> list[Run]:
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet8ptq")
    return client.search_runs([experiment.experiment_id], "tags.quantized = 'true'", max_results=100)


@pytest.fixture(scope="module")
def budget_sweep(
    run_cli, initialised_store: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str], dict[tuple[str, bool], Run]]:
    """The sweep; its quantized runs by (backend, budgeted)."""
    workdir = tmp_path_factory.mktemp("budget")
    shutil.copy(initialised_store, workdir / "mlflow.db")
    result = ok(run_cli(workdir, *BUDGET, timeout=1200))
    runs = {
        (r.data.tags["backend"], "mixed_precision.budget" in r.data.tags): r for r in quantized_runs(workdir)
    }
    assert sorted(runs) == [("onnx", False), ("onnx", True), ("torch", False), ("torch", True)]
    return workdir, result, runs


def test_every_run_logs_its_weight_memory_and_bops(budget_sweep) -> None:
    _, _, runs = budget_sweep
    for backend in ("onnx", "torch"):
        uniform = runs[backend, False].data
        assert (uniform.metrics["bops"], uniform.metrics["weight_memory_bits"]) == (
            W4A4_BOPS,
            W4A4_WEIGHT_BITS,
        )
        assert "layer_bits" not in uniform.tags


def test_both_backends_hold_the_same_mix_within_the_budget(budget_sweep) -> None:
    """One sensitivity measurement (the second backend reuses it), one mix of every conv/gemm weight but the
    first and last and every input they read, each backend's saved model read back at those widths, at most
    W4A4's BOPs."""
    _, result, runs = budget_sweep
    onnx_mix, torch_mix = runs["onnx", True].data, runs["torch", True].data
    assert onnx_mix.tags["mixed_precision.budget"] == f"bops<={W4A4_BOPS}"
    chosen = {
        k.removeprefix("layer_bits."): v for k, v in onnx_mix.params.items() if k.startswith("layer_bits.")
    }
    assert chosen == {k.removeprefix("layer_bits."): v for k, v in torch_mix.params.items()
                      if k.startswith("layer_bits.")}  # fmt: skip
    weights = {layer for layer in chosen if layer.startswith("conv2d_")}
    assert weights == {
        f"conv2d_{i}_{j}" for i, j in ((1, 2), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1))
    }
    assert len(chosen) - len(weights) == int(onnx_mix.tags["mixed_precision.candidates"]) - len(weights) == 6
    for mix in (onnx_mix, torch_mix):
        assert mix.metrics["bops"] <= W4A4_BOPS
        read_back = dict(item.split("=") for item in mix.tags["layer_bits"].split(", "))
        assert {layer: read_back[layer] for layer in chosen} == chosen
    assert "Sensitivity: reusing" in result.stdout + result.stderr


def test_a_mix_of_the_uniform_widths_is_the_uniform_model(budget_sweep) -> None:
    """With widths {2, 4, 8}, W4A4's BOPs leave no better mix than W4A4 itself (a layer at 8 bits needs
    another at 2, whose noise is far larger): every layer of the mix is at 4 bits, and each backend's model
    quantized through `layer_bits` has exactly the accuracy of its uniform W4A4 model."""
    _, _, runs = budget_sweep
    for backend in ("onnx", "torch"):
        mix, uniform = runs[backend, True].data, runs[backend, False].data
        assert {v for k, v in mix.params.items() if k.startswith("layer_bits.")} == {"4"}
        assert mix.metrics["accuracy"] == uniform.metrics["accuracy"]
        assert mix.tags["config_hash"] != uniform.tags["config_hash"]


def test_the_sensitivity_is_logged_and_predicts_no_more_noise_than_uniform(budget_sweep) -> None:
    workdir, _, runs = budget_sweep
    mix = runs["onnx", True]
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    table = pd.read_csv(client.download_artifacts(mix.info.run_id, "analysis/sensitivity.csv"))
    assert set(table.columns) == {"layer", "kind", "bits", "noise"}
    assert set(table.loc[table["kind"] == "weight", "bits"]) == {2, 4, 8}
    assert set(table.loc[table["kind"] == "activation", "bits"]) == {4, 8}
    assert len(table) == 8 * 3 + 6 * 2  # 8 weights, 6 conv inputs (first and last layers at 8 bits)
    by_width = table.pivot(index="layer", columns="bits", values="noise")
    assert (by_width[4] > by_width[8]).all(), "fewer bits, more noise, in every layer"
    predicted = float(mix.data.tags["mixed_precision.predicted_noise"])  # logged at full precision (repr)
    chosen = {k.removeprefix("layer_bits."): int(v) for k, v in mix.data.params.items()
              if k.startswith("layer_bits.")}  # fmt: skip
    noise = table.set_index(["layer", "bits"])["noise"]
    assert predicted == pytest.approx(sum(noise[item] for item in chosen.items()), rel=SUM_ORDER)
    uniform = table[table["bits"] == 4]["noise"].sum()
    # No noisier than uniform, up to the rounding of two float sums of the same terms in other orders.
    assert predicted <= uniform * (1 + SUM_ORDER)


def test_the_report_draws_the_budget_pareto_plot(budget_sweep) -> None:
    workdir, _, _ = budget_sweep
    reports = list(workdir.glob("runs/multirun/*/*/report.md"))
    assert len(reports) == 1
    text = reports[0].read_text()
    assert "## Mixed precision under a budget" in text
    assert text.count("| bops<=221290496 |") == 2 and text.count("| uniform |") == 2
    assert (reports[0].parent / "report_budget.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("backend=onnx", "target.max_bops=1e6"), "target.max_bops=1e+06: no mix fits"),
        (("backend=tflite", "target.max_weight_bits=4e5"), "no layer of its own width (layer_bits)"),
    ],
)
def test_a_budget_is_refused_before_any_work(
    run_cli, initialised_store: Path, tmp_path: Path, overrides: tuple[str, ...], message: str
) -> None:
    shutil.copy(initialised_store, tmp_path / "mlflow.db")
    result = run_cli(tmp_path, *overrides, "dtype=int8", "report.enabled=false")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert "sensitivity" not in result.stderr.lower().replace("sensitivity.csv", "")
    assert quantized_runs(tmp_path) == []

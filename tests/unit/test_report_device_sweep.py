"""A device sweep's report speaks of the device (issue 41): `device=cim device.rows=128 device.adc_bits=4,8`
on one quantized model (reference 86.96 %), whose 4-bit ADCs give 13.72 % on the device, read back from a
real (SQLite) MLflow store with every run's predictions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from resnet8ptq.artifacts import EVALUATION_DIR, PREDICTIONS_FILE
from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.report import analysis, runs, sections, significance
from resnet8ptq.report import writer as report
from resnet8ptq.statistics import mcnemar
from tests.unit.test_report import AVX2, _log, _metrics, _run
from tests.unit.test_report_device import device_tags

pytestmark = pytest.mark.device

IMAGES = 10_000
RNG = np.random.default_rng(41)
LABELS = RNG.integers(0, 10, IMAGES)
MODEL = "onnx int8 minmax per-channel"
REFERENCE = 0.8696
# name -> (device tags, accuracy on the device, std over noise draws)
DEVICES = {
    "adc4": (device_tags(rows=128, adc_bits=4), 0.1372, 0.0),
    "adc8": (device_tags(rows=128, adc_bits=8), 0.8677, 0.0),
    "noisy": (device_tags(rows=128, adc_bits=8, weight_noise=0.05), 0.30, 0.03),
}


def right(accuracy: float, offset: int = 0) -> np.ndarray:
    """Which images a model gets right: ``accuracy`` of them, starting at ``offset`` (cyclically)."""
    return np.roll(np.arange(IMAGES) < round(accuracy * IMAGES), offset)


def predicted(correct: np.ndarray) -> np.ndarray:
    return np.where(correct, LABELS, (LABELS + 1) % 10)


FP32_RIGHT = right(0.8719)
REFERENCE_RIGHT = right(REFERENCE, 150)  # differs from FP32 on 300 images: not significantly
DEVICE_RIGHT = {name: right(accuracy, 400) for name, (_, accuracy, _) in DEVICES.items()}


def log_predictions(client: MlflowClient, run: str, directory: Path, frame: pd.DataFrame, where: str) -> None:
    """The predictions file as the pipeline logs it (records.log_device, artifacts.evaluation_files)."""
    directory.mkdir(parents=True)
    path = directory / PREDICTIONS_FILE
    frame.to_csv(path, index_label="image")
    client.log_artifact(run, str(path), where)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowClient, str, dict[str, str]]:
    root = tmp_path_factory.mktemp("device-sweep")
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.create_experiment("resnet8ptq", artifact_location=(root / "mlruns").as_uri())
    tags = {
        "sweep": "true",
        "sweep_kind": "sweep",
        "sweep_dir": str(root / "sweep"),
        "overrides": "synthetic",
    }
    parent = client.create_run(experiment, run_name="sweep", tags=tags).info.run_id
    fp32 = _run(client, experiment, parent, "onnx-fp32", 1, quantized="false")
    log_predictions(
        client,
        fp32,
        root / "fp32",
        pd.DataFrame({"label": LABELS, "predicted": predicted(FP32_RIGHT)}),
        EVALUATION_DIR,
    )
    fp32_tags = AVX2.tags() | {"backend": "onnx", "dtype.activation": "float32", "dtype.weight": "float32"}
    _log(client, fp32, _metrics("fp32", 0.8719, 320_000, 900.0), {"backend": "onnx"}, fp32_tags, "FINISHED")
    base = AVX2.tags() | {"backend": "onnx", "dtype.activation": "int8", "dtype.weight": "int8"}
    base |= {"calib": "minmax", "per_channel": "true", "execution": "native"}
    params = {"dtype": "int8", "calib": "minmax", "backend": "onnx", "data.seed": "42"}
    ids = {"fp32": fp32}
    for start, (name, (device, accuracy, std)) in enumerate(DEVICES.items(), 10):
        run = _run(client, experiment, parent, name, start, quantized="true", config_hash=name)
        reference = predicted(REFERENCE_RIGHT)
        log_predictions(
            client,
            run,
            root / name / "evaluation",
            pd.DataFrame({"label": LABELS, "predicted": reference}),
            EVALUATION_DIR,
        )
        on_device = pd.DataFrame(
            {"label": LABELS, "reference": reference, "device": predicted(DEVICE_RIGHT[name])}
        )
        log_predictions(client, run, root / name / "device", on_device, "device")
        metrics = _metrics("q", REFERENCE, 110_000, 4000.0) | {
            "accuracy_delta": REFERENCE - 0.8719,
            "accuracy_device": accuracy,
            "accuracy_device_std": std,
            "accuracy_device_ci_low": accuracy - 0.007 - 2 * std,
            "accuracy_device_ci_high": accuracy + 0.007 + 2 * std,
            "accuracy_device_perf_subset": accuracy,
            "device_differing_predictions": int((DEVICE_RIGHT[name] != REFERENCE_RIGHT).sum()),
        }
        _log(client, run, metrics, params, base | device, "FINISHED")
        ids[name] = run
    client.set_terminated(parent, "FINISHED")
    return client, parent, ids


@pytest.fixture(scope="module")
def table(store: tuple[MlflowClient, str, dict[str, str]]) -> pd.DataFrame:
    client, parent, _ = store
    children = client.search_runs(
        [client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'"
    )
    return report.tested_table(client, runs.runs_frame(children))


@pytest.fixture(scope="module")
def markdown(store: tuple[MlflowClient, str, dict[str, str]]) -> str:
    client, parent, _ = store
    path = report.write_report(parent, tracking_uri=client.tracking_uri)
    return (path.parent / "report.md").read_text()


def test_best_accuracy_is_on_the_device(table: pd.DataFrame, markdown: str) -> None:
    """Both runs share the reference 86.96 %: ranked by it, the 4-bit ADCs (13.72 % on the device) won."""
    picks, over = analysis.recommendations(table, max_drop_points=5.0)
    named = {pick.what: pick.label for pick in picks}
    assert named["Best accuracy"] == named["Best onnx"] == f"{MODEL} @cim-r128-adc8"
    assert "Best on a device" not in named, "every configuration is on a device"
    assert set(over["label"]) == {f"{MODEL} @cim-r128-adc4", f"{MODEL} @cim-r128-adc8-n0.05"}
    assert (
        f"**Best accuracy**: {MODEL} @cim-r128-adc8 — 86.77% on the device (95% CI 86.07-87.47; -0.42 points"
        in markdown
    )
    assert f"{MODEL} @cim-r128-adc4 (-73.47 points)" in markdown.split("**Accuracy drop over 5 points**")[1]
    assert (
        "Accuracy here is on the device: `accuracy_device` (the mean over noise draws) of the 3" in markdown
    )


def test_comparison_shows_the_device_and_the_reference_beside_it(markdown: str) -> None:
    comparison = markdown.split("## Comparison")[1].split("\n## ")[0]
    assert "| accuracy on the device (%) | 95% CI (%) | reference (%) |" in comparison
    assert (
        f"| {MODEL} @cim-r128-adc4 | onnx | int8 | int8/int8 | minmax | true | 13.72 | 13.02-14.42 | 86.96 "
        in (comparison)
    )
    assert "| 13.7 | -73.47 ⚠ |" in comparison, "the device's perf subset and drop"
    assert "| onnx fp32 | onnx | fp32 | float32/float32 | — | — | 87.19 |" in comparison


def test_paired_tests_use_the_device_predictions(table: pd.DataFrame) -> None:
    rows = table.set_index("run_name")
    on_device = mcnemar(DEVICE_RIGHT["adc8"], FP32_RIGHT).p_value
    assert on_device != pytest.approx(mcnemar(REFERENCE_RIGHT, FP32_RIGHT).p_value)
    assert rows.at["adc8", "p_vs_fp32"] == pytest.approx(on_device)
    assert rows.at["adc4", "p_vs_best"] == pytest.approx(
        mcnemar(DEVICE_RIGHT["adc4"], DEVICE_RIGHT["adc8"]).p_value
    )
    assert rows.at["adc4", "p_vs_best_holm"] < 0.05, "the 4-bit ADCs are really worse on the device"
    assert np.isnan(rows.at["noisy", "p_vs_fp32"]), (
        "a mean over differing draws: one draw does not stand for it"
    )


def test_sections_with_nothing_to_say_are_left_out(markdown: str) -> None:
    """No model ran on the MCU path: no Deployability section."""
    assert "## Deployability" not in markdown and "no MCU path" not in markdown
    assert "## On the device" in markdown
    assert "Pareto front, accuracy on the device vs model size: **" in markdown
    assert "is tested on the device's predictions (`device/predictions.csv`)" in markdown


def test_a_mixed_sweep_ranks_each_run_where_it_runs(store: tuple[MlflowClient, str, dict[str, str]]) -> None:
    """A configuration without a device (on the CPU, by its reference) beside the device runs: it can be the
    best; the best on a device is named too."""
    client, parent, _ = store
    children = client.search_runs(
        [client.get_run(parent).info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'"
    )
    frame = runs.runs_frame(children)
    cpu = frame[frame["run_name"] == "adc8"].assign(run_id="cpu", run_name="cpu", device="", accuracy=0.8750)
    cpu = cpu.assign(accuracy_device=np.nan, accuracy_delta=0.8750 - 0.8719, config=MODEL, label=MODEL)
    table = runs.comparison_table(pd.concat([frame, cpu], ignore_index=True))
    named = {pick.what: pick.label for pick in analysis.recommendations(table, 5.0)[0]}
    assert named["Best accuracy"] == MODEL
    assert named["Best on a device"] == f"{MODEL} @cim-r128-adc8"
    assert table.set_index("run_id").at["cpu", "accuracy_pct"] == pytest.approx(87.50)
    text = "\n".join(sections.recommendation_section(table, 5.0))
    assert (
        "of the 3 device run(s); the 1 configuration(s) without a device by their reference accuracy" in text
    )
    assert significance.prediction_sources(table)["cpu"] == significance.REFERENCE_PREDICTIONS


def test_per_class_accuracy_is_on_the_device(table: pd.DataFrame, markdown: str) -> None:
    """A device run's per-class accuracies come from its device predictions (the logged class_acc/* are the
    reference's); a noisy run's are unknown (one draw of a mean) and it is left out of the heatmap."""
    rows = table.set_index("label")
    adc4 = rows.loc[f"{MODEL} @cim-r128-adc4"]
    for k, name in enumerate(CLASS_NAMES):
        expected = DEVICE_RIGHT["adc4"][np.equal(LABELS, k)].mean()
        assert adc4[f"{runs.CLASS_METRIC}{name}"] == pytest.approx(expected)
    assert np.isnan(rows.loc[f"{MODEL} @cim-r128-adc8-n0.05", f"{runs.CLASS_METRIC}airplane"])
    deltas = analysis.class_deltas(table)
    assert f"{MODEL} @cim-r128-adc4" in deltas and f"{MODEL} @cim-r128-adc8-n0.05" not in deltas
    assert "## Per-class accuracy" in markdown

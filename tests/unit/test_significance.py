"""Paired tests and seed spread in the report: predictions logged by the run's own artifact writer, read back
from a real (SQLite) MLflow store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from resnet8ptq.artifacts import evaluation_files
from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.evaluate import Evaluation
from resnet8ptq.report import runs, sections, significance
from resnet8ptq.report import writer as report
from resnet8ptq.statistics import mcnemar

IMAGES = 2_000
RNG = np.random.default_rng(0)
LABELS = RNG.integers(0, 10, IMAGES)
FP32_RIGHT = RNG.random(IMAGES) < 0.87


def predictions(right: np.ndarray) -> np.ndarray:
    """Predicted classes that are right exactly where ``right`` says."""
    return np.where(right, LABELS, (LABELS + 1) % 10)


def flip(right: np.ndarray, lose: int, gain: int) -> np.ndarray:
    """``right`` with ``lose`` right images made wrong and ``gain`` wrong ones made right."""
    out = right.copy()
    out[np.flatnonzero(right)[:lose]] = False
    out[np.flatnonzero(~right)[:gain]] = True
    return out


# name -> (quantized, seed, per-image correctness); accuracies near FP32 0.87 on 2,000 images
RUNS = {
    "fp32": (False, "", FP32_RIGHT),
    "worse": (True, "42", flip(FP32_RIGHT, 60, 5)),  # clearly worse than FP32 (and than the best)
    "close-42": (True, "42", flip(FP32_RIGHT, 4, 6)),  # the best; indistinguishable from FP32
    "close-7": (True, "7", flip(FP32_RIGHT, 6, 5)),  # same configuration, another calibration sample
    "close-9": (True, "9", flip(FP32_RIGHT, 8, 4)),
    "no-predictions": (True, "42", flip(FP32_RIGHT, 1, 1)),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[MlflowClient, str, dict[str, str]]:
    root = tmp_path_factory.mktemp("store")
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.create_experiment("resnet8ptq", artifact_location=(root / "mlruns").as_uri())
    tags = {"sweep": "true", "sweep_dir": str(root / "sweep"), "overrides": "synthetic"}
    parent = client.create_run(experiment, run_name="sweep", tags=tags).info.run_id
    ids = {}
    for name, (quantized, seed, right) in RUNS.items():
        config = "close" if name.startswith("close") else name
        run = client.create_run(experiment, run_name=name, tags={"mlflow.parentRunId": parent}).info.run_id
        client.log_batch(
            run,
            metrics=[Metric("accuracy", float(right.mean()), 0, 0), Metric("model_size_bytes", 1e5, 0, 0)],
            params=[Param("data.seed", seed), Param("calib", config), Param("calib.method", config)]
            if quantized
            else [],
            tags=[
                RunTag(key, value)
                for key, value in {
                    "backend": "onnx",
                    "quantized": str(quantized).lower(),
                    "dtype.activation": "int8" if quantized else "float32",
                    "dtype.weight": "int8" if quantized else "float32",
                    "calib": config,
                    "per_channel": "false",
                    "config_hash": f"{name}",
                }.items()
            ],
        )
        if name != "no-predictions":
            evaluation = Evaluation(predictions(right), LABELS, np.zeros((IMAGES, 10)), 1.0)
            for directory, path in evaluation_files(evaluation, root / name, name, CLASS_NAMES)[:1]:
                client.log_artifact(run, str(path), directory)
        client.set_terminated(run, "FINISHED")
        ids[name] = run
    client.set_terminated(parent, "FINISHED")
    return client, parent, ids


@pytest.fixture(scope="module")
def table(store: tuple[MlflowClient, str, dict[str, str]]) -> pd.DataFrame:
    client, parent, _ = store
    frame = runs.runs_frame(client.search_runs([client.get_run(parent).info.experiment_id]))
    return report.tested_table(client, frame).set_index("run_name")


def test_predictions_are_read_back_as_logged(store: tuple[MlflowClient, str, dict[str, str]]) -> None:
    client, _, ids = store
    sources = dict.fromkeys(ids.values(), significance.REFERENCE_PREDICTIONS)
    correct, labels = significance.load_correctness(client, sources)
    assert set(correct) == {ids[name] for name in RUNS if name != "no-predictions"}
    assert np.array_equal(labels, LABELS)
    assert np.array_equal(correct[ids["worse"]], RUNS["worse"][2])


def test_paired_tests_against_fp32_and_the_best(table: pd.DataFrame) -> None:
    expected = mcnemar(RUNS["worse"][2], FP32_RIGHT).p_value
    assert table.at["worse", "p_vs_fp32"] == pytest.approx(expected)
    assert table.at["worse", "p_vs_fp32"] < 1e-9
    assert table.at["close-42", "p_vs_fp32"] > 0.5
    # Holm over the 4 quantized runs with predictions: the smallest p is multiplied by 4
    assert table.at["worse", "p_vs_fp32_holm"] == pytest.approx(min(4 * expected, 1.0))
    assert np.isnan(table.at["no-predictions", "p_vs_fp32"]) and np.isnan(table.at["fp32", "p_vs_fp32"])
    assert np.isnan(table.at["close-42", "p_vs_best"]), "the best is not tested against itself"
    assert table.at["worse", "p_vs_best_holm"] < 0.05 < table.at["close-9", "p_vs_best_holm"]


def test_report_says_which_differences_are_significant(table: pd.DataFrame, tmp_path: Path) -> None:
    frame = table.reset_index()
    text = "\n".join(sections.significance_section(frame))
    assert "1 of 4 configurations are significantly less accurate, 0 significantly more, and 3 not" in text
    assert "| onnx int8/int8 close | 3 |" in text, "the three seeds of one configuration are aggregated"
    accuracies = [100 * RUNS[f"close-{seed}"][2].mean() for seed in ("42", "7", "9")]
    assert f"{np.mean(accuracies):.2f} ± {np.std(accuracies, ddof=1):.2f}" in text
    ties = sections.best_ties_line(frame)
    assert ties is not None and "Not distinguishable from 2 of the other 3 configurations" in ties
    assert "worse" not in ties and "close seed 7" in ties
    assert "close seed 9" in ties


def test_no_predictions_no_paired_tests() -> None:
    frame = runs.comparison_table(runs.runs_frame([]))
    assert significance.paired_tests(frame, {}).empty


def test_seed_spread_groups_runs_that_differ_only_in_the_seed() -> None:
    """Runs of one label that differ in another setting (calib.percentile) are not seeds of each other."""
    rows = [("1", "99.9", 86.0), ("2", "99.9", 87.0), ("3", "99.9", 88.0), ("1", "99.99", 80.0)]
    table = pd.DataFrame(
        {
            "quantized": True,
            "seed": [seed for seed, _, _ in rows],
            "settings": [
                runs.settings_key({"calib": "percentile", "calib.percentile": p, "data.seed": seed})
                for seed, p, _ in rows
            ],
            "config": "onnx int8 percentile",
            "accuracy_pct": [accuracy for _, _, accuracy in rows],
        }
    )
    spread = significance.seed_spread(table)
    assert len(spread) == 1, "the 99.99 run is one run of another configuration, not a fourth seed"
    row = spread.iloc[0]
    assert (row["seeds"], row["mean"], row["std"], row["min"], row["max"]) == (3, 87.0, 1.0, 86.0, 88.0)


def test_int8_configurations_against_the_published_model() -> None:
    """Only int8/int8 8-bit configurations are tested against the published model, in a family of their own;
    the published model is in no other family (not the best, not tested against FP32)."""
    published_right = flip(FP32_RIGHT, 3, 3)
    rows = {
        "fp32": (False, "", "float32", 8, FP32_RIGHT),
        "int8-worse": (True, "", "int8", 8, flip(published_right, 70, 0)),
        "int8-same": (True, "", "int8", 8, flip(published_right, 3, 2)),  # one image under it
        "uint8": (True, "", "uint8", 8, flip(published_right, 70, 0)),
        "published": (True, "mlperf", "int8", 8, published_right),
    }
    frame = pd.DataFrame(
        [
            {"run_id": name, "label": name, "backend": "tflite", "quantized": q, "reference": ref,
             "activation": act, "weight": act, "activation_bits": bits, "weight_bits": bits,
             "accuracy": right.mean(), "accuracy_pct": 100 * right.mean()}
            for name, (q, ref, act, bits, right) in rows.items()
        ]
    ).set_index("run_id", drop=False)  # fmt: skip
    tested = significance.paired_tests(frame, {name: row[4] for name, row in rows.items()})
    assert tested.at["int8-worse", "p_vs_published"] == pytest.approx(
        mcnemar(rows["int8-worse"][4], published_right).p_value
    )
    assert (
        tested.at["int8-worse", "p_vs_published_holm"] < 0.05 < tested.at["int8-same", "p_vs_published_holm"]
    )
    assert np.isnan(tested.at["uint8", "p_vs_published"]), "not an int8/int8 configuration"
    assert np.isnan(tested.at["published", "p_vs_fp32"]) and np.isnan(tested.at["published", "p_vs_best"])
    best = mcnemar(rows["int8-worse"][4], rows["int8-same"][4]).p_value
    assert tested.at["int8-worse", "p_vs_best"] == pytest.approx(best), (
        "the best configuration, not published"
    )

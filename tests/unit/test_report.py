"""The comparison report: on a synthetic MLflow store with known numbers, and after a real CLI sweep."""

from __future__ import annotations

import base64
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from resnet8ptq import app
from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.hardware import Hardware
from resnet8ptq.report import analysis, cli, figures, runs, sections, widths
from resnet8ptq.report import writer as report

REPORT_FILES = {
    "report.md",
    "report.html",
    figures.HEATMAP_PNG,
    figures.SIZE_PNG,
    figures.THROUGHPUT_PNG,
}
FP32 = {
    "onnx": (0.87, 320_000, 4000.0),
    "torch": (0.86, 330_000, 1000.0),
    "tflite": (0.8719, 321_000, 2000.0),
}
# name: backend, dtype, (activation, weight), calib, per_channel, accuracy, size (bytes), throughput (img/s)
QUANTIZED = {
    "A": ("onnx", "int8", ("int8", "int8"), "minmax", False, 0.865, 110_000, 5000.0),
    "B": ("onnx", "uint8", ("uint8", "uint8"), "entropy", False, 0.80, 95_000, 6000.0),  # -7 points
    "C": ("onnx", "u8s8", ("uint8", "int8"), "percentile", True, 0.855, 112_000, 2000.0),
    "D": ("torch", "int8", ("int8", "int8"), "minmax", False, 0.868, 115_000, 1500.0),
    "E": ("torch", "uint8", ("uint8", "uint8"), "minmax", False, 0.85, 100_000, 1200.0),
}
LABELS = {
    "A": "onnx int8 minmax",
    "B": "onnx uint8 entropy",
    "C": "onnx u8s8 percentile per-channel",
    "D": "torch int8 minmax",
    "E": "torch uint8 minmax",
    "F": "torch u8s8 entropy",
}
# A published int8 model (tag reference), more accurate than every configuration: never recommended.
PUBLISHED = ("tflite", ("int8", "int8"), 0.871, 98_000, 8000.0)
# B loses 16 points on dog (0.71 vs 0.87) and gains 2 on cat, so its classes still average to 0.80.
CLASS_OVERRIDES = {"B": {"dog": 0.71, "cat": 0.89}}
AVX2 = Hardware("AMD EPYC", ("avx2", "fma"), 2)
VNNI = Hardware("Intel Xeon", ("avx2", "avx512f", "avx512_vnni", "amx_int8"), 2)
# C's fused u8 x s8 kernels lose 2 points against its reference on the AVX2 machine of the main sweep.
NATIVE_C = {"accuracy_native": 0.835, "kernel_gap_points": -2.0}


@dataclass
class Store:
    uri: str
    client: MlflowClient
    experiment: str
    parent: str
    old_parent: str
    empty_parent: str
    sweep_dir: Path
    runs: dict[str, str]  # name -> run id


def _run(client: MlflowClient, experiment_id: str, parent: str, name: str, start: int, **tags: str) -> str:
    return client.create_run(
        experiment_id, start_time=start, run_name=name, tags={"mlflow.parentRunId": parent, **tags}
    ).info.run_id


def _log(client: MlflowClient, run_id: str, metrics: dict, params: dict, tags: dict, status: str) -> None:
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), 0, 0) for k, v in metrics.items()],
        params=[Param(k, str(v)) for k, v in params.items()],
        tags=[RunTag(k, str(v)) for k, v in tags.items()],
    )
    client.set_terminated(run_id, status)


def _metrics(name: str, accuracy: float, size: int, throughput: float) -> dict[str, float]:
    per_class = {c: accuracy for c in CLASS_NAMES} | CLASS_OVERRIDES.get(name, {})
    return {
        "accuracy": accuracy,
        "accuracy_perf_subset": accuracy + 0.01,  # MLPerf Tiny's 200-image subset
        "model_size_bytes": size,
        "throughput_img_s": throughput,
        "latency_ms_b1": 1000 / throughput,
        "eval_seconds": 1.0,
        **{f"class_acc/{c}": a for c, a in per_class.items()},
    }


MCU_P = {  # the published model on the microcontroller path
    "accuracy_mcu": 0.8709,
    "mcu_differing_predictions": 1,
    "mcu_arena_bytes": 55_984,
    "mcu_flash_bytes": 98_496,
    "npu_cycles": 201_747,
    "npu_inference_ms": 0.403494,
}


def build_store(root: Path) -> Store:
    """Two sweeps (an old one with a rerun of A) and an empty one, in a fresh sqlite store under root."""
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment_id = client.create_experiment("resnet8ptq", artifact_location=(root / "mlruns").as_uri())
    sweep_dir = root / "runs" / "multirun" / "sweep"

    def parent(name: str, start: int, directory: Path) -> str:
        tags = {"sweep": "true", "sweep_kind": "sweep", "sweep_dir": str(directory), "overrides": "synthetic"}
        return client.create_run(experiment_id, start_time=start, run_name=name, tags=tags).info.run_id

    old_parent = parent("sweep old", 1_000, root / "runs" / "old")
    old_a = _run(client, experiment_id, old_parent, "A-old", 1_001, quantized="true", config_hash="hash-A")
    _log(
        client,
        old_a,
        _metrics("A", 0.70, 110_000, 5000.0) | {"accuracy_delta": -0.17, "fp32_size_bytes": 320_000},
        {"dtype": "int8", "calib": "minmax", "backend": "onnx"},
        {"backend": "onnx", "dtype.activation": "int8", "dtype.weight": "int8", "calib": "minmax"}
        | {"per_channel": "false", "execution": "native"},
        "FINISHED",
    )
    client.set_terminated(old_parent, "FINISHED")

    main = parent("sweep main", 2_000, sweep_dir)
    runs = {}
    for start, (backend, (accuracy, size, throughput)) in enumerate(FP32.items(), 2_001):
        run_id = _run(client, experiment_id, main, f"{backend}-fp32", start, quantized="false")
        tags = {"backend": backend, "dtype.activation": "float32", "dtype.weight": "float32", **AVX2.tags()}
        metrics = _metrics("fp32", accuracy, size, throughput) | {"fp32_size_bytes": size}
        _log(client, run_id, metrics, {"backend": backend}, tags, "FINISHED")
        runs[f"{backend}-fp32"] = run_id
    for start, (name, spec) in enumerate(QUANTIZED.items(), 2_010):
        backend, dtype, (activation, weight), calib, per_channel, accuracy, size, throughput = spec
        run_id = _run(client, experiment_id, main, name, start, quantized="true", config_hash=f"hash-{name}")
        fp32_accuracy, fp32_size, _ = FP32[backend]
        metrics = _metrics(name, accuracy, size, throughput) | {
            "accuracy_delta": accuracy - fp32_accuracy,
            "fp32_size_bytes": fp32_size,
            "size_ratio": size / fp32_size,
        }
        execution = "simulated" if backend == "torch" else "native"
        if name == "C":
            execution = "native-mismatch"
            metrics |= NATIVE_C
        tags = AVX2.tags() | {
            "backend": backend,
            "dtype.activation": activation,
            "dtype.weight": weight,
            "calib": calib,
            "per_channel": str(per_channel).lower(),
            "execution": execution,
            "execution_reason": f"{execution} because synthetic",
        }
        params = {"dtype": dtype, "calib": calib, "backend": backend, "data.seed": "42"}
        _log(client, run_id, metrics, params, tags, "FINISHED")
        runs[name] = run_id
    backend, (activation, weight), accuracy, size, throughput = PUBLISHED
    run_id = _run(client, experiment_id, main, "mlperf-int8-published", 2_015, quantized="true")
    tags = AVX2.tags() | {"backend": backend, "reference": "mlperf", "execution": "native"}
    tags |= {"dtype.activation": activation, "dtype.weight": weight}
    metrics = _metrics("P", accuracy, size, throughput) | {"accuracy_delta": accuracy - FP32[backend][0]}
    metrics |= MCU_P
    tags["mcu.fits"] = "nucleo_l4r5zi,pico"
    # Its params keep the sweep's data.* (calibration seed included), like a real published run's.
    _log(client, run_id, metrics, {"backend": backend, "data.seed": "42"}, tags, "FINISHED")
    runs["P"] = run_id
    failed = _run(client, experiment_id, main, "F", 2_020, quantized="true", config_hash="hash-F")
    params = {"dtype": "u8s8", "calib": "entropy", "backend": "torch", "dtype.activation": "uint8"}
    tags = {"backend": "torch", "calib": "entropy", "per_channel": "false", "error": "RuntimeError: boom"}
    _log(client, failed, {}, params | {"dtype.weight": "int8"}, tags, "FAILED")
    runs["F"] = failed
    client.set_terminated(main, "FAILED")

    empty = parent("sweep empty", 500, root / "runs" / "empty")  # older: not the default sweep
    client.set_terminated(empty, "FAILED")
    return Store(uri, client, "resnet8ptq", main, old_parent, empty, sweep_dir, runs)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return build_store(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def written(store: Store) -> Path:
    """The report of the main sweep, written to its default place (the sweep's runs/ directory)."""
    path = report.write_report(store.parent, tracking_uri=store.uri)
    assert path == store.sweep_dir / "report.html"
    return store.sweep_dir


@pytest.fixture(scope="module")
def table(store: Store) -> pd.DataFrame:
    children = store.client.search_runs(
        [store.client.get_experiment_by_name(store.experiment).experiment_id],
        f"tags.mlflow.parentRunId = '{store.parent}'",
    )
    return runs.comparison_table(runs.runs_frame(children))


def test_comparison_table_values_and_order(table: pd.DataFrame) -> None:
    assert list(table["label"]) == [
        "onnx fp32",
        LABELS["A"],
        LABELS["C"],
        LABELS["B"],
        "tflite fp32",
        "mlperf int8 (published)",
        "torch fp32",
        LABELS["D"],
        LABELS["E"],
    ], "per backend: FP32 first, then by accuracy"
    a = table.set_index("label").loc[LABELS["A"]]
    assert a["accuracy_pct"] == pytest.approx(86.5)
    assert a["delta_points"] == pytest.approx(-0.5)
    assert a["size_kib"] == pytest.approx(110_000 / 1024)
    assert a["size_reduction"] == pytest.approx(320_000 / 110_000)
    assert a["throughput_img_s"] == 5000 and a["latency_ms_b1"] == pytest.approx(0.2)
    assert (a["dtype"], a["activation"], a["weight"], a["execution"]) == ("int8", "int8", "int8", "native")
    c = table.set_index("label").loc[LABELS["C"]]
    assert (c["dtype"], c["activation"], c["weight"], c["per_channel"]) == ("u8s8", "uint8", "int8", "true")
    fp32 = table.set_index("label").loc["onnx fp32"]
    assert fp32["delta_points"] == 0 and fp32["size_reduction"] == 1 and fp32["dtype"] == "fp32"
    assert LABELS["F"] not in set(table["label"]), "failed runs are listed apart, not compared"


def wilson_pct(accuracy: float, n: int = 10_000, z: float = 1.959964) -> str:
    """The Wilson 95% interval by its closed form, as the report prints it."""
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"{100 * (centre - half):.2f}-{100 * (centre + half):.2f}"


def test_markdown_table_row(written: Path) -> None:
    text = (written / "report.md").read_text()
    assert wilson_pct(0.865) == "85.82-87.16"
    assert (
        "| onnx int8 minmax | onnx | int8 | int8/int8 | minmax | false | 86.50 | 85.82-87.16 | 87.5 "
        "| -0.50 | — | 107.4 | 2.91x | 5000 | 0.200 | native |"
    ) in text, "runs without logged predictions have no paired test"
    assert (
        "| torch int8 minmax | torch | int8 | int8/int8 | minmax | false | 86.80 | "
        f"{wilson_pct(0.868)} | 87.8 | +0.80 |"
    ) in text
    assert "| -7.00 ⚠ |" in text, "the over-limit delta is marked"


def test_recommendations(table: pd.DataFrame) -> None:
    picks, over = analysis.recommendations(table, max_drop_points=5.0)
    named = {pick.what: pick.label for pick in picks}
    assert named["Best accuracy"] == LABELS["D"]
    assert named["Smallest model"] == LABELS["E"], "B is smaller but over the drop limit"
    assert named["Fastest"] == LABELS["A"], "B is faster but over the drop limit"
    assert named["Best onnx"] == LABELS["A"] and named["Best torch"] == LABELS["D"]
    assert "Best tflite" not in named, "the published model is no configuration of this tool"
    assert list(over["label"]) == [LABELS["B"]]
    # With a looser limit, B is allowed and wins smallest and fastest.
    picks, over = analysis.recommendations(table, max_drop_points=10.0)
    named = {pick.what: pick.label for pick in picks}
    assert named["Smallest model"] == named["Fastest"] == LABELS["B"] and over.empty


def test_published_model_beside_the_int8_configurations(written: Path) -> None:
    """The published model's row, then every int8/int8 configuration, with the differences to it on the full
    test set and the perf subset."""
    text = (written / "report.md").read_text()
    assert (
        f"| mlperf int8 (published) | tflite | int8 | int8/int8 | — | — | 87.10 | {wilson_pct(0.871)} | 88.1 "
        "| -0.09 |" in text
    )
    section = text.split("## Published models")[1].split("## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == [
        "| mlperf int8 (published) | 87.10 | +0.00 | 88.1 | +0.0 | — | — | native |",
        f"| {LABELS['A']} | 86.50 | -0.60 | 87.5 | -0.6 | — | — | native |",
        f"| {LABELS['D']} | 86.80 | -0.30 | 87.8 | -0.3 | — | — | simulated |",
    ]


def test_deployability_lists_every_model_and_says_which_have_no_mcu_path(written: Path) -> None:
    """The published .tflite with its TFLM accuracy, flash, arena, boards and NPU estimate; each ONNX Runtime
    and PyTorch configuration named with the reason it has no MCU path, no blank cell."""
    section = (written / "report.md").read_text().split("## Deployability")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    published = (
        "| mlperf int8 (published) | 87.10 | 87.09 | 1 | 96.2 | 54.7 "
        "| nucleo_l4r5zi, pico | 201,747 (0.40 ms) |"
    )
    assert published in rows
    no_path = [row for row in rows if "no MCU path" in row]
    assert len(no_path) == len(rows) - 1 == len(QUANTIZED)
    assert all("| - | - | - | - | - |" in row for row in no_path)
    assert any("an ONNX Runtime model" in row for row in no_path) and any(
        "a PyTorch program" in row for row in no_path
    )
    assert "report_accuracy_vs_arena.png" not in section  # one model on the MCU path: no plot


def test_recommendations_in_report(written: Path) -> None:
    text = (written / "report.md").read_text()
    assert (
        f"**Best accuracy**: {LABELS['D']} — 86.80% (95% CI {wilson_pct(0.868)}; +0.80 points vs FP32)"
        in text
    )
    assert f"**Smallest model**: {LABELS['E']} —" in text
    assert f"**Fastest**: {LABELS['A']} —" in text
    assert f"**Accuracy drop over 5 points**: {LABELS['B']} (-7.00 points)" in text


def test_ties_within_tolerance_go_to_the_more_accurate(table: pd.DataFrame) -> None:
    close = table.copy()
    close.loc[close["label"] == LABELS["A"], "model_size_bytes"] = 100_500  # within 1% of E's 100,000
    picks, _ = analysis.recommendations(close, max_drop_points=5.0)
    assert {p.what: p.label for p in picks}["Smallest model"] == LABELS["A"]


def test_reference_and_native_side_by_side(written: Path) -> None:
    text = (written / "report.md").read_text()
    assert f"- hardware: {AVX2.label}" in text
    assert (
        f"| 85.50 | {wilson_pct(0.855)} | 86.5 | -1.50 | — | 109.4 | 2.86x | 2000 | 0.500 | native-mismatch "
        "| 83.50 |" in text
    )
    section = text.split("## Reference and native execution")[1].split("## ")[0]
    assert f"| {LABELS['C']} | {AVX2.label} | 85.50 | 83.50 | -2.00 | native-mismatch |" in section
    assert f"**native-mismatch** ({LABELS['C']}): this CPU has no int8 dot-product" in section
    assert "reduce_range=true" in section
    assert f"**simulated** (simulated because synthetic): {LABELS['D']}, {LABELS['E']}" in section


def test_runs_from_two_machines_are_kept_apart(table: pd.DataFrame, tmp_path: Path) -> None:
    """Speed compares only within one machine: one fastest pick and one throughput plot per machine, a
    machine column; accuracy (the reference semantics) is still compared across them."""
    mixed = table.copy()
    mixed.loc[mixed["backend"] == "torch", "hardware"] = VNNI.label
    picks, _ = analysis.recommendations(mixed, max_drop_points=5.0)
    named = {pick.what: pick.label for pick in picks}
    assert named[f"Fastest on {AVX2.label}"] == LABELS["A"]
    assert named[f"Fastest on {VNNI.label}"] == LABELS["D"]
    assert named["Best accuracy"] == LABELS["D"]
    assert "Fastest" not in named
    rows = sections.comparison_rows(mixed, 5.0)
    machine = rows.headers.index("machine")
    assert {row[0]: row[machine] for row in rows.rows}[LABELS["D"]] == "M2"
    assert "runs from 2 machines" in analysis.hardware_lines(mixed)[0]
    out = sections.Report("t", [], mixed, mixed.iloc[0:0], 5.0, tmp_path)
    blocks = sections.tradeoff_section(out)
    assert sorted(drawing.path().name for drawing in out.images) == [
        "report_accuracy_vs_size.png",
        "report_accuracy_vs_throughput_M1.png",
        "report_accuracy_vs_throughput_M2.png",
    ]
    assert any("on M2" in text for text in blocks)


def test_failed_run_is_listed(written: Path) -> None:
    text = (written / "report.md").read_text()
    assert "## Failed runs (1)" in text
    assert f"| {LABELS['F']} | F | FAILED | RuntimeError: boom |" in text
    assert "finished: 5 quantized, 1 published model(s), 3 FP32 baseline(s); failed or unfinished: 1" in text


def test_per_class_worst(table: pd.DataFrame, written: Path) -> None:
    deltas = analysis.class_deltas(table)
    assert deltas.shape == (10, 6), "the 5 configurations and the published model"
    assert deltas.loc["airplane", "mlperf int8 (published)"] == pytest.approx(-0.09), "vs tflite's FP32"
    assert deltas.loc["dog", LABELS["B"]] == pytest.approx(-16.0)
    assert deltas.loc["cat", LABELS["B"]] == pytest.approx(2.0)
    assert deltas.loc["airplane", LABELS["D"]] == pytest.approx(0.8), "vs the FP32 of the same backend"
    worst = analysis.worst_classes(deltas)
    assert (worst.loc[0, "class"], worst.loc[0, "config"]) == ("dog", LABELS["B"])
    assert worst.loc[0, "worst_points"] == pytest.approx(-16.0)
    assert f"Most affected: **dog -16.0 points under {LABELS['B']}**" in (written / "report.md").read_text()


def test_pareto_front(table: pd.DataFrame) -> None:
    points = table[table["backend"] != "tflite"].reset_index(drop=True)
    by_size = analysis.pareto_front(points["size_kib"], points["accuracy_pct"], minimize_x=True)
    assert set(points.loc[by_size, "label"]) == {LABELS[n] for n in "ABDE"} | {"onnx fp32"}
    by_speed = analysis.pareto_front(points["throughput_img_s"], points["accuracy_pct"], minimize_x=False)
    assert set(points.loc[by_speed, "label"]) == {LABELS["A"], LABELS["B"], "onnx fp32"}


def test_pareto_front_keeps_equal_points() -> None:
    mask = analysis.pareto_front(np.array([1.0, 1.0, 2.0]), np.array([0.9, 0.9, 0.8]), minimize_x=True)
    assert list(mask) == [True, True, False]


def test_html_is_self_contained(written: Path) -> None:
    html = (written / "report.html").read_text()
    assert 'src="http' not in html and "<link" not in html and "<script" not in html
    assert html.count('src="data:image/png;base64,') == 3
    assert "onnx int8 minmax" in html and "RuntimeError: boom" in html


def test_files_are_artifacts_of_the_parent(store: Store, written: Path) -> None:
    assert {p.name for p in written.iterdir()} >= REPORT_FILES
    logged = {Path(a.path).name for a in store.client.list_artifacts(store.parent, report.ARTIFACT_DIR)}
    assert logged == REPORT_FILES


def test_cli_defaults_to_the_latest_sweep(store: Store, tmp_path: Path) -> None:
    code = cli.main(["--tracking-uri", store.uri, "--out", str(tmp_path), "--max-drop", "10"])
    assert code == 0
    text = (tmp_path / "report.md").read_text()
    assert "sweep main" in text and "**Accuracy drop over 10 points**: none" in text


def test_empty_sweep_says_nothing_to_report(store: Store, tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert report.write_report(store.empty_parent, tmp_path / "direct", tracking_uri=store.uri) is None
    assert "Nothing to report" in caplog.text
    assert "Nothing to report: no finished quantized run" in (tmp_path / "direct" / "report.md").read_text()
    args = ["--sweep", store.empty_parent, "--tracking-uri", store.uri, "--out", str(tmp_path / "cli")]
    assert cli.main(args) == cli.EXIT_NOTHING_TO_REPORT
    assert "Nothing to report" in (tmp_path / "cli" / "report.html").read_text()


def test_missing_store_or_sweep_is_a_clear_error(store: Store, tmp_path: Path, capsys) -> None:
    missing = f"sqlite:///{tmp_path / 'nothing.db'}"
    assert cli.main(["--tracking-uri", missing]) == 2
    assert "No MLflow store" in capsys.readouterr().err
    assert not (tmp_path / "nothing.db").exists(), "no empty store is created"
    assert cli.main(["--tracking-uri", store.uri, "--experiment", "nope"]) == 2
    assert "No experiment 'nope'" in capsys.readouterr().err


def test_experiment_report_keeps_the_newest_rerun(store: Store, tmp_path: Path) -> None:
    path = report.write_experiment_report(store.experiment, tmp_path, tracking_uri=store.uri)
    assert path == tmp_path / "report.html"
    text = (tmp_path / "report.md").read_text()
    assert "| onnx int8 minmax | onnx | int8 | int8/int8 | minmax | false | 86.50 |" in text
    assert "| 70.00 |" not in text, "the older rerun of A is superseded"
    assert "older reruns of the same configuration not shown: 1" in text
    assert "RuntimeError: boom" in text


def test_report_failure_never_fails_the_sweep(monkeypatch, caplog) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("report exploded")

    monkeypatch.setattr(report, "write_report", broken)
    with caplog.at_level(logging.WARNING):
        app.write_report_safely("some-run-id", app.ReportConfig())
    assert "report exploded" in caplog.text


def test_accuracy_map_of_a_bit_width_sweep(tmp_path: Path) -> None:
    """Weight bits x activation bits per backend and granularity; cells say native/simulated; gaps are '-';
    mixed runs are not cells."""
    rows = [
        {"backend": backend, "activation": "uint8", "weight": "int8", "activation_bits": a, "weight_bits": w,
         "per_channel": "true", "calib": "minmax", "reduce_range": "false", "quantized": True,
         "accuracy_pct": 80.0 + a + w / 10, "execution": "native" if a == 8 else "simulated",
         "first_last_bits": first_last, "algo": "none", "layer_bits": "", "raised_count": 0, "seed": ""}
        for backend, cells, first_last in (
            ("onnx", [(8, 4), (8, 8)], ""), ("torch", [(6, 4), (8, 4), (8, 8)], ""), ("torch", [(4, 4)], "8")
        )
        for a, w in cells
    ]  # fmt: skip
    # The papers' cell over three calibration samples (and one of them tracked twice): their mean ± std.
    rows[-1]["seed"] = "42"
    rows += [{**rows[-1], "seed": "0", "accuracy_pct": 85.4}, {**rows[-1], "seed": "1", "accuracy_pct": 86.4}]
    rows.append({**rows[-1], "accuracy_pct": 10.0})
    # A budgeted mix whose narrowest layers are at W4A6 is not that cell (listed first: it would win it).
    rows.insert(0, {**rows[2], "accuracy_pct": 50.0, "layer_bits": "conv2d_1=4, activation_1/Relu=6"})
    table = pd.DataFrame(rows)
    report_ = sections.Report("t", [], table, table.iloc[:0], 5.0, tmp_path)
    text = "\n\n".join(widths.accuracy_map_section(report_))
    assert (
        "**torch uint/int minmax per-channel** (accuracy %; N native, N! native-mismatch, S simulated" in text
    )
    torch_map = text[text.index("**torch") :]
    assert (
        "| 8 | - | - | 88.8 N |\n| 4 | - | 86.4 S | 88.4 N |" in torch_map
    )  # weight bits down, activation across
    assert (
        "| 8 | - | - | 88.8 N |\n| 4 | - | - | 88.4 N |" in text
    )  # onnx: 8-bit activations only, on the same axes
    convention = text[text.index("**torch uint/int minmax per-channel, first and last layers at 8 bits**") :]
    assert "| 4 | 85.4 ± 1.0 S | - | - |" in convention  # a panel of its own: the papers' convention
    assert "(accuracy %; mean ± std over 3 seeds (`data.seed`); N native" in convention
    assert "seeds" not in torch_map[: torch_map.index("first and last")]
    assert [drawing.path() for drawing in report_.images] == [tmp_path / figures.ACCURACY_MAP_PNG]
    assert (tmp_path / figures.ACCURACY_MAP_PNG).stat().st_size > 10_000
    one_width = table[(table["activation_bits"] == 8) & (table["weight_bits"] == 8)]
    assert (
        widths.accuracy_map_section(sections.Report("t", [], one_width, table.iloc[:0], 5.0, tmp_path)) == []
    )


def test_algorithm_table(tmp_path: Path) -> None:
    rows = [
        {"backend": "onnx", "dtype": "int8 a8w4", "calib": "minmax", "per_channel": "false", "algo": algo,
         "quantized": True, "accuracy_pct": accuracy}
        for algo, accuracy in (("none", 20.06), ("cle", 35.91), ("adaround", 81.73))
    ]  # fmt: skip
    text = "\n".join(widths.algorithm_section(pd.DataFrame(rows)))
    assert "| configuration | none | adaround | cle |" in text
    assert "| onnx int8 a8w4 minmax per-tensor | 20.1 | 81.7 | 35.9 |" in text
    assert "Accuracy (%) of each" in text
    assert widths.algorithm_section(pd.DataFrame(rows[:1])) == []
    # AdaRound over three calibration samples: their mean ± std (the earlier table showed the first seed's)
    seeded = [{**row, "seed": "42"} for row in rows]
    for seed, value in (("0", 79.73), ("1", 80.73)):
        seeded.append({**rows[2], "seed": seed, "accuracy_pct": value})
    text = "\n".join(widths.algorithm_section(pd.DataFrame(seeded)))
    assert "| onnx int8 a8w4 minmax per-tensor | 20.1 | 80.7 ± 1.0 | 35.9 |" in text
    assert "Accuracy (%; mean ± std over 3 seeds (`data.seed`)) of each" in text


def test_html_embeds_each_figure_where_the_markdown_shows_it(tmp_path: Path) -> None:
    """Each referenced figure becomes its own data URI in its <img>; a file name in the text stays text."""
    from resnet8ptq.report.render import to_html

    figures = {"report_a.png": b"\x89PNG first", "report_b.png": b"\x89PNG second"}
    for name, data in figures.items():
        (tmp_path / name).write_bytes(data)
    markdown = "# T\n\nsee report_a.png below\n\n![accuracy](report_a.png)\n\n![size](report_b.png)\n"
    page = to_html(markdown, "T", [tmp_path / name for name in figures])
    for name, data in figures.items():
        assert f'src="data:image/png;base64,{base64.b64encode(data).decode()}" alt="' in page
        assert f'src="{name}"' not in page
    assert "see report_a.png below" in page

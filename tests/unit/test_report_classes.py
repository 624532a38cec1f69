"""The report's per-class view over several networks: each run over its own network's classes, in label
order, against its own network's FP32 run (a sweep of model=kws,ad once failed here on all-NaN rows)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from resnet8ptq.data import CLASS_NAMES
from resnet8ptq.report import analysis
from resnet8ptq.report.classes import run_classes
from resnet8ptq.report.significance import with_device_classes

KWS = ("down", "go", "silence")


def row(run_id: str, network: str, backend: str, quantized: bool, classes: tuple, accuracies: dict) -> dict:
    label = f"{backend} {'int8' if quantized else 'fp32'}{' @int' if run_id.endswith('dev') else ''}"
    return {
        "run_id": run_id,
        "label": label,
        "network": network,
        "backend": backend,
        "quantized": quantized,
        "on_device": run_id.endswith("dev"),
        "classes": classes,
        **{f"class_acc/{name}": value for name, value in accuracies.items()},
    }


@pytest.fixture
def two_networks() -> pd.DataFrame:
    """ResNet8 on onnx, KWS on onnx (with a device run), the autoencoder (no classes) on onnx."""
    cifar = dict.fromkeys(CLASS_NAMES, 0.9)
    rows = [
        row("r-fp32", "resnet8", "onnx", False, CLASS_NAMES, cifar),
        row("r-int8", "resnet8", "onnx", True, CLASS_NAMES, cifar | {"dog": 0.8}),
        row("k-fp32", "kws", "kws:onnx", False, KWS, {"down": 0.5, "go": 1.0, "silence": 1.0}),
        row("k-int8", "kws", "kws:onnx", True, KWS, {"down": 0.5, "go": 0.5, "silence": 1.0}),
        row("k-dev", "kws", "kws:onnx", True, KWS, {"down": 0.5, "go": 0.5, "silence": 1.0}),
        row("a-fp32", "ad", "ad:onnx", False, (), {}),
        row("a-int8", "ad", "ad:onnx", True, (), {}),
    ]
    return pd.DataFrame(rows)


def test_each_run_is_compared_over_its_own_networks_classes(two_networks: pd.DataFrame) -> None:
    labels = np.array([0, 0, 1, 1, 2, 2])  # KWS's test set: the one the device run's predictions are on
    correct = {"k-dev": np.array([True, False, True, True, False, False])}
    table = with_device_classes(two_networks, correct, labels)
    on_device = table.set_index("run_id").loc[
        "k-dev", ["class_acc/down", "class_acc/go", "class_acc/silence"]
    ]
    np.testing.assert_allclose(on_device.to_numpy(float), [0.5, 1.0, 0.0])  # by label order, not by name
    assert np.isnan(table.set_index("run_id").loc["k-dev", "class_acc/airplane"])

    deltas = analysis.class_deltas(table)
    assert list(deltas.index) == [f"resnet8: {name}" for name in CLASS_NAMES] + [
        f"kws: {name}" for name in KWS
    ]
    assert list(deltas.columns) == ["onnx int8", "kws:onnx int8", "kws:onnx int8 @int"]
    assert deltas.loc["resnet8: dog", "onnx int8"] == pytest.approx(-10.0)
    assert deltas.loc["kws: go", "kws:onnx int8"] == pytest.approx(-50.0)  # against KWS's FP32, not ResNet8's
    assert deltas.loc["kws: silence", "kws:onnx int8 @int"] == pytest.approx(-100.0)
    assert np.isnan(deltas.loc["kws: go", "onnx int8"])

    worst = analysis.worst_classes(deltas)
    assert list(worst["class"][:3]) == ["kws: silence", "kws: go", "resnet8: dog"]


def test_one_network_keeps_plain_class_names(two_networks: pd.DataFrame) -> None:
    kws = two_networks[two_networks["network"] == "kws"]
    assert list(analysis.class_deltas(kws).index) == list(KWS)
    no_classes = two_networks[two_networks["network"] == "ad"]
    assert (
        analysis.class_deltas(no_classes).empty
        and analysis.worst_classes(analysis.class_deltas(no_classes)).empty
    )


def test_a_runs_classes_come_from_its_tag_or_else_its_metrics() -> None:
    assert run_classes({"classes": json.dumps(["b", "a"])}, ["class_acc/a"], "kws") == ("b", "a")
    assert run_classes({}, [], "resnet8") == CLASS_NAMES
    assert run_classes({}, ["class_acc/go", "accuracy", "class_acc/down"], "kws") == ("down", "go")


def test_a_sweep_of_several_networks_is_recommended_network_by_network(monkeypatch) -> None:
    seen = []

    def per_network(table: pd.DataFrame, limit: float) -> tuple[list, pd.DataFrame]:
        network = table["network"].iloc[0]
        seen.append((sorted(set(table["network"])), limit))
        picks = [
            analysis.Pick("Best accuracy", f"{network} best", f"{network}-1", "d"),
            analysis.Pick(f"Best {network}:onnx", f"{network}:onnx best", f"{network}-1", "d"),
        ]
        return picks, pd.DataFrame({"delta_points": [-9.0 if network == "kws" else -6.0]})

    monkeypatch.setattr(analysis, "network_recommendations", per_network)
    table = pd.DataFrame({"network": ["kws", "ad", "kws"]})
    picks, over = analysis.recommendations(table, 5.0)
    assert seen == [(["ad"], 5.0), (["kws"], 5.0)]
    assert [pick.what for pick in picks] == [
        "Best accuracy, ad",
        "Best ad:onnx",
        "Best accuracy, kws",
        "Best kws:onnx",
    ]
    assert list(over["delta_points"]) == [-9.0, -6.0]
    one, _ = analysis.recommendations(table[table["network"] == "kws"], 5.0)
    assert [pick.what for pick in one] == ["Best accuracy", "Best kws:onnx"]

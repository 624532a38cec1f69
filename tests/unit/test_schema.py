"""The MLflow contract written once (resnet8ptq/tracking/schema.py) and its readers' page (docs/mlflow.md)
agree: every name the schema defines is on the page. (That the runs write only names the schema defines is
checked on a real sweep's store: tests/integration/test_mlflow_models.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resnet8ptq.tracking import schema

DOCS = Path(__file__).resolve().parents[2] / "docs" / "mlflow.md"


def documented() -> set[str]:
    """Every backticked token of docs/mlflow.md."""
    return set(re.findall(r"`([^`]+)`", DOCS.read_text()))


def on_the_page(name: str, tokens: set[str]) -> bool:
    """The name itself, or (a family) a token it stands for, is on the page."""
    regex = schema.pattern(name)
    return name in tokens or any(regex.match(token) for token in tokens)


@pytest.mark.parametrize("kind", ["metric", "tag"])
def test_every_metric_and_tag_of_the_schema_is_documented(kind: str) -> None:
    names = schema.METRICS if kind == "metric" else schema.TAGS
    tokens = documented()
    assert [name for name in names if not on_the_page(name, tokens)] == []


def test_every_artifact_of_the_schema_is_documented() -> None:
    """By its full path, or by its folder (``device/``) and its file name beside it."""
    tokens = documented()
    missing = []
    for path in schema.ARTIFACTS:
        folder, _, file = path.rpartition("/")
        in_folder = f"{folder}/" in tokens and ("<" in file or on_the_page(file, tokens))
        if not (on_the_page(path, tokens) or in_folder):
            missing.append(path)
    assert missing == []


def test_families_stand_for_their_members_only() -> None:
    assert schema.defines("metric", "class_acc/cat") and not schema.defines("metric", "class_acc/cat/x")
    assert schema.defines("tag", "device.rows") and schema.defines("tag", "search.trial.0007")
    assert schema.defines("artifact", "report/report_device_map.png")
    assert not schema.defines("metric", "accuracyx") and not schema.defines("artifact", "device/other.csv")
    assert schema.undefined("tag", {"backend", "bakcend"}) == ["bakcend"]


def test_the_report_reads_only_names_the_schema_defines() -> None:
    from resnet8ptq.report.runs import DEVICE_SETTINGS, METRIC_COLUMNS

    assert schema.undefined("metric", set(METRIC_COLUMNS)) == []
    assert schema.undefined("tag", {f"device.{name}" for name in DEVICE_SETTINGS}) == []


def test_the_device_run_writes_only_names_the_schema_defines() -> None:
    import numpy as np

    from resnet8ptq.device.config import DeviceConfig
    from resnet8ptq.device.evaluate import DeviceResult

    result = DeviceResult([0.5, 0.6], np.zeros(4), np.zeros(4), (0.4, 0.7), 0.5, 1, layer_sqnr={"conv": 30.0})
    assert schema.undefined("metric", set(result.metrics())) == []
    tags = DeviceConfig(kind="cim", rows=64, adc_bits=4, dac_range="percentile").tags()
    assert schema.undefined("tag", set(tags)) == []

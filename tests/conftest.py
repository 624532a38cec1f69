"""Two tiers: ``tests/unit`` (no data, no model, no subprocess: seconds; `make test-fast`) and
``tests/integration`` (the real CIFAR-10 and model, the CLI, servers; marked ``integration``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration ``integration`` (`pytest -m "not integration"` skips them)."""
    for item in items:
        if INTEGRATION in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _mlflow_tracking_uri_is_per_test(monkeypatch: pytest.MonkeyPatch):
    """A test that points MLflow somewhere (``mlflow.set_tracking_uri`` also exports MLFLOW_TRACKING_URI)
    must not leave later tests, or their subprocesses, writing into its store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        mlflow.set_tracking_uri(None)

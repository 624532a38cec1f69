"""Two tiers: ``tests/unit`` (no data, no model, no subprocess: seconds; `make test-fast`) and
``tests/integration`` (the real CIFAR-10 and model, the CLI, servers; marked ``integration``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INTEGRATION = Path(__file__).resolve().parent / "integration"


SHARED_SWEEP = "sweeps"
"""The session fixture of the three-toolchain sweep (tests/integration/conftest.py): the modules that use it
run in one worker, so it runs once."""


@pytest.hookimpl(wrapper=True)  # before every other implementation: pytest-xdist's reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]):
    """Mark every test under tests/integration ``integration`` (`pytest -m "not integration"` skips them), and
    put each module in one ``xdist_group`` for `pytest -n auto --dist loadgroup` (`make test`): a module's
    fixtures are built once, in one worker; the modules that use the shared sweep form one group."""
    sharing = {Path(item.fspath) for item in items if SHARED_SWEEP in getattr(item, "fixturenames", ())}
    for item in items:
        module = Path(item.fspath)
        if INTEGRATION in module.parents:
            item.add_marker(pytest.mark.integration)
        group = SHARED_SWEEP if module in sharing else str(module.relative_to(REPO))
        item.add_marker(pytest.mark.xdist_group(group))
    return (yield)


@pytest.fixture(autouse=True)
def _mlflow_tracking_uri_is_per_test(monkeypatch: pytest.MonkeyPatch):
    """A test that points MLflow somewhere (``mlflow.set_tracking_uri`` also exports MLFLOW_TRACKING_URI)
    must not leave later tests, or their subprocesses, writing into its store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        mlflow.set_tracking_uri(None)

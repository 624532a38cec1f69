"""Two tiers: ``tests/unit`` (no data, no model, no subprocess: seconds; `make test-fast`) and
``tests/integration`` (the real CIFAR-10 and model, the CLI, servers; marked ``integration``)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration ``integration`` (`pytest -m "not integration"` skips them)."""
    for item in items:
        if INTEGRATION in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)

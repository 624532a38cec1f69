"""Two tiers: ``tests/unit`` (no data, no model, no subprocess: seconds; `make test-fast`) and
``tests/integration`` (the real CIFAR-10 and model, the CLI, servers; marked ``integration``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from resnet8ptq.memory import keep_freed_memory

REPO = Path(__file__).resolve().parents[1]
INTEGRATION = Path(__file__).resolve().parent / "integration"


CLI_FIXTURE = "cli_env"
"""The environment `run.py` runs in under test (tests/integration/conftest.py): a test that needs it runs the
CLI."""
SHARED_SWEEP = "sweeps"
"""The session fixture of the three-toolchain sweep (tests/integration/conftest.py): the modules that use it
run in one worker, so it runs once."""


@pytest.hookimpl(wrapper=True)  # before every other implementation: pytest-xdist's reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]):
    """Mark every test under tests/integration ``integration`` (`pytest -m "not integration"` skips them) and
    every test that runs the CLI ``cli`` (the other markers are the modules' own ``pytestmark``), and
    put each module in one ``xdist_group`` for `pytest -n auto --dist loadgroup` (`make test`): a module's
    fixtures are built once, in one worker; the modules that use the shared sweep form one group, which goes
    first (the longest: it starts while the other workers take the rest)."""
    sharing = {Path(item.fspath) for item in items if SHARED_SWEEP in getattr(item, "fixturenames", ())}
    for item in items:
        module = Path(item.fspath)
        if INTEGRATION in module.parents:
            item.add_marker(pytest.mark.integration)
        if CLI_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cli)
        group = SHARED_SWEEP if module in sharing else str(module.relative_to(REPO))
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: Path(item.fspath) not in sharing)  # stable: modules stay whole, in order
    return (yield)


def pytest_configure(config: pytest.Config) -> None:
    """Under `pytest -n N` (`make test`), each worker runs on its own share of the cores: its CPU affinity,
    which the runs it starts inherit and size their threads by (``threads=null``). Without it each worker's
    runs take a thread per core, and on 2 cores two workers' ONNX Runtime and torch thread pools ran a sweep
    2x slower than with one thread each. And each keeps the memory its batches free, as a job's process does
    (resnet8ptq/memory.py), for the tests that run backends and stages in the worker itself."""
    keep_freed_memory()
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker and count and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        index = int(worker.removeprefix("gw"))
        os.sched_setaffinity(0, cores[index % len(cores) :: int(count)])


@pytest.fixture(autouse=True)
def _mlflow_tracking_uri_is_per_test(monkeypatch: pytest.MonkeyPatch):
    """A test that points MLflow somewhere (``mlflow.set_tracking_uri`` also exports MLFLOW_TRACKING_URI)
    must not leave later tests, or their subprocesses, writing into its store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        mlflow.set_tracking_uri(None)

"""Shared pytest fixtures: the CIFAR-10 assets directory and the loaded dataset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resnet8ptq.data import BINARY_DIR, Cifar10, load_cifar10


@pytest.fixture(scope="session")
def assets_dir() -> Path:
    """$RESNET8PTQ_ASSETS, else `shared/` beside the repository; must hold cifar-10-batches-bin/."""
    default = Path(__file__).resolve().parents[2] / "shared"
    path = Path(os.environ.get("RESNET8PTQ_ASSETS") or default).resolve()
    if not (path / BINARY_DIR).is_dir():
        pytest.fail(
            f"CIFAR-10 test data not found: {path / BINARY_DIR} does not exist. Set RESNET8PTQ_ASSETS to a "
            f"directory containing {BINARY_DIR}/ (default: {default})."
        )
    return path


@pytest.fixture(scope="session")
def cifar(assets_dir: Path) -> Cifar10:
    """The real CIFAR-10, verified and loaded once per test session."""
    return load_cifar10(assets_dir, download=False)

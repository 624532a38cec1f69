"""A failed download leaves no partial data directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from resnet8ptq import data
from resnet8ptq.data import load_cifar10
from resnet8ptq.errors import DataError
from tests.integration.servers import free_port


def test_failed_download_leaves_no_partial_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}/cifar-10-binary.tar.gz"
    monkeypatch.setattr(data, "BINARY_ARCHIVE_URL", url)
    root = tmp_path / "data"
    with pytest.raises(DataError, match=f"Could not download CIFAR-10 from {url}"):
        load_cifar10(root, download=True)
    assert list(root.iterdir()) == []  # no archive, no partial download, no extraction directory

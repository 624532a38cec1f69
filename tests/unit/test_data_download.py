"""CIFAR-10 download from a local archive: missing data, failures leave nothing, unsafe archives refused."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest

from resnet8ptq import data
from resnet8ptq.data import BINARY_DIR, PYTHON_DIR, load_cifar10
from resnet8ptq.errors import DataError
from tests.cifar_fakes import RECORD, patch_archive


def test_missing_data_without_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as info:
        load_cifar10("nowhere", download=False)
    message = str(info.value)
    assert str(tmp_path / "nowhere") in message  # absolute, not the relative argument
    assert str(tmp_path / "nowhere" / BINARY_DIR) in message
    assert PYTHON_DIR in message
    assert "test_batch.bin" in message
    assert "RESNET8PTQ_ASSETS" in message
    assert "data.root" in message
    assert not (tmp_path / "nowhere").exists()


def test_download_failure_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-archive.tar.gz"
    monkeypatch.setattr(data, "BINARY_ARCHIVE_URL", missing.as_uri())
    root = tmp_path / "root"
    with pytest.raises(DataError) as info:
        load_cifar10(root, download=True)
    message = str(info.value)
    assert f"Could not download CIFAR-10 from {missing.as_uri()}" in message
    assert str(root) in message
    assert BINARY_DIR in message
    assert "RESNET8PTQ_ASSETS" in message
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_download_refuses_unsafe_archive_members(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    archive = tmp_path / "evil.tar.gz"
    payload = b"x" * RECORD
    with tarfile.open(archive, "w:gz") as tar:
        ok = tarfile.TarInfo(f"{BINARY_DIR}/test_batch.bin")
        ok.size = len(payload)
        tar.addfile(ok, io.BytesIO(payload))
        if kind == "symlink":
            bad = tarfile.TarInfo(f"{BINARY_DIR}/data_batch_1.bin")
            bad.type = tarfile.SYMTYPE
            bad.linkname = "/etc/passwd"
            tar.addfile(bad)
        else:
            name = f"{BINARY_DIR}/../../evil.bin" if kind == "dotdot" else str(tmp_path / "evil.bin")
            bad = tarfile.TarInfo(name)
            bad.size = len(payload)
            tar.addfile(bad, io.BytesIO(payload))
    patch_archive(monkeypatch, archive)
    root = tmp_path / "root"
    with pytest.raises(DataError, match="refusing to extract unsafe member"):
        load_cifar10(root, download=True)
    assert list(root.iterdir()) == []
    assert not (tmp_path / "evil.bin").exists()


def test_archive_without_batches_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = tmp_path / "cifar-10-batches-py"
    wrong.mkdir()
    (wrong / "readme.html").write_text("not it")
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(wrong, arcname=PYTHON_DIR)
    shutil.rmtree(wrong)
    patch_archive(monkeypatch, archive)
    root = tmp_path / "root"
    with pytest.raises(DataError, match=f"no {BINARY_DIR}/ directory"):
        load_cifar10(root, download=True)
    assert list(root.iterdir()) == []

"""CIFAR-10 helpers for both test tiers: the binary record size and a local stand-in for the download."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from resnet8ptq import data

RECORD = 3073  # bytes per CIFAR-10 binary record: 1 label + 3,072 pixels


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def patch_archive(monkeypatch: pytest.MonkeyPatch, archive: Path, md5sum: str | None = None) -> None:
    monkeypatch.setattr(data, "BINARY_ARCHIVE_URL", archive.as_uri())
    monkeypatch.setattr(data, "BINARY_ARCHIVE_MD5", md5sum or md5(archive))

"""Checksummed, atomic downloads with a progress bar, published files found locally or downloaded, and file
hashing."""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.request
from pathlib import Path

from tqdm import tqdm

CHUNK_BYTES = 1 << 20
ASSETS_ENV = "RESNET8PTQ_ASSETS"
"""A directory holding local copies: ``cifar-10-batches-bin/`` and ``models/<published file>``."""


class FetchError(RuntimeError):
    """A download failed or its checksum did not match."""


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file, read in chunks."""
    with Path(path).open("rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file."""
    return file_digest(path, "sha256")


def download(url: str, dest: Path, *, expected: str, algorithm: str = "sha256", what: str = "file") -> Path:
    """Download ``url`` to ``dest``, check its ``algorithm`` digest, and only then move it into place.

    A failed or interrupted download leaves nothing at ``dest`` (the partial file is a temporary one
    beside it and is removed).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.new(algorithm)
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"Downloading {what}") as bar:
                while chunk := response.read(CHUNK_BYTES):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        actual = digest.hexdigest()
        if actual != expected:
            raise FetchError(f"Downloaded {what} from {url} has {algorithm} {actual}, expected {expected}.")
        os.replace(tmp, dest)
    except (OSError, ValueError, http.client.HTTPException) as err:
        raise FetchError(f"Could not download {what} from {url}: {err}") from err
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def published_file(filename: str, url: str, sha256: str, cache_dir: Path, what: str) -> Path:
    """A published file: ``$RESNET8PTQ_ASSETS/models/<filename>`` when present, else the copy in
    ``<cache_dir>/models/``, downloaded from ``url`` (sha256-checked, atomically) when absent.

    The caller checks a local copy's sha256 (a download is checked here). Raises :class:`FetchError`.
    """
    assets = os.environ.get(ASSETS_ENV)
    local = Path(assets).expanduser().resolve() / "models" / filename if assets else None
    if local is not None and local.is_file():
        return local
    cached = cache_dir / "models" / filename
    if not cached.is_file():
        download(url, cached, expected=sha256, what=what)
    return cached

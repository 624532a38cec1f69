"""What the on-disk caches under ``cache_dir`` share (the algorithms' output,
:mod:`resnet8ptq.algorithms._cache`; ONNX Runtime's calibration ranges,
:mod:`resnet8ptq.backends.onnx.calibration_cache`): a key that hashes
everything an entry depends on, including the libraries that compute it, this package's source code (any
change to it makes a new key), the CPU's instruction-set features and the variables that force another
kernel path on it; a file lock per key, so that parallel jobs needing the same entry compute it once; an
entry written into a scratch directory and renamed into place, so that a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def key(parts: dict[str, Any], libraries: Iterable[str]) -> str:
    """A short hash of ``parts`` (JSON-able, or turned to strings) and of the computing environment: the
    ``libraries``' versions, this package's source, the CPU's ISA and the kernel-path variables."""
    from resnet8ptq.hardware import detect, kernel_path_env

    environment = {
        "libraries": {name: _version(name) for name in libraries},
        "source": source_fingerprint(),
        "isa": list(detect().isa),
        "kernel_path": kernel_path_env(),
    }
    text = json.dumps(parts | environment, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes (a model's, for a key)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def array_digest(array: np.ndarray) -> list[object]:
    """An array's bytes' SHA-256 with its shape and dtype (the calibration images', for a key)."""
    return [hashlib.sha256(array.tobytes()).hexdigest(), list(array.shape), str(array.dtype)]


@cache
def source_fingerprint() -> str:
    """A hash of this package's Python source: a change to the code is a new key, never a stale entry."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def computing(root: Path, entry_key: str) -> contextlib.AbstractContextManager:
    """Held while an entry of ``root`` is looked up and, if absent, computed and stored: parallel jobs that
    need the same entry compute it once. No lock where ``root`` cannot be written."""
    from filelock import FileLock

    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        return contextlib.nullcontext()
    return FileLock(root / f"{entry_key}.lock")


def store(root: Path, entry_key: str, write: Callable[[Path], None]) -> None:
    """Make the entry ``root/entry_key`` by ``write(directory)`` into a scratch directory renamed into place.
    Called under the key's lock (:func:`computing`) after no complete entry was found: what lies at that
    path is part of one, left by a killed run, and is replaced. A cache that cannot be written only costs a
    re-computation."""
    scratch = root / f"{entry_key}.{os.getpid()}.tmp"
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        write(scratch)
        shutil.rmtree(root / entry_key, ignore_errors=True)
        os.rename(scratch, root / entry_key)
    except OSError:
        pass  # not writable
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"

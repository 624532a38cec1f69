"""What every MLPerf Tiny data set's preparation shares: the prepared arrays, the user's options, a
preparer's two steps, the atomic ``.npz`` write and the file listing, sampling and WAV header helpers."""

from __future__ import annotations

import os
import tempfile
import wave
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from resnet8ptq.errors import DataError


@dataclass(frozen=True)
class Prepared:
    """A data set in the ``.npz`` layout: float32 inputs as the model takes them, int64 labels, the classes'
    names and optionally each test input's scored sample (an audio clip)."""

    calibration_inputs: np.ndarray
    test_inputs: np.ndarray
    test_labels: np.ndarray
    class_names: tuple[str, ...]
    test_groups: np.ndarray | None = None


@dataclass(frozen=True)
class Options:
    """What a user chooses when preparing: the calibration sample's size and seed, a second source for the
    calibration inputs where MLPerf draws them from another split's files, a machine ID (anomaly detection
    scores each machine on its own)."""

    calibration: int = 200
    seed: int = 0
    calibration_source: Path | None = None
    machine_id: str | None = None


@dataclass(frozen=True)
class Preparer:
    """One MLPerf Tiny data set: ``check`` refuses a source that is not its layout, before any work;
    ``prepare`` reads it."""

    check: Callable[[Path, Options], None]
    prepare: Callable[[Path, Options], Prepared]
    source: str  # where the data set comes from; the folders ``--source`` (``--calibration-source``) name


def write_npz(prepared: Prepared, out: Path) -> None:
    """Write ``prepared`` to ``out`` through a temporary file in the same folder: an interrupted write leaves
    no partial ``.npz`` for a run to read."""
    out.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        "calibration_inputs": prepared.calibration_inputs.astype(np.float32, copy=False),
        "test_inputs": prepared.test_inputs.astype(np.float32, copy=False),
        "test_labels": prepared.test_labels.astype(np.int64, copy=False),
        "class_names": np.array(prepared.class_names),
    }
    if prepared.test_groups is not None:
        arrays["test_groups"] = prepared.test_groups.astype(np.int64, copy=False)
    handle, temporary = tempfile.mkstemp(suffix=".npz", dir=out.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez(file, **arrays)
        os.replace(temporary, out)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def sorted_files(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files under ``folder`` (recursively, folders and names sorted, as Keras lists them) whose
    lower-cased name ends with one of ``suffixes``."""
    found = []
    for root, _, names in sorted(os.walk(folder), key=lambda walked: walked[0]):
        found += [Path(root) / name for name in sorted(names) if name.lower().endswith(suffixes)]
    return found


def seeded_sample(items: list, count: int, seed: int) -> list:
    """``count`` of ``items`` (all when fewer), drawn with ``seed``, in their original order."""
    if len(items) <= count:
        return list(items)
    chosen = np.random.default_rng(seed).choice(len(items), size=count, replace=False)
    return [items[i] for i in sorted(chosen)]


@dataclass(frozen=True)
class WavFormat:
    """What a WAV file's header says: channels, bits per sample, sample rate, samples per channel."""

    channels: int
    bits: int
    rate: int
    samples: int

    def __str__(self) -> str:
        return f"{self.channels} channel(s), {self.bits}-bit, {self.rate} Hz, {self.samples} samples"


def wav_format(path: Path, data_set: str) -> WavFormat:
    """``path``'s WAV header, read without its samples; a file that is not a PCM WAV is a ``DataError``."""
    try:
        with wave.open(str(path), "rb") as clip:
            return WavFormat(
                clip.getnchannels(), 8 * clip.getsampwidth(), clip.getframerate(), clip.getnframes()
            )
    except (OSError, EOFError, wave.Error) as error:
        raise DataError(f"{data_set}: {path} is not a PCM WAV file ({error})") from error


def labelled(
    read: Callable[[list[Path], str], np.ndarray],
    test: list[tuple[Path, int]],
    calibration: list[Path],
    classes: tuple[str, ...],
) -> Prepared:
    """A classifier's data set from its files: ``read(paths, what)`` gives their model inputs, the test
    files come with their labels."""
    return Prepared(
        calibration_inputs=read(calibration, "calibration"),
        test_inputs=read([path for path, _ in test], "test"),
        test_labels=np.array([label for _, label in test], np.int64),
        class_names=classes,
    )

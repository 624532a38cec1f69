"""ONNX Runtime's calibration ranges on disk (``cache_dir/calib/<key>/``): runs that calibrate the same model
on the same images in the same way (a sweep over storage types, widths, per-channel weights, devices or
reports) compute the activations once. On a slow CPU, calibration is as much of an ORT run's time as its
evaluation: in CI at 3fe20f3 on the 2-core AVX2-only AMD EPYC, one thread per run, ``calib_seconds`` was
12 to 23 s for minmax and 77 s for entropy (float64 activations, :mod:`.float64`; ORT's histograms), beside
``eval_seconds`` of 13 to 22 s.

The key (:func:`resnet8ptq.disk_cache.key`) is what the ranges depend on: the FP32 model's bytes (after the
`algo` steps), the calibration images' bytes, the `calib` settings (``calib.weights`` aside: it acts on the
weights after calibration), the op types calibrated, the threads that compute the activations, and for
``calib=mse`` the whole quantization spec (its ranges are fitted to each tensor's integer range), with the
libraries, this package's source, the CPU's ISA and kernel-path variables. An entry holds the ranges in ORT's
own calibration-cache format (``save_tensors_data``) and the seconds they took; a run that takes them logs
those seconds as its ``calib_seconds`` and the tag ``calib.reused=true``, as `algo.reuse` does for the
algorithms' output. Delete ``cache_dir/calib`` to calibrate again.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from onnxruntime.quantization.calibrate import TensorsData, load_tensors_data, save_tensors_data

from resnet8ptq import disk_cache
from resnet8ptq.spec import QuantSpec

CACHE_SUBDIR = "calib"
RANGES_FILE = "ranges.json"
RECORD_FILE = "record.json"
LIBRARIES = ("numpy", "onnx", "onnxruntime", "onnx2torch", "torch")
"""What the ranges are computed with (:mod:`.float64`: onnx2torch and torch; ORT's calibrators)."""
REUSED_TAG = "calib.reused"
"""``true`` when a run took its activation ranges from an earlier run's calibration."""


def key(onnx_path: Path, images: np.ndarray, spec: QuantSpec, op_types: list[str], threads: int) -> str:
    """A short hash of what ORT's calibration of the model at ``onnx_path`` on ``images`` depends on."""
    parts: dict[str, object] = {
        "model": disk_cache.file_digest(onnx_path),
        "images": disk_cache.array_digest(images),
        "calib": dataclasses.asdict(dataclasses.replace(spec.calib, weights="minmax")),
        "op_types": sorted(op_types),
        "threads": threads,
    }
    if spec.calib.method == "mse":
        parts["spec"] = dataclasses.asdict(dataclasses.replace(spec, learned_ranges=()))
    return disk_cache.key(parts, LIBRARIES)


@dataclasses.dataclass(frozen=True)
class Calibrated:
    """Activation ranges as ORT's calibrator computed them, the seconds that took, and whether they came
    from the cache."""

    ranges: TensorsData
    seconds: float
    reused: bool


def calibrated(cache_dir: Path | None, entry_key: str, calibrate: Callable[[], TensorsData]) -> Calibrated:
    """``calibrate()``'s ranges, taken from ``cache_dir`` when an earlier run stored them under
    ``entry_key``, else computed and stored there (None: computed, nothing stored). A job that needs ranges
    another process is computing waits for them (a file lock per key)."""
    if cache_dir is None:
        return _compute(calibrate)
    root = cache_dir / CACHE_SUBDIR
    with disk_cache.computing(root, entry_key):
        found = _load(root / entry_key)
        if found is not None:
            return found
        result = _compute(calibrate)

        def write(directory: Path) -> None:
            save_tensors_data(result.ranges, directory / RANGES_FILE)
            (directory / RECORD_FILE).write_text(json.dumps({"seconds": result.seconds}))

        disk_cache.store(root, entry_key, write)
    return result


def _compute(calibrate: Callable[[], TensorsData]) -> Calibrated:
    start = time.perf_counter()
    ranges = calibrate()
    return Calibrated(ranges, time.perf_counter() - start, reused=False)


def _load(entry: Path) -> Calibrated | None:
    """A stored entry, or None when there is none (or only part of one)."""
    if not ((entry / RANGES_FILE).is_file() and (entry / RECORD_FILE).is_file()):
        return None
    seconds = json.loads((entry / RECORD_FILE).read_text())["seconds"]
    return Calibrated(load_tensors_data(entry / RANGES_FILE), seconds, reused=True)

"""The algorithms' output on disk (``cache_dir/algo/<key>/``), so that runs that differ only in what comes
after the algorithms (the backend, the `device`, the reports) learn once: a sweep ``backend=onnx,torch
algo=brecq`` reconstructs the model once and both backends quantize the same learned model.

The key is everything the output depends on: the FP32 model's bytes, the calibration images' bytes, the
quantization spec, the steps and their parameters, the seed, the libraries that compute it, this package's
source code (any change to it makes a new key), the CPU's instruction-set features and the variables that
force another kernel path on it (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ...: learned rounding
differs between kernel paths: docs/algorithms.md#reproducibility-of-learned-rounding). An entry is written
into a scratch directory and renamed into place, so a reader never sees half of one; a file lock per key
makes parallel jobs that need the same entry compute it once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resnet8ptq import disk_cache
from resnet8ptq.algorithms.base import Prepared

if TYPE_CHECKING:
    import numpy as np

    from resnet8ptq.spec import QuantSpec

CACHE_SUBDIR = "algo"
RECORD_FILE = "prepared.json"
LIBRARIES = ("numpy", "onnx", "onnxruntime", "onnx2torch", "torch")
"""What the algorithms compute with (ONNX Runtime for bias correction, torch for the learned ones)."""


def key(
    onnx_path: Path,
    images: np.ndarray,
    spec: QuantSpec,
    steps: dict[str, Any],
    seed: int,
    device: dict[str, Any] | None = None,
) -> str:
    """A short hash of what the steps' output depends on (:func:`resnet8ptq.disk_cache.key`: with the
    libraries, the source and the CPU); ``steps``: name -> its parameters (a dataclass or None), in order;
    ``device``: the crossbar settings device-aware learning saw."""
    parts = {
        "model": disk_cache.file_digest(onnx_path),
        "images": disk_cache.array_digest(images),
        "spec": dataclasses.asdict(dataclasses.replace(spec, learned_ranges=())),
        "steps": [
            [name, dataclasses.asdict(parameters) if parameters is not None else None]
            for name, parameters in steps.items()
        ],
        "seed": seed,
        **({"device": device} if device is not None else {}),
    }
    return disk_cache.key(parts, LIBRARIES)


def computing(cache_dir: Path, entry_key: str) -> contextlib.AbstractContextManager:
    """Held while an entry is looked up and, if absent, computed and stored (:func:`disk_cache.computing`)."""
    return disk_cache.computing(cache_dir / CACHE_SUBDIR, entry_key)


def load(cache_dir: Path, entry_key: str, workdir: Path) -> Prepared | None:
    """The output stored under ``entry_key``, its model copied into ``workdir``, with the seconds the steps
    took when they ran; None when there is none."""
    entry = cache_dir / CACHE_SUBDIR / entry_key
    if not (entry / RECORD_FILE).exists():
        return None
    record = json.loads((entry / RECORD_FILE).read_text())
    if not (entry / record["model"]).exists():
        return None
    workdir.mkdir(parents=True, exist_ok=True)
    model = Path(shutil.copyfile(entry / record["model"], workdir / record["model"]))
    ranges = {tensor: (low, high) for tensor, (low, high) in record["ranges"].items()}
    return Prepared(model, record["seconds"], record["tags"], ranges, _adc_steps(record.get("adc_steps")))


def _adc_steps(records: dict[str, dict] | None) -> dict:
    """The learned ADC steps of a stored entry (none: no torch import)."""
    if not records:
        return {}
    from resnet8ptq.device.adc import LayerSteps

    return {layer: LayerSteps.from_record(record) for layer, record in records.items()}


def store(cache_dir: Path, entry_key: str, prepared: Prepared) -> None:
    """Save ``prepared`` under ``entry_key``, atomically (:func:`disk_cache.store`)."""

    def write(directory: Path) -> None:
        model = prepared.onnx_path
        shutil.copyfile(model, directory / model.name)
        record = {
            "model": model.name,
            "seconds": prepared.seconds,
            "tags": prepared.tags,
            "ranges": prepared.ranges,
            "adc_steps": {layer: steps.to_record() for layer, steps in prepared.adc_steps.items()},
        }
        (directory / RECORD_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))

    disk_cache.store(cache_dir / CACHE_SUBDIR, entry_key, write)

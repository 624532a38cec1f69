"""ONNX Runtime's calibration ranges on disk (resnet8ptq/backends/onnx/calibration_cache.py), on a hand-made
conv graph: a second quantization of the same model on the same images takes the first one's ranges (tag
`calib.reused`, its seconds) and makes the same model file; another storage type or per-channel weights reuse
them, another model, sample, method, thread count, or for `calib=mse` another width, does not; a half-written
entry is computed again and replaced."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from resnet8ptq.backends.onnx import calibration_cache
from resnet8ptq.backends.onnx.backend import OP_TYPES, OnnxRuntimeBackend
from resnet8ptq.calibration import CalibConfig
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.spec import QuantSpec
from tests.unit.test_onnx_float64 import conv_model

SPEC = QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"))
IMAGES = np.random.default_rng(0).uniform(0, 3, size=(8, 2, 6, 6)).astype(np.float32)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    weight = np.random.default_rng(1).normal(size=(4, 2, 3, 3)).astype(np.float32)
    return conv_model(tmp_path / "model.onnx", weight)


def backend(cache_dir: Path | None) -> OnnxRuntimeBackend:
    made = OnnxRuntimeBackend(native=False, threads=1)
    made.cache_dir = cache_dir
    return made


def test_a_second_run_takes_the_ranges_and_makes_the_same_model(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = backend(cache).quantize(model, IMAGES, SPEC, tmp_path / "first")
    second = backend(cache).quantize(model, IMAGES, SPEC, tmp_path / "second")
    assert first.tags == {"calib.reused": "false"} and second.tags == {"calib.reused": "true"}
    assert second.calib_seconds == first.calib_seconds > 0
    assert second.ranges == first.ranges
    assert second.path.read_bytes() == first.path.read_bytes()
    assert len(list((cache / "calib").glob("*/ranges.json"))) == 1
    uncached = backend(None).quantize(model, IMAGES, SPEC, tmp_path / "uncached")
    assert uncached.tags == {"calib.reused": "false"} and uncached.ranges == first.ranges
    assert uncached.path.read_bytes() == first.path.read_bytes()


def test_the_key_is_what_the_activation_ranges_depend_on(model: Path, tmp_path: Path) -> None:
    def key(spec: QuantSpec = SPEC, images: np.ndarray = IMAGES, threads: int = 1, path: Path = model) -> str:
        return calibration_cache.key(path, images, spec, ["Conv"], threads)

    before = key()
    for same in (
        dataclasses.replace(SPEC, dtype=DtypeConfig("uint8", "uint8")),
        dataclasses.replace(SPEC, per_channel=True),
        dataclasses.replace(SPEC, calib=CalibConfig("minmax", weights="mse")),  # acts on weights only
    ):
        assert key(spec=same) == before, same
    other_model = conv_model(tmp_path / "other.onnx", np.ones((4, 2, 3, 3), np.float32))
    changed = [
        key(images=IMAGES[:4]),
        key(threads=2),
        key(path=other_model),
        key(spec=dataclasses.replace(SPEC, calib=CalibConfig("minmax", symmetric=True))),
        key(spec=dataclasses.replace(SPEC, calib=CalibConfig("percentile", num_bins=128, percentile=99.9))),
    ]
    assert before not in changed and len(set(changed)) == len(changed)
    mse = dataclasses.replace(SPEC, calib=CalibConfig("mse", num_bins=128))
    narrower = dataclasses.replace(mse, dtype=DtypeConfig("int8", "int8", activation_bits=6))
    assert key(spec=mse) != key(spec=narrower)  # its ranges are fitted to each tensor's integer range


def test_a_half_written_entry_is_computed_again(model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    entry_key = calibration_cache.key(model, IMAGES, SPEC, OP_TYPES, threads=1)
    entry = cache / "calib" / entry_key
    entry.mkdir(parents=True)
    (entry / "record.json").write_text('{"seconds": 1.0}')  # no ranges beside it
    (cache / "calib" / f"{entry_key}.123.tmp").mkdir()  # a killed run's scratch directory
    made = backend(cache).quantize(model, IMAGES, SPEC, tmp_path / "run")
    assert made.tags == {"calib.reused": "false"} and made.calib_seconds != 1.0
    again = backend(cache).quantize(model, IMAGES, SPEC, tmp_path / "again")  # the entry was replaced
    assert again.tags == {"calib.reused": "true"} and again.calib_seconds == made.calib_seconds

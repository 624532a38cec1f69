"""The same configuration makes the same model on every kernel path of this CPU (issue 44): the headline sweep
and a TFLite run, calibrated and quantized in processes that force torch's, oneDNN's and MKL's instruction
sets down and change the thread count, give identical calibration ranges and model digests. ONNX Runtime and
PyTorch calibrate in float64 (their float32 kernels' order of summation is what moves with the CPU); TFLite's
converter calibrates in its own float32 kernels, which no variable here reaches (its row checks the thread
count only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from resnet8ptq.hardware import detect
from resnet8ptq.model import MODEL_FILENAME, CanonicalModel
from tests.integration import pinned

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("kernel_path_child.py")
PATHS = {
    "native, 2 threads": ({}, 2),
    "ATen and oneDNN at AVX2, 1 thread": ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, 1),
    "ATen without SIMD dispatch, oneDNN at SSE4.1, MKL's SSE2 path": (
        {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE"},
        2,
    ),
}
"""Kernel paths: the environment (read by torch, oneDNN and MKL at import) and the thread count. MKL's DGEMM
carries the float64 calibration's convolutions; ``MKL_CBWR=COMPATIBLE`` moves it off the path MKL picks for
this CPU (other ``MKL_CBWR`` values fall back to it on AMD processors)."""


@pytest.fixture(scope="module")
def made(
    canonical_model: CanonicalModel,
    assets_dir: Path,
    data: tuple[np.ndarray, np.ndarray, np.ndarray],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict]:
    """Each path's digests of each configuration (kernel_path_child.py)."""
    folder = tmp_path_factory.mktemp("kernel-paths")
    calibration = folder / "calibration.npy"
    np.save(calibration, data[0])
    made = {}
    for index, (name, (env, threads)) in enumerate(PATHS.items()):
        args = [canonical_model.onnx_path, assets_dir / "models" / MODEL_FILENAME, calibration]
        command = [sys.executable, str(CHILD), *map(str, args), str(folder / f"path-{index}"), str(threads)]
        done = subprocess.run(
            command, env={**os.environ, **env}, capture_output=True, text=True, timeout=900, check=False
        )
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        made[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return made


def moved_tensors(first: dict, other: dict) -> list[str]:
    """The tensors whose range differs between two paths' results, with both ranges."""
    names = sorted(first["tensors"].keys() | other["tensors"].keys())
    return [
        f"{name}: {[float.fromhex(v) for v in first['tensors'].get(name, [])]} against "
        f"{[float.fromhex(v) for v in other['tensors'].get(name, [])]}"
        for name in names
        if first["tensors"].get(name) != other["tensors"].get(name)
    ]


@pytest.mark.parametrize("path", list(PATHS)[1:])
def test_same_ranges_and_model_on_every_kernel_path(made: dict[str, dict], path: str) -> None:
    first_path = next(iter(PATHS))
    for configuration, first in made[first_path].items():
        other = made[path][configuration]
        assert other["ranges"] == first["ranges"], (
            f"{configuration}: calibration ranges differ on {path!r} from {first_path!r}: "
            + "; ".join(moved_tensors(first, other))
        )
        assert other["model"] == first["model"], (
            f"{configuration}: same ranges, but the model differs on {path!r} from {first_path!r}"
        )


def test_ranges_are_not_trivially_equal(made: dict[str, dict]) -> None:
    """The comparison can fail: the configurations calibrate different tensors and ranges."""
    digests = {result["ranges"] for result in next(iter(made.values())).values()}
    assert len(digests) >= 3
    assert all(len(result["tensors"]) >= 10 for result in next(iter(made.values())).values())


@pytest.mark.parametrize("configuration", ["onnx int8", "onnx uint8", "torch int8", "torch uint8"])
def test_the_headline_models_are_the_pinned_ones(made: dict[str, dict], configuration: str) -> None:
    """The same bytes as on the CPU kind they were pinned on (tests/integration/pinned.py)."""
    result = made[next(iter(PATHS))][configuration]
    found = {"digest.model": result["model"], "digest.calibration_ranges": result["ranges"]}
    pinned.check(configuration, found, detect())

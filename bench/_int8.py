"""What the device benches share: the test set, the run's default calibration sample and ResNet8 quantized
as a default device run quantizes it (ONNX Runtime int8 per-channel MinMax)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resnet8ptq.backends.onnx.backend import OnnxRuntimeBackend  # noqa: E402
from resnet8ptq.calibration import CalibConfig  # noqa: E402
from resnet8ptq.data import calibration_set, load_cifar10, to_model_input  # noqa: E402
from resnet8ptq.dtype import DtypeConfig  # noqa: E402
from resnet8ptq.model import MODEL_SHA256, CanonicalModel, canonical_onnx, resolve_source  # noqa: E402
from resnet8ptq.spec import QuantSpec  # noqa: E402


@dataclass
class Inputs:
    """The test images (as the model takes them) and labels, and the calibration sample."""

    images: np.ndarray
    labels: np.ndarray
    calibration: np.ndarray


def inputs() -> Inputs:
    """CIFAR-10 from RESNET8PTQ_ASSETS (default ../shared); 100 training images a class, seed 42: a run's
    default calibration sample."""
    assets = Path(os.environ.get("RESNET8PTQ_ASSETS", REPO.parent / "shared"))
    data = load_cifar10(assets, download=False)
    calibration, _ = calibration_set(data, 100, 42)
    return Inputs(to_model_input(data.test_images), data.test_labels, calibration)


def canonical_model(cache: Path) -> CanonicalModel:
    """MLPerf Tiny's ResNet8 as the canonical FP32 ONNX model, converted into ``cache``."""
    assets = Path(os.environ.get("RESNET8PTQ_ASSETS", REPO.parent / "shared"))
    h5, sha256 = resolve_source(assets / "models" / "pretrainedResnet.h5", MODEL_SHA256, cache)
    return canonical_onnx(h5, sha256, cache)


def quantized_int8(
    canonical: CanonicalModel, calibration: np.ndarray, cache: Path, per_channel: bool = True
) -> Path:
    """The QDQ model ONNX Runtime makes, int8 MinMax, per-channel weights unless told otherwise (reference
    path: no native kernels)."""
    spec = QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"), per_channel=per_channel)
    folder = cache / ("q" if per_channel else "q-per-tensor")
    return OnnxRuntimeBackend(native=False).quantize(canonical.onnx_path, calibration, spec, folder).path

"""What a backend provides: an FP32 model and a quantized one, both as predictors plus a saved file."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from resnet8ptq.calibration import CalibSpec

Predictor = Callable[[np.ndarray], np.ndarray]
"""NHWC float32 raw 0-255 images (any batch size) -> class probabilities (N, 10)."""

QUANT_DTYPES = ("int8", "uint8")


@dataclass(frozen=True)
class QuantSpec:
    """One quantization configuration: the `dtype`, `calib` and `per_channel` config choices."""

    activation: str
    weight: str
    calib: CalibSpec
    per_channel: bool

    def __post_init__(self) -> None:
        for role, value in (("activation", self.activation), ("weight", self.weight)):
            if value not in QUANT_DTYPES:
                raise ValueError(f"dtype.{role}={value!r}: expected one of {', '.join(QUANT_DTYPES)}.")
        if not isinstance(self.per_channel, bool):
            raise ValueError(f"per_channel={self.per_channel!r}: expected true or false.")


@dataclass(frozen=True)
class TensorRange:
    """The calibrated range of one activation tensor."""

    tensor: str
    min: float
    max: float


@dataclass(frozen=True)
class LayerError:
    """Signal-to-quantization-noise ratio of one layer's weights or activations against the FP32 model."""

    layer: str
    kind: str  # "weight" | "activation"
    sqnr_db: float


@dataclass
class Model:
    """A runnable model and the file it was saved to (its size is the model size)."""

    predict: Predictor
    path: Path


@dataclass
class QuantizedModel(Model):
    """A quantized model with what the run logs about how it was made."""

    activation_dtype: str  # effective, read back from the saved model
    weight_dtype: str  # effective, read back from the saved model
    execution: str  # "native": real integer kernels ran; "simulated": quantize/dequantize in float
    ranges: list[TensorRange]
    calib_seconds: float
    quantize_seconds: float
    metrics: dict[str, float] = field(default_factory=dict)  # backend-specific, e.g. compile_seconds
    tags: dict[str, str] = field(default_factory=dict)  # backend-specific, e.g. execution_reason


class Backend(ABC):
    """A quantization library. Subclasses live in ``resnet8ptq/backends/<NAME>.py``."""

    NAME: ClassVar[str]

    def __init__(self, threads: int | None = None) -> None:
        """``threads``: compute threads for inference (None: the library's default, all cores)."""
        self.threads = threads

    @abstractmethod
    def load_fp32(self, onnx_path: Path, workdir: Path) -> Model:
        """The FP32 model in this backend, built from the canonical ONNX model."""

    @abstractmethod
    def quantize(
        self, fp32: Model, onnx_path: Path, calibration_images: np.ndarray, spec: QuantSpec, workdir: Path
    ) -> QuantizedModel:
        """Calibrate on ``calibration_images`` (NHWC float32) and quantize; save the model under workdir."""

    @abstractmethod
    def layer_errors(
        self, fp32: Model, quantized: QuantizedModel, onnx_path: Path, images: np.ndarray, workdir: Path
    ) -> list[LayerError]:
        """Per-layer SQNR (dB) of the quantized weights and activations against ``fp32``, on ``images``."""

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Versions of the libraries this backend runs on, logged as tags."""

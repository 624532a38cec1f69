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
    reduce_range: bool = False  # weights in 7 bits (ORT's reduce_range): no u8s8 saturation without VNNI

    def __post_init__(self) -> None:
        for role, value in (("activation", self.activation), ("weight", self.weight)):
            if value not in QUANT_DTYPES:
                raise ValueError(f"dtype.{role}={value!r}: expected one of {', '.join(QUANT_DTYPES)}.")
        for name in ("per_channel", "reduce_range"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected true or false.")


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


@dataclass(frozen=True)
class Runtime:
    """How the library runs a quantized model on this CPU: its predictor and which kernels it uses."""

    predict: Predictor
    integer_kernels: bool  # whether integer (int8/uint8) kernels run the conv/linear layers
    kernels: str  # what ran (e.g. "QLinearConv x9, QGemm x1"), or why no integer kernel did


@dataclass
class QuantizedModel:
    """A quantized model, saved, in its two forms, with what the run logs about how it was made."""

    path: Path
    reference: Predictor  # the exact quantize/dequantize semantics (same on every CPU up to float rounding)
    runtime: Runtime  # what the library executes on this CPU (may be ``reference`` itself)
    activation_dtype: str  # effective, read back from the saved model
    weight_dtype: str  # effective, read back from the saved model
    ranges: list[TensorRange]
    calib_seconds: float
    quantize_seconds: float
    metrics: dict[str, float] = field(default_factory=dict)  # backend-specific, e.g. compile_seconds
    tags: dict[str, str] = field(default_factory=dict)  # backend-specific, e.g. execution_reason


class Backend(ABC):
    """A quantization library. Subclasses live in ``resnet8ptq/backends/<NAME>.py``."""

    NAME: ClassVar[str]

    def __init__(self, native: bool = True, threads: int | None = None) -> None:
        """``native``: also build the runtime's integer-kernel form where it has one (False: reference only).
        ``threads``: compute threads for inference (None: the library's default, all cores)."""
        self.native = native
        self.threads = threads

    @abstractmethod
    def load_fp32(self, onnx_path: Path, workdir: Path) -> Model:
        """The FP32 model in this backend, built from the canonical ONNX model."""

    @abstractmethod
    def quantize(
        self, onnx_path: Path, calibration_images: np.ndarray, spec: QuantSpec, workdir: Path
    ) -> QuantizedModel:
        """Calibrate on ``calibration_images`` (NHWC float32) and quantize the canonical model at
        ``onnx_path``; save the model under ``workdir``."""

    @abstractmethod
    def layer_errors(
        self, fp32: Model, quantized: QuantizedModel, onnx_path: Path, images: np.ndarray, workdir: Path
    ) -> list[LayerError]:
        """Per-layer SQNR (dB) of the quantized weights and activations against ``fp32``, on ``images``."""

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Versions of the libraries this backend runs on, logged as tags."""

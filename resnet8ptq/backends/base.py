"""The contract between the pipeline and a backend: its config, the models it returns, what it must do.

A backend is a package ``resnet8ptq/backends/<name>/`` with ``config.py`` (a :class:`BackendConfig` subclass,
registered in Hydra's ConfigStore as ``<name>_schema``) and a :class:`Backend` subclass that
``conf/backend/<name>.yaml`` names as its ``_target_``. It starts from the canonical FP32 ONNX model, or from
the Keras .h5 when its converter reads Keras itself (:attr:`Backend.SOURCE`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
from omegaconf import MISSING

from resnet8ptq.device.graph import IntegerModel
from resnet8ptq.errors import Unsupported
from resnet8ptq.hardware import usable_cores
from resnet8ptq.layer_errors import TensorPairs
from resnet8ptq.spec import LayerError, LayerPrecision, QuantSpec, TensorRange, base_precision

Predictor = Callable[[np.ndarray], np.ndarray]
"""NHWC float32 raw 0-255 images (any batch size) -> class probabilities (N, 10)."""


@dataclass
class BackendConfig:
    """What every backend's config holds (`conf/backend/<name>.yaml`): the class to instantiate and whether to
    build the runtime's integer-kernel form. Subclasses add the backend's own options."""

    _target_: str = MISSING
    native: bool = True  # also build and evaluate the runtime's integer-kernel form (accuracy_native)


@dataclass(frozen=True)
class MlflowFlavor:
    """How a saved model of this backend is logged as an MLflow Model: the flavor module (``mlflow.onnx``,
    ``mlflow.pyfunc``, ...), the flavor's ``log_model`` arguments, and the pip requirements to load it."""

    flavor: ModuleType
    arguments: dict[str, Any]
    requirements: list[str]


ONNX_SOURCE = "onnx"
KERAS_SOURCE = "keras"


@dataclass
class Model:
    """A runnable model and the file it was saved to (its size is the model size)."""

    predict: Predictor
    path: Path
    source_path: Path  # the FP32 file it was built from: the canonical ONNX model (layer names) or the .h5


@dataclass(frozen=True)
class Runtime:
    """How the library runs a quantized model on this CPU: its predictor and which kernels it uses."""

    predict: Predictor
    integer_kernels: bool  # whether integer (int8/uint8) kernels run the conv/linear layers
    kernels: str  # what ran (e.g. "QLinearConv x9, QGemm x1"), or why no integer kernel did


@dataclass
class QuantizedModel:
    """A quantized model, saved, in its two forms, with what the run logs about how it was made. Its storage
    types and widths are read back from its layers (:attr:`layers`), never taken from the request."""

    path: Path
    reference: Predictor  # the exact semantics: quantize/dequantize, or reference integer kernels (every CPU)
    runtime: Runtime  # what the library executes on this CPU (may be ``reference`` itself)
    layers: list[LayerPrecision]  # every quantized layer, read back from the saved model
    ranges: list[TensorRange]
    calib_seconds: float
    quantize_seconds: float
    metrics: dict[str, float] = field(default_factory=dict)  # backend-specific, e.g. compile_seconds
    tags: dict[str, str] = field(default_factory=dict)  # backend-specific, e.g. execution_reason

    @property
    def activation_dtype(self) -> str:
        """The activations' storage type (of the narrowest layers: raised layers apart)."""
        return base_precision(self.layers, "activation")[0]

    @property
    def activation_bits(self) -> int:
        return base_precision(self.layers, "activation")[1]

    @property
    def weight_dtype(self) -> str:
        return base_precision(self.layers, "weight")[0]

    @property
    def weight_bits(self) -> int:
        """The fewest bits holding every stored weight integer (raised layers apart)."""
        return base_precision(self.layers, "weight")[1]


class Backend(ABC):
    """A quantization library, instantiated from its config (``_target_``) with the run's thread count."""

    NAME: ClassVar[str]
    MCU: ClassVar[bool] = False
    """Whether its saved models are .tflite files that TensorFlow Lite Micro runs (the `mcu` evaluation)."""
    SOURCE: ClassVar[str] = ONNX_SOURCE
    """The FP32 file ``load_fp32`` and ``quantize`` take: the canonical ONNX model (``"onnx"``; the `algo`
    steps transform it, so the backend inherits them) or the Keras .h5 it is converted from (``"keras"``, for
    a converter that reads Keras itself: no `algo` step reaches it)."""

    cache_dir: Path | None = None
    """Where the backend may keep what runs share (:func:`resnet8ptq.resolve.make_backend` sets the run's
    ``cache_dir``; the ONNX backend keeps its calibration ranges there); None: nothing is kept."""

    def __init__(self, native: bool = True, threads: int | None = None) -> None:
        """``native``: also build the runtime's integer-kernel form where it has one (False: reference only).
        ``threads``: compute threads for inference (None: the cores this process may use)."""
        self.native = native
        self.threads = threads or usable_cores()

    def check(self, spec: QuantSpec) -> None:  # noqa: B027 (optional hook: most backends run every spec)
        """Raise :class:`Unsupported` if this backend cannot run ``spec`` exactly (default: it can)."""

    def check_algorithms(self, steps: Sequence[str]) -> None:
        """Raise :class:`Unsupported` for `algo` steps when the backend does not start from the ONNX model
        they transform."""
        if steps and self.SOURCE != ONNX_SOURCE:
            raise Unsupported(
                f"backend={self.NAME} converts the Keras .h5 itself, so the PTQ algorithms "
                f"({', '.join(steps)}), which transform the canonical FP32 ONNX model, cannot reach it: "
                f"it runs only algo=none."
            )

    def published_models(self, cache_dir: Path) -> dict[str, QuantizedModel]:
        """Quantized models of this network that others publish in this backend's format, by name (e.g.
        MLPerf Tiny's own int8 .tflite): each is evaluated and logged once per sweep as a run of its own (tag
        ``reference=<name>``) beside the backend's. None by default."""
        return {}

    @abstractmethod
    def load_fp32(self, source_path: Path, workdir: Path) -> Model:
        """The FP32 model in this backend, built from the FP32 file :attr:`SOURCE` names (saved under
        ``workdir``)."""

    @abstractmethod
    def quantize(
        self, source_path: Path, calibration_images: np.ndarray, spec: QuantSpec, workdir: Path
    ) -> QuantizedModel:
        """Calibrate on ``calibration_images`` (NHWC float32) and quantize the FP32 file :attr:`SOURCE`
        names; save the model under ``workdir``."""

    def integer_model(self, path: Path) -> IntegerModel:
        """The quantized model saved at ``path`` as integer layers (:mod:`resnet8ptq.device`): what `device`
        runs. Backends without a reader refuse it."""
        raise Unsupported(f"backend={self.NAME} has no integer form: it cannot run with device=integer|cim.")

    def layer_errors(self, fp32: Model, quantized: QuantizedModel, images: np.ndarray) -> list[LayerError]:
        """Per-layer SQNR (dB) of the quantized weights and activations against ``fp32``, on ``images``: one
        routine for every backend (:func:`resnet8ptq.layer_errors.measure`) over :meth:`tensor_pairs`."""
        from resnet8ptq.layer_errors import measure

        return measure(self.tensor_pairs(fp32, quantized), images)

    @abstractmethod
    def tensor_pairs(self, fp32: Model, quantized: QuantizedModel) -> TensorPairs:
        """The tensors the per-layer SQNR compares: each quantized activation (dequantized, batch by batch)
        and each conv/dense weight, with the FP32 model's tensor at the same point."""

    @abstractmethod
    def mlflow_flavor(self, path: Path) -> MlflowFlavor:
        """How the model saved at ``path`` (FP32 or quantized) is logged as an MLflow Model, so that
        ``mlflow.pyfunc.load_model(uri).predict(images)`` gives its probabilities."""

    @classmethod
    @abstractmethod
    def versions(cls) -> dict[str, str]:
        """Versions of the libraries this backend runs on (tags; part of the config hash)."""

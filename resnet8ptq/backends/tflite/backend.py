"""TensorFlow Lite backend: the Keras .h5 converted by ``tf.lite.TFLiteConverter`` (full-integer post-training
quantization, calibrated on the calibration sample), run by the LiteRT interpreter (``ai_edge_litert``).

TensorFlow runs only in the conversion's child process (:mod:`.convert`). The reference form is the model
on LiteRT's reference kernels (TFLite's integer arithmetic, the same on every CPU); the runtime form is the
model on LiteRT's default kernels (the XNNPACK delegate where it takes the ops, optimized built-ins for the
rest), checked against the reference on the test set (:mod:`resnet8ptq.execution`). Effective types, widths
and weight granularity are read back from the saved file (:mod:`.flatbuffer`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from resnet8ptq import mlperf
from resnet8ptq.backends.base import KERAS_SOURCE, Backend, MlflowFlavor, Model, QuantizedModel, Runtime
from resnet8ptq.backends.tflite.convert import convert
from resnet8ptq.backends.tflite.flatbuffer import (
    TFLiteModel,
    check_fully_quantized,
    layer_precision,
    quantized_ranges,
    read,
    weight_granularity,
)
from resnet8ptq.backends.tflite.layer_errors import TflitePairs
from resnet8ptq.backends.tflite.litert_runner import TFLiteRunner
from resnet8ptq.backends.tflite.private_api import execution_nodes
from resnet8ptq.device.graph import IntegerModel
from resnet8ptq.errors import Unsupported
from resnet8ptq.fetch import sha256_of
from resnet8ptq.model import converter_versions
from resnet8ptq.spec import QuantSpec

NO_NATIVE = (
    "native execution disabled (backend.native=false): only LiteRT's reference integer kernels ran, not its "
    "default ones"
)
CAN_RUN = (
    "backend=tflite runs dtype=int8 (int8 activations and weights: the TFLite Micro format) and dtype=a16w8 "
    "(TFLite's 16x8 mode: int16 activations, int8 weights), with 8-bit weights, calib=minmax"
)


def check_spec(spec: QuantSpec) -> None:
    """Raise :class:`Unsupported` for what TFLiteConverter cannot make, naming what it can."""
    dtype = spec.dtype
    eight_bit = dtype.pair == ("int8", "int8") and dtype.activation_bits == 8
    sixteen_by_eight = dtype.weight == "int8" and dtype.activation_bits == 16
    if dtype.weight_bits != 8 or not (eight_bit or sixteen_by_eight):
        raise Unsupported(
            f"{CAN_RUN}; not {dtype.label}: its converter has no other integer types or widths."
        )
    if spec.reduce_range:
        raise Unsupported(
            f"{CAN_RUN}; it has no reduce_range (7-bit weights): its weights are int8 in [-127, 127]. "
            f"Use reduce_range=false."
        )
    if spec.calib.method != "minmax":
        raise Unsupported(
            f"{CAN_RUN}: its converter records each tensor's min and max over the representative dataset and "
            f"has no {spec.calib.method} calibration. Use calib=minmax."
        )
    if spec.calib.weights != "minmax":
        raise Unsupported(
            f"{CAN_RUN}: its converter quantizes each weight over its own min and max (symmetric int8) and "
            f"cannot clip it (calib.weights={spec.calib.weights}). Use calib.weights=minmax."
        )
    if spec.raised_layers:
        raise Unsupported(
            f"{CAN_RUN}; no mixed precision (raised_layers): its converter quantizes every layer to one "
            f"mode. Use raised_layers=[]."
        )
    if spec.layer_bits:
        raise Unsupported(
            f"{CAN_RUN}; no layer of its own width (layer_bits): its converter quantizes every layer to one "
            f"mode. Use layer_bits={{}}."
        )
    if dtype.first_last_bits is not None:
        raise Unsupported(
            f"{CAN_RUN}; no layer of its own width (dtype.first_last_bits): its converter quantizes every "
            f"layer to one mode. Use dtype.first_last_bits=null."
        )
    if spec.calib.symmetric:
        raise Unsupported(
            f"{CAN_RUN}: its int8 activations are asymmetric (a zero point per tensor), so "
            f"calib.symmetric=true cannot be expressed. Use calib.symmetric=false."
        )


def kernel_summary(runner: TFLiteRunner, model: TFLiteModel) -> str:
    """Which ops of ``model`` LiteRT's XNNPACK delegate runs in ``runner`` (allocated), and which its built-in
    kernels run: each ``DELEGATE`` node replaces the ops between its inputs and its outputs."""
    producer = {tensor: i for i, (_, _, outputs) in enumerate(model.ops) for tensor in outputs}
    delegated: set[int] = set()
    partitions = 0
    for op, inputs, outputs in execution_nodes(runner.interpreter):
        if op != "DELEGATE":
            continue
        partitions += 1
        pending = list(outputs)
        while pending:
            tensor = pending.pop()
            if tensor in inputs or tensor not in producer or producer[tensor] in delegated:
                continue
            delegated.add(producer[tensor])
            pending += model.ops[producer[tensor]][1]
    taken = Counter(model.ops[i][0] for i in sorted(delegated))
    rest = Counter(op for i, (op, _, _) in enumerate(model.ops) if i not in delegated)

    def listing(counts: Counter) -> str:
        return ", ".join(f"{op} x{n}" for op, n in counts.items())

    if not taken:
        return f"the XNNPACK delegate took no op: LiteRT's built-in kernels run all {len(model.ops)} ops"
    built_in = f"; built-in kernels: {listing(rest)}" if rest else ""
    return (
        f"LiteRT's XNNPACK delegate runs {len(delegated)}/{len(model.ops)} ops in {partitions} partition(s) "
        f"({listing(taken)}){built_in}"
    )


class TFLiteBackend(Backend):
    """TFLiteConverter full-integer quantization of the .h5; LiteRT reference and default kernels.

    ``mlperf_reference``: also provide MLPerf Tiny's own int8 .tflite (:meth:`published_models`).
    """

    NAME = "tflite"
    MCU = True
    SOURCE = KERAS_SOURCE

    def __init__(
        self, native: bool = True, threads: int | None = None, mlperf_reference: bool = True
    ) -> None:
        super().__init__(native, threads)
        self.mlperf_reference = mlperf_reference

    def check(self, spec: QuantSpec) -> None:
        check_spec(spec)

    def load_fp32(self, source_path: Path, workdir: Path) -> Model:
        """The float .tflite converted from the .h5, cached under ``workdir`` by the .h5's content and the
        TensorFlow version."""
        key = json.dumps({"h5": sha256_of(source_path), "tensorflow": converter_versions()["tensorflow"]})
        path = Path(workdir) / f"resnet8-{hashlib.sha256(key.encode()).hexdigest()[:16]}-fp32.tflite"
        if not path.is_file():
            convert(source_path, path, "float")
        return Model(predict=TFLiteRunner(path, self.threads), path=path, source_path=source_path)

    def quantize(
        self, source_path: Path, calibration_images: np.ndarray, spec: QuantSpec, workdir: Path
    ) -> QuantizedModel:
        """Full-integer conversion of the .h5 (int8, or 16x8 for 16-bit activations), per channel or per
        tensor as ``spec`` says (checked in the saved file); saves ``model_quantized.tflite``."""
        path = Path(workdir) / "model_quantized.tflite"
        start = time.perf_counter()
        timing = convert(
            source_path,
            path,
            "int16x8" if spec.dtype.activation_bits == 16 else "int8",
            calibration_images,
            spec.per_channel,
            spec.calib.batch_size,
        )
        quantized = self._quantized(path, timing.calib_seconds, timing.convert_seconds - timing.calib_seconds)
        quantized.metrics["conversion_process_seconds"] = time.perf_counter() - start
        quantized.tags["quantizer"] = "tf.lite.TFLiteConverter"
        asked = "per-channel" if spec.per_channel else "per-tensor"
        if quantized.tags["weight_granularity"] != asked:
            raise RuntimeError(
                f"TFLiteConverter made {quantized.tags['weight_granularity']} weights, asked for {asked}."
            )
        return quantized

    def published_models(self, cache_dir: Path) -> dict[str, QuantizedModel]:
        """MLPerf Tiny's own int8 .tflite (``pretrainedResnet_quant.tflite``), when ``mlperf_reference``."""
        if not self.mlperf_reference:
            return {}
        quantized = self._quantized(mlperf.quantized_model(cache_dir), 0.0, 0.0)
        quantized.tags |= {"model.source": mlperf.QUANT_MODEL_URL, "model.sha256": mlperf.QUANT_MODEL_SHA256}
        return {"mlperf": quantized}

    def _quantized(self, path: Path, calib_seconds: float, quantize_seconds: float) -> QuantizedModel:
        """A saved quantized .tflite in its two forms, with what is read back from the file."""
        model = read(path)
        check_fully_quantized(model)
        layers = layer_precision(model)
        reference = TFLiteRunner(path, self.threads, reference=True)
        if self.native:
            default = TFLiteRunner(path, self.threads)
            default.interpreter.allocate_tensors()
            runtime = Runtime(default, True, kernel_summary(default, model))
        else:
            runtime = Runtime(reference, False, NO_NATIVE)
        return QuantizedModel(
            path=path,
            reference=reference,
            runtime=runtime,
            ranges=quantized_ranges(model),
            layers=layers,
            calib_seconds=calib_seconds,
            quantize_seconds=quantize_seconds,
            metrics={"weights_bytes": float(sum(weight.values.nbytes for weight in model.weights))},
            tags={"weight_granularity": weight_granularity(model)},
        )

    def integer_model(self, path: Path) -> IntegerModel:
        from resnet8ptq.backends.tflite.integer import integer_model

        return integer_model(path)

    def tensor_pairs(self, fp32: Model, quantized: QuantizedModel) -> TflitePairs:
        """The quantized model against the float .tflite, both on reference kernels
        (:class:`.layer_errors.TflitePairs`)."""
        return TflitePairs(fp32.path, quantized.path, self.threads)

    def mlflow_flavor(self, path: Path) -> MlflowFlavor:
        """A pyfunc logged as code (``pyfunc_model.py`` with ``litert_runner.py``) around the .tflite; it
        needs ai-edge-litert and numpy. It runs LiteRT's default kernels (the runtime form)."""
        import mlflow.pyfunc

        here = Path(__file__).parent
        return MlflowFlavor(
            mlflow.pyfunc,
            {
                "python_model": str(here / "pyfunc_model.py"),
                "artifacts": {"model": str(path)},
                "code_paths": [str(here / "litert_runner.py")],
            },
            [f"ai-edge-litert=={self.versions()['ai-edge-litert']}", f"numpy=={np.__version__}"],
        )

    @classmethod
    def versions(cls) -> dict[str, str]:
        """ai-edge-litert (the interpreter) and tensorflow (the converter) versions."""
        return {
            "ai-edge-litert": importlib.metadata.version("ai-edge-litert"),
            "tensorflow": converter_versions()["tensorflow"],
        }

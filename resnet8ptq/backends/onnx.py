"""ONNX Runtime backend: ORT calibrators + ``quantize_static`` (QDQ), run by the CPU execution provider."""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    create_calibrator,
    quantize_static,
)
from onnxruntime.quantization.calibrate import save_tensors_data
from onnxruntime.quantization.qdq_loss_debug import (
    collect_activations,
    compute_activation_error,
    compute_weight_error,
    create_activation_matching,
    create_weight_matching,
    modify_model_output_intermediate_tensors,
)
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
from tqdm import tqdm

from resnet8ptq.backends.base import Backend, LayerError, Model, QuantizedModel, QuantSpec, TensorRange
from resnet8ptq.calibration import batches
from resnet8ptq.model import save_onnx

ORT_TYPES = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
ONNX_DTYPE_NAMES = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8"}
EVAL_CHUNK = 100
# The op types quantize_static calibrates and quantizes by default: calibrating the same set here makes
# the calibration cache we hand it complete.
OP_TYPES = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


class ImageReader(CalibrationDataReader):
    """Feeds calibration images to ORT in fixed, ordered batches (one pass)."""

    def __init__(
        self, images: np.ndarray, batch_size: int, input_name: str, desc: str = "Calibrating (onnx)"
    ) -> None:
        self._batches = batches(images, batch_size)
        self._input_name = input_name
        self._bar = tqdm(total=-(-len(images) // batch_size), desc=desc, unit="batch", leave=False)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        if batch is None:
            self._bar.close()
            return None
        self._bar.update()
        return {self._input_name: batch}


def layer_name(tensor: str) -> str:
    """A readable layer name from a tf2onnx tensor name (model_1/conv2d_5_1/BiasAdd:0 -> conv2d_5_1/BiasAdd,
    ConvMulFusion_W_model_1/conv2d_1/convolution/ReadVariableOp:0 -> conv2d_1)."""
    name = tensor.removeprefix("ConvMulFusion_W_").removeprefix("model_1/").removesuffix(":0")
    return name.removesuffix("/ReadVariableOp").removesuffix("/convolution")


def _input_name(path: Path) -> str:
    return onnx.load(path, load_external_data=False).graph.input[0].name


def _input_tensors(path: Path) -> set[str]:
    """The model input and the tensors that only re-lay it out (the NHWC -> NCHW Transpose)."""
    graph = onnx.load(path, load_external_data=False).graph
    tensors = {graph.input[0].name}
    for node in graph.node:
        if node.op_type == "Transpose" and node.input[0] in tensors:
            tensors.update(node.output)
    return tensors


def session(path: Path, threads: int | None = None) -> ort.InferenceSession:
    """A CPU inference session for the model at ``path`` (``threads`` intra-op threads; None: all cores)."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def predictor(sess: ort.InferenceSession):
    """Wrap a session as a Predictor (images -> probabilities)."""
    input_name = sess.get_inputs()[0].name

    def predict(images: np.ndarray) -> np.ndarray:
        return sess.run(None, {input_name: np.ascontiguousarray(images, dtype=np.float32)})[0]

    return predict


def effective_types(model: onnx.ModelProto) -> tuple[str, str]:
    """(activation dtype, weight dtype) as stored in a QDQ model.

    Activations: the zero-point type of QuantizeLinear nodes. Weights: the type of the quantized
    initializers that DequantizeLinear nodes read.
    """
    inits = {init.name: init for init in model.graph.initializer}
    activation, weight = set(), set()
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in inits:
            activation.add(inits[node.input[2]].data_type)
        elif node.op_type == "DequantizeLinear" and node.input[0] in inits:
            data_type = inits[node.input[0]].data_type
            if data_type in ONNX_DTYPE_NAMES:  # int32 biases are not weights
                weight.add(data_type)
    if len(activation) != 1 or len(weight) != 1:
        raise RuntimeError(
            f"Expected one activation and one weight type in the quantized model, found "
            f"activations {sorted(activation)}, weights {sorted(weight)}: the model is not fully quantized."
        )
    return ONNX_DTYPE_NAMES[activation.pop()], ONNX_DTYPE_NAMES[weight.pop()]


class OnnxRuntimeBackend(Backend):
    """Quantizes the canonical ONNX model with ``onnxruntime.quantization.quantize_static``."""

    NAME = "onnx"

    def load_fp32(self, onnx_path: Path, workdir: Path) -> Model:
        return Model(predict=predictor(session(onnx_path, self.threads)), path=onnx_path)

    def quantize(
        self,
        fp32: Model,
        onnx_path: Path,
        calibration_images: np.ndarray,
        spec: QuantSpec,
        workdir: Path,
        **_: object,
    ) -> QuantizedModel:
        workdir.mkdir(parents=True, exist_ok=True)
        ranges_path = workdir / "calibration_ranges.json"
        # ORT writes <model>-inferred.onnx beside its input and deletes it: parallel jobs sharing the cached
        # model would delete each other's file, so each run quantizes its own copy.
        onnx_path = Path(shutil.copy(onnx_path, workdir / "model_fp32.onnx"))
        input_name = _input_name(onnx_path)

        start = time.perf_counter()
        calibrator = create_calibrator(
            onnx_path,
            OP_TYPES,
            augmented_model_path=str(workdir / "augmented_model.onnx"),
            calibrate_method=spec.calib.ort_method(),
            extra_options=spec.calib.ort_options(),
        )
        with contextlib.redirect_stdout(io.StringIO()):  # ORT's histogram calibrators print progress lines
            calibrator.collect_data(ImageReader(calibration_images, spec.calib.batch_size, input_name))
            tensors_range = calibrator.compute_data()
        save_tensors_data(tensors_range, ranges_path)
        del calibrator
        (workdir / "augmented_model.onnx").unlink(missing_ok=True)
        calib_seconds = time.perf_counter() - start

        start = time.perf_counter()
        out = workdir / "model_quantized.onnx"
        quantize_static(
            onnx_path,
            out,
            calibration_data_reader=None,
            calibration_cache_path=ranges_path,
            calibrate_method=spec.calib.ort_method(),
            quant_format=QuantFormat.QDQ,
            activation_type=ORT_TYPES[spec.activation],
            weight_type=ORT_TYPES[spec.weight],
            per_channel=spec.per_channel,
            op_types_to_quantize=OP_TYPES,
        )
        quantized = onnx.load(out)
        save_onnx(quantized, out)
        quantize_seconds = time.perf_counter() - start

        activation_dtype, weight_dtype = effective_types(quantized)
        ranges = [
            TensorRange(name, float(np.min(data.range_value[0])), float(np.max(data.range_value[1])))
            for name, data in sorted(tensors_range.data.items())
        ]
        return QuantizedModel(
            predict=predictor(session(out, self.threads)),
            path=out,
            activation_dtype=activation_dtype,
            weight_dtype=weight_dtype,
            execution="native",
            ranges=ranges,
            calib_seconds=calib_seconds,
            quantize_seconds=quantize_seconds,
            tags={"execution_reason": "ONNX Runtime CPU EP fuses the QDQ pairs into integer kernels"},
        )

    def layer_errors(
        self, fp32: Model, quantized: QuantizedModel, onnx_path: Path, images: np.ndarray, workdir: Path
    ) -> list[LayerError]:
        """SQNR with ORT's ``qdq_loss_debug``: each quantized activation (the QDQ model's dequantized tensor)
        against the FP32 model's tensor at the same point, and each dequantized weight against its float."""
        workdir.mkdir(parents=True, exist_ok=True)
        lossless = _input_tensors(onnx_path)  # integer pixels: quantizing them loses nothing (~414 dB)
        activations = {}
        for name, path in (("float", onnx_path), ("qdq", quantized.path)):
            augmented = workdir / f"{name}_augmented.onnx"
            modify_model_output_intermediate_tensors(str(path), str(augmented))
            reader = ImageReader(images, EVAL_CHUNK, _input_name(onnx_path), desc=f"Layer errors ({name})")
            activations[name] = collect_activations(str(augmented), reader)
            augmented.unlink()
        workdir.rmdir()
        matched = create_activation_matching(activations["qdq"], activations["float"])
        errors = [
            LayerError(layer_name(tensor), "activation", result["xmodel_err"])
            for tensor, result in compute_activation_error(matched).items()
            if "xmodel_err" in result and tensor not in lossless
        ]
        weights = create_weight_matching(str(onnx_path), str(quantized.path))
        errors += [
            LayerError(layer_name(name), "weight", sqnr)
            for name, sqnr in compute_weight_error(weights).items()
            if weights[name]["float"].ndim >= 2  # conv / gemm weights, not biases
        ]
        return errors

    def versions(self) -> dict[str, str]:
        return {name: importlib.metadata.version(name) for name in ("onnxruntime", "onnx", "tf2onnx")}

"""Per-layer SQNR of a QDQ model against the FP32 model, with ORT's ``qdq_loss_debug`` for activations and
:func:`dequantized_weights` for weights (ORT's weight matching wraps around for uint8 weights)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization.qdq_loss_debug import (
    collect_activations,
    compute_activation_error,
    compute_signal_to_quantization_noice_ratio,
    create_activation_matching,
    modify_model_output_intermediate_tensors,
)

from resnet8ptq.backends.base import LayerError
from resnet8ptq.backends.onnx.reader import ImageReader, input_name
from resnet8ptq.model import layer_name

EVAL_CHUNK = 100


def _input_tensors(path: Path) -> set[str]:
    """The model input and the tensors that only re-lay it out (the NHWC -> NCHW Transpose)."""
    graph = onnx.load(path, load_external_data=False).graph
    tensors = {graph.input[0].name}
    for node in graph.node:
        if node.op_type == "Transpose" and node.input[0] in tensors:
            tensors.update(node.output)
    return tensors


def dequantized_weights(qdq: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The float weight each constant DequantizeLinear of a QDQ model produces, keyed by the float weight's
    name (ORT names the quantized copy `<name>_quantized`).

    ONNX's DequantizeLinear semantics, ``(x - zero_point) * scale``, with the subtraction done in int32 as
    ORT's kernel does. ORT's ``qdq_loss_debug.create_weight_matching`` subtracts in the integer type itself,
    which wraps around for uint8 weights (e.g. 3 - 130 = 129) and reports a negative SQNR for them.
    """
    inits = {init.name: init for init in qdq.graph.initializer}
    weights = {}
    for node in qdq.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        if not node.input[0].endswith("_quantized"):
            continue
        values = numpy_helper.to_array(inits[node.input[0]]).astype(np.int32)
        scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        zero_point = (
            numpy_helper.to_array(inits[node.input[2]]).astype(np.int32)
            if len(node.input) > 2 and node.input[2]
            else np.zeros_like(scale, dtype=np.int32)
        )
        if scale.size > 1:  # per channel, along `axis` (default 1)
            axis = next((attr.i for attr in node.attribute if attr.name == "axis"), 1) % values.ndim
            shape = [1] * values.ndim
            shape[axis] = scale.size
            scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
        weights[node.input[0].removesuffix("_quantized")] = (values - zero_point).astype(np.float32) * scale
    return weights


def measure(float_path: Path, qdq_path: Path, images: np.ndarray) -> list[LayerError]:
    """SQNR of each quantized activation (the QDQ model's dequantized tensor) against the float model's tensor
    at the same point, on ``images``, and of each dequantized conv/gemm weight against its float weight."""
    lossless = _input_tensors(float_path)  # integer pixels: quantizing them loses nothing (~414 dB)
    matched = create_activation_matching(
        intermediate_tensors(qdq_path, images, "qdq"), float_activations(float_path, images)
    )
    errors = [
        LayerError(layer_name(tensor), "activation", result["xmodel_err"])
        for tensor, result in compute_activation_error(matched).items()
        if "xmodel_err" in result and tensor not in lossless
    ]
    floats = {init.name: init for init in onnx.load(float_path).graph.initializer}
    errors += [
        LayerError(
            layer_name(name),
            "weight",
            compute_signal_to_quantization_noice_ratio(numpy_helper.to_array(floats[name]), dequantized),
        )
        for name, dequantized in dequantized_weights(onnx.load(qdq_path)).items()
        if dequantized.ndim >= 2  # conv / gemm weights, not biases
    ]
    return errors


def intermediate_tensors(path: Path, images: np.ndarray, name: str) -> dict[str, list[np.ndarray]]:
    """Every intermediate tensor of the model at ``path`` on ``images``, per batch (ORT's qdq_loss_debug)."""
    with tempfile.TemporaryDirectory(prefix="resnet8ptq-layer-errors-") as tmp:
        augmented = Path(tmp) / f"{name}_augmented.onnx"
        modify_model_output_intermediate_tensors(str(path), str(augmented))
        reader = ImageReader(images, EVAL_CHUNK, input_name(path), desc=f"Layer errors ({name})")
        return collect_activations(str(augmented), reader)


_float_cache: dict[tuple, dict[str, list[np.ndarray]]] = {}


def float_activations(path: Path, images: np.ndarray) -> dict[str, list[np.ndarray]]:
    """:func:`intermediate_tensors` of the FP32 model, kept for the process's next run: the runs of a sweep
    compare against the same FP32 model on the same images (keyed by the file's and the images' contents)."""
    key = (hashlib.sha1(path.read_bytes()).hexdigest(), hashlib.sha1(images.tobytes()).hexdigest())
    if key not in _float_cache:
        _float_cache.clear()  # one FP32 model's tensors at a time
        _float_cache[key] = intermediate_tensors(path, images, "float")
    return _float_cache[key]

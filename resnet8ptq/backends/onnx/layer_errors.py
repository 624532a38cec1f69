"""Per-layer SQNR of a QDQ model against the FP32 model, with ORT's ``qdq_loss_debug`` for activations and
:func:`dequantized_weights` for weights (ORT's weight matching wraps around for uint8 weights).

ORT's ``collect_activations`` keeps every intermediate tensor of every batch (about 290 MB for the two models
on 200 images), and on a VM the fresh memory pages cost more than running the models (measured: 1.2 s of
page faults against 0.4 s of compute). So both models run side by side, ``STREAM_BATCH`` images at a time,
and each batch's tensors are compared and dropped: ORT's augmentation and its QDQ matching give the pairs
(:class:`QdqPairs`), :mod:`resnet8ptq.layer_errors` sums them and applies ORT's SQNR formula."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnxruntime.quantization.qdq_loss_debug import (
    _TENSOR_SAVE_POSTFIX,  # the suffix of the outputs the augmentation adds (collect_activations strips it)
    create_activation_matching,
    modify_model_output_intermediate_tensors,
)
from tqdm import tqdm

from resnet8ptq.backends.onnx.options import cpu_options
from resnet8ptq.backends.onnx.reader import input_name
from resnet8ptq.calibration import batches
from resnet8ptq.layer_errors import Pair
from resnet8ptq.model import layer_name

QDQ_OPS = ["QuantizeLinear", "DequantizeLinear"]
"""The QDQ model's nodes whose tensors are compared: each quantized tensor before and after its Q/DQ pair."""
STREAM_BATCH = 25
"""Images per pass of the two models: their tensors (about 36 MB for 25 images) are compared, then dropped."""


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


class QdqPairs:
    """The tensor pairs of a QDQ model and its float model (:class:`resnet8ptq.layer_errors.TensorPairs`):
    each quantized activation (the QDQ model's dequantized tensor) with the float model's tensor at the same
    point, as ORT's ``create_activation_matching`` pairs them, streamed ``STREAM_BATCH`` images at a time;
    each dequantized conv/gemm weight with its float weight."""

    def __init__(self, float_path: Path, qdq_path: Path) -> None:
        self.float_path, self.qdq_path = float_path, qdq_path

    def activations(self, images: np.ndarray) -> Iterator[dict[str, Pair]]:
        lossless = _input_tensors(self.float_path)  # integer pixels: quantizing them loses nothing (~414 dB)
        with tempfile.TemporaryDirectory(prefix="resnet8ptq-layer-errors-") as tmp:
            float_model = augmented_session(self.float_path, Path(tmp) / "float.onnx", None)
            qdq_model = augmented_session(self.qdq_path, Path(tmp) / "qdq.onnx", QDQ_OPS)
        feed_name = input_name(self.float_path)
        qdq_outputs = saved_outputs(qdq_model)
        # The float model saves every intermediate tensor; only those the QDQ model quantizes are fetched.
        compared = create_activation_matching({name: [] for name in qdq_outputs})
        float_outputs = [
            name for name in saved_outputs(float_model) if name in compared and name not in lossless
        ]
        for batch in tqdm(
            list(batches(images, STREAM_BATCH)), desc="Layer errors", unit="batch", leave=False
        ):
            feed = {feed_name: np.ascontiguousarray(batch, dtype=np.float32)}
            matched = create_activation_matching(
                tensors(qdq_model, feed, qdq_outputs), tensors(float_model, feed, float_outputs)
            )
            yield {
                layer_name(tensor): (pair["float"][0], pair["post_qdq"][0])
                for tensor, pair in matched.items()
                if tensor not in lossless and "float" in pair
            }

    def weights(self) -> dict[str, Pair]:
        floats = {init.name: init for init in onnx.load(self.float_path).graph.initializer}
        return {
            layer_name(name): (numpy_helper.to_array(floats[name]), dequantized)
            for name, dequantized in dequantized_weights(onnx.load(self.qdq_path)).items()
            if dequantized.ndim >= 2  # conv / gemm weights, not biases
        }


def augmented_session(path: Path, augmented: Path, op_types: list[str] | None) -> ort.InferenceSession:
    """A session of the model with its intermediate tensors as extra outputs (ORT's
    ``modify_model_output_intermediate_tensors``: those around ``op_types`` nodes, or all), run as ORT's
    ``collect_activations`` runs it: CPU, no graph optimisation.

    ORT's augmentation writes ``<model>-inferred.onnx`` beside the model it reads and deletes it afterwards,
    so it reads a copy in ``augmented``'s folder: parallel runs sharing the cached FP32 model would otherwise
    delete each other's file (seen with two joblib jobs)."""
    source = Path(shutil.copy(path, augmented.with_name(f"{augmented.stem}-source.onnx")))
    modify_model_output_intermediate_tensors(str(source), str(augmented), op_types_for_saving=op_types)
    options = cpu_options(optimize=False)
    return ort.InferenceSession(str(augmented), options, providers=["CPUExecutionProvider"])


def saved_outputs(session: ort.InferenceSession) -> list[str]:
    """The intermediate tensors an augmented session saves, named as ``collect_activations`` names them."""
    return [
        output.name.removesuffix(_TENSOR_SAVE_POSTFIX)
        for output in session.get_outputs()
        if output.name.endswith(_TENSOR_SAVE_POSTFIX)
    ]


def tensors(
    session: ort.InferenceSession, feed: dict[str, np.ndarray], names: list[str]
) -> dict[str, list[np.ndarray]]:
    """One batch's intermediate tensors ``names`` (from :func:`saved_outputs`), keyed as
    ``collect_activations`` keys them (one-batch lists)."""
    values = session.run([name + _TENSOR_SAVE_POSTFIX for name in names], feed)
    return {name: [value] for name, value in zip(names, values, strict=True)}

"""Per-layer SQNR of a quantized .tflite model against the float .tflite converted from the same .h5.

Both run LiteRT's reference kernels with every intermediate tensor kept
(``experimental_preserve_all_tensors``). The converter names a tensor after the ops it fused
(``model_1/activation_1/Relu;model_1/batch_normalization_1/batchnorm/add_1;...``), the same in both models,
so tensors pair up by name. Layers are named after the TF op that produces the tensor, as tf2onnx names the
canonical ONNX model the other backends report on (``activation_1/Relu``,
``batch_normalization_2_1/batchnorm/add_1``, ``conv2d_5_1/BiasAdd``; weights ``conv2d_1``). TFLite's fusions
leave out tensors it no longer has (e.g. ``add_1/Add`` inside ``activation_2_1/Relu``); the model output,
which has no TF op name, is named after its op (``softmax``), the dense weight ``dense_1/MatMul``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tqdm import tqdm

from resnet8ptq.backends.tflite.flatbuffer import read, tflite_layer_name
from resnet8ptq.backends.tflite.litert_runner import TFLiteRunner, dequantize
from resnet8ptq.calibration import batches
from resnet8ptq.model import layer_name
from resnet8ptq.spec import LayerError, sqnr_db

CHUNK = 100  # images per invoke (every intermediate tensor is kept)


def measure(
    fp32_path: Path, quantized_path: Path, images: np.ndarray, threads: int | None
) -> list[LayerError]:
    """SQNR (dB) of every quantized activation (dequantized) against the float model's tensor of the same
    name, summed over ``images``, and of every dequantized conv/fully-connected weight against its float
    weight."""
    fp32, quantized = read(fp32_path), read(quantized_path)
    float_index = {tensor.name: tensor.index for tensor in fp32.tensors}
    pairs = {
        tensor.index: float_index[tensor.name]
        for tensor in quantized.activations
        if tensor.index not in quantized.inputs and tensor.name in float_index  # integer pixels: lossless
    }
    if not pairs:
        raise RuntimeError(
            f"No tensor of {quantized_path} has a counterpart in {fp32_path}: cannot pair layers."
        )
    runners = [TFLiteRunner(path, threads, True, True) for path in (fp32_path, quantized_path)]
    sums = dict.fromkeys(pairs, (0.0, 0.0))
    for batch in tqdm(list(batches(images, CHUNK)), desc="Layer errors (tflite)", unit="batch", leave=False):
        for runner in runners:
            runner.invoke(batch)
        for index, float_at in pairs.items():
            tensor = quantized.tensors[index]
            x = runners[0].interpreter.get_tensor(float_at).astype(np.float64)
            y = dequantize(runners[1].interpreter.get_tensor(index), tensor.scales[0], tensor.zero_points[0])
            signal, noise = sums[index]
            sums[index] = (signal + float(np.square(x).sum()), noise + float(np.square(x - y).sum()))
    errors = [
        LayerError(tflite_layer_name(quantized, index), "activation", sqnr_db(*sums[index]))
        for index in pairs
    ]
    floats = {tensor.name: tensor.values for tensor in fp32.tensors if tensor.values is not None}
    for weight in quantized.weights:
        x = floats[weight.name].astype(np.float64)
        noise = float(np.square(x - weight.dequantized()).sum())
        errors.append(
            LayerError(layer_name(weight.name), "weight", sqnr_db(float(np.square(x).sum()), noise))
        )
    return errors

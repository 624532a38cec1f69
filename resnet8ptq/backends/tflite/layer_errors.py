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

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from resnet8ptq.backends.tflite.flatbuffer import read, tflite_layer_name
from resnet8ptq.backends.tflite.litert_runner import TFLiteRunner, dequantize
from resnet8ptq.calibration import batches
from resnet8ptq.layer_errors import Pair
from resnet8ptq.model import layer_name

CHUNK = 100  # images per invoke (every intermediate tensor is kept)


class TflitePairs:
    """The tensor pairs of a quantized .tflite model and its float .tflite
    (:class:`resnet8ptq.layer_errors.TensorPairs`): every quantized activation (dequantized) with the float
    model's tensor of the same name, ``CHUNK`` images per invoke; every conv/fully-connected weight."""

    def __init__(self, fp32_path: Path, quantized_path: Path, threads: int | None) -> None:
        self.paths, self.threads = (fp32_path, quantized_path), threads
        self.fp32, self.quantized = read(fp32_path), read(quantized_path)
        float_index = {tensor.name: tensor.index for tensor in self.fp32.tensors}
        self.pairs = {
            tensor.index: float_index[tensor.name]
            for tensor in self.quantized.activations
            if tensor.index not in self.quantized.inputs and tensor.name in float_index  # pixels: lossless
        }
        if not self.pairs:
            raise RuntimeError(
                f"No tensor of {quantized_path} has a counterpart in {fp32_path}: cannot pair layers."
            )

    def activations(self, images: np.ndarray) -> Iterator[dict[str, Pair]]:
        runners = [TFLiteRunner(path, self.threads, True, True) for path in self.paths]
        names = {index: tflite_layer_name(self.quantized, index) for index in self.pairs}
        for batch in tqdm(
            list(batches(images, CHUNK)), desc="Layer errors (tflite)", unit="batch", leave=False
        ):
            for runner in runners:
                runner.invoke(batch)
            pairs = {}
            for index, float_at in self.pairs.items():
                tensor = self.quantized.tensors[index]
                x = runners[0].interpreter.get_tensor(float_at)
                y = dequantize(
                    runners[1].interpreter.get_tensor(index), tensor.scales[0], tensor.zero_points[0]
                )
                pairs[names[index]] = (x, y)
            yield pairs

    def weights(self) -> dict[str, Pair]:
        floats = {tensor.name: tensor.values for tensor in self.fp32.tensors if tensor.values is not None}
        return {
            layer_name(weight.name): (floats[weight.name], weight.dequantized())
            for weight in self.quantized.weights
        }

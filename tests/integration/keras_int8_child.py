"""A small Keras network with the layers ResNet8 lacks (ReLU6, max pooling with SAME padding, a depthwise
convolution), seeded, converted by TFLite's converter to a fully-int8 .tflite model (calibrated on generated
images). Run by tests/integration/test_device_mlperf.py in a child process (TensorFlow never shares a process
with the tests' PyTorch).

Usage: python keras_int8_child.py OUT.tflite
"""

from __future__ import annotations

import os
import sys

import numpy as np


def main(out: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(73)
    layers = keras.layers
    inputs = keras.Input((16, 16, 3))
    x = layers.ReLU(6.0)(layers.Conv2D(8, 3, padding="same")(layers.Rescaling(1 / 255)(inputs)))
    x = layers.MaxPooling2D(3, strides=2, padding="same")(x)  # 16 -> 8: SAME pads 0 before, 1 after
    x = layers.ReLU(6.0)(layers.DepthwiseConv2D(3, padding="same")(x))
    x = layers.ReLU()(layers.Conv2D(16, 1)(x))
    x = layers.Flatten()(layers.AveragePooling2D(8)(x))
    model = keras.Model(inputs, layers.Dense(10)(x))

    rng = np.random.default_rng(0)

    def representative():
        for _ in range(20):
            yield [rng.uniform(0, 255, (1, 16, 16, 3)).astype(np.float32)]

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    with open(out, "wb") as f:
        f.write(converter.convert())


if __name__ == "__main__":
    main(sys.argv[1])

"""A small Keras network with a BatchNormalization whose statistics make TensorFlow's float32 ``Rsqrt``
inexact, saved as OUT.h5, and its parameters with the scale TensorFlow's own kernels fold (``rsqrt(variance +
epsilon) * gamma``) as OUT.npz (float32, the convolution's kernel in ONNX's OIHW order). Run by
tests/integration/test_model.py in a child process (TensorFlow never shares a process with the tests'
PyTorch).

Usage: python batchnorm_child.py OUT
"""

from __future__ import annotations

import os
import sys

import numpy as np

CHANNELS = 256
EPSILON = 1e-3


def main(out: str) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(72)
    inputs = keras.Input((6, 6, 3))
    x = keras.layers.Conv2D(CHANNELS, 3, name="conv")(inputs)
    x = keras.layers.BatchNormalization(epsilon=EPSILON, name="bn")(x)
    model = keras.Model(inputs, keras.layers.ReLU()(x))
    conv, bn = model.get_layer("conv"), model.get_layer("bn")
    conv.set_weights([rng.normal(0, 0.3, (3, 3, 3, CHANNELS)), rng.normal(0, 0.1, CHANNELS)])
    gamma, beta = rng.uniform(0.2, 3.0, CHANNELS), rng.normal(0, 1, CHANNELS)
    mean, variance = rng.normal(0, 2, CHANNELS), rng.uniform(0.01, 40.0, CHANNELS)
    bn.set_weights([gamma, beta, mean, variance])
    model.save(f"{out}.h5")
    gamma, beta, mean, variance = (np.asarray(w, np.float32) for w in bn.get_weights())
    kernel, bias = (np.asarray(w, np.float32) for w in conv.get_weights())
    tensorflow_scale = (tf.math.rsqrt(tf.constant(variance) + EPSILON) * tf.constant(gamma)).numpy()
    np.savez(
        f"{out}.npz",
        **{"gamma": gamma, "beta": beta, "mean": mean, "variance": variance, "tf_scale": tensorflow_scale},
        **{"kernel": kernel.transpose(3, 2, 0, 1), "bias": bias},
    )


if __name__ == "__main__":
    main(sys.argv[1])

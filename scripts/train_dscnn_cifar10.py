"""Train the repository's second CIFAR-10 network, a small depthwise-separable CNN (the family of MLPerf
Tiny's VWW and KWS models), seeded, in minutes on two CPU cores; write it as a Keras .h5 and print its sha256.

    .venv/bin/python scripts/train_dscnn_cifar10.py [OUT.h5] [--epochs N]

The network takes what ResNet8 takes (NHWC float32 raw 0-255 pixels; its first BatchNormalization
normalises) and has what ResNet8 lacks: depthwise 3x3 convolutions, ReLU6, max pooling. Its file,
``resnet8ptq/networks/dscnn_cifar10.h5``, is the one model file the repository holds; ``model=dscnn`` runs
it (conf/model/dscnn.yaml pins its sha256). Training is seeded (Keras' and NumPy's seeds, TensorFlow's
deterministic ops), so the same machine gives the same file again; another CPU may differ in the last bits of
its weights (TensorFlow's CPU kernels), which is why the file is committed, not rebuilt.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "resnet8ptq" / "networks" / "dscnn_cifar10.h5"
SEED = 0


def build(keras):
    """Conv 3x3 (24) and max pooling, three depthwise-separable blocks (48, 96, 96 channels), max pooling
    after the first, ReLU6 throughout, global average pooling as an 8x8 average pool, a dense layer of 10
    classes."""
    layers = keras.layers
    inputs = keras.Input((32, 32, 3), name="input")
    x = layers.Conv2D(24, 3, padding="same", use_bias=False)(inputs)
    x = layers.MaxPooling2D(2)(layers.ReLU(6.0)(layers.BatchNormalization()(x)))
    for filters, pool in ((48, True), (96, False), (96, False)):
        x = layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
        x = layers.ReLU(6.0)(layers.BatchNormalization()(x))
        x = layers.Conv2D(filters, 1, use_bias=False)(x)
        x = layers.ReLU(6.0)(layers.BatchNormalization()(x))
        if pool:
            x = layers.MaxPooling2D(2)(x)
    x = layers.Flatten()(layers.AveragePooling2D(8)(x))
    outputs = layers.Dense(10, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="dscnn_cifar10")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=OUT)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--data", default=os.environ.get("RESNET8PTQ_ASSETS", "data"), help="CIFAR-10's root")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from resnet8ptq.data import load_cifar10, to_model_input

    keras = tf.keras
    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    data = load_cifar10(args.data)
    images, labels = to_model_input(data.train_images), np.asarray(data.train_labels)
    test_images, test_labels = to_model_input(data.test_images), np.asarray(data.test_labels)
    model = build(keras)
    steps = args.epochs * (len(images) // 128)
    schedule = keras.optimizers.schedules.CosineDecay(3e-3, steps)
    model.compile(keras.optimizers.Adam(schedule), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(SEED)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        flipped = images.copy()
        flip = rng.random(len(images)) < 0.5  # horizontal flips, drawn from the seed
        flipped[flip] = flipped[flip][:, :, ::-1]
        order = rng.permutation(len(images))
        model.fit(flipped[order], labels[order], batch_size=128, epochs=1, shuffle=False, verbose=0)
        accuracy = float(np.mean(model.predict(test_images, 1000, verbose=0).argmax(1) == test_labels))
        seconds = time.perf_counter() - start
        print(f"epoch {epoch + 1}/{args.epochs}: test accuracy {accuracy:.4f} ({seconds:.0f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.out, include_optimizer=False)  # the weights only: 165 KB, not 360
    digest = hashlib.sha256(args.out.read_bytes()).hexdigest()
    print(f"{args.out}: {model.count_params()} parameters, sha256 {digest}")


if __name__ == "__main__":
    main()

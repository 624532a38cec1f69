"""Keras BatchNormalization converted with its scale computed in float64, so that the canonical FP32 model is
the same bytes on every CPU.

In inference, Keras (3.x, TensorFlow backend) computes a BatchNormalization as TensorFlow's
``tf.nn.batch_normalization``: ``inv = rsqrt(variance + epsilon) * gamma``, then ``x * inv + (beta - mean *
inv)``. When tf2onnx converts the model, TensorFlow's graph optimiser (grappler) folds ``inv`` into a constant
with TensorFlow's CPU ``Rsqrt`` kernel, which is not correctly rounded and whose result follows the CPU: on
the AVX2-only AMD EPYC 3 of one layer's 16 reciprocal square roots are 1 ulp off, and an Intel Xeon (AVX-512,
AMX) folded 46 of ResNet8's 240 scales 1-2 ulps away from that AMD's (issue 72; CHANGELOG). ONNX Runtime then
folds the scale into the convolution's weights, so every weight, calibration range and quantized model moved
with the CPU that converted the model.

:func:`float64_batchnorm` replaces ``tf.nn.batch_normalization`` while a model is traced for conversion with
the same formula, its one inexact step done in float64 and rounded once to float32: ``inv = float32(gamma /
sqrt(float32(variance + epsilon)))``, the square root and the division IEEE-754 operations, which every
instruction set rounds alike (within 1 ulp of the exact scale). Every other step is the same float32 IEEE
operation as before, and every TensorFlow op keeps its name (``batchnorm/mul``, ``mul_1``, ``mul_2``, ``sub``,
``add_1``), so the converted graph differs from TensorFlow's own only in those scales' last bits.

Why by hand: TensorFlow has no setting for an exactly rounded ``Rsqrt``, tf2onnx none to leave the
BatchNormalization unfolded, and the public function Keras calls is the one place where the formula is
written (``keras/src/backend/tensorflow/nn.py`` calls ``tf.nn.batch_normalization`` at run time).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np


def batchnorm_scale(gamma: np.ndarray | None, variance: np.ndarray, epsilon: float) -> np.ndarray:
    """The scale :func:`float64_batchnorm` folds, in NumPy: ``float32(gamma / sqrt(float32(variance +
    epsilon)))``, square root and division in float64 (``gamma`` None: a layer without ``scale``)."""
    shifted = (np.asarray(variance, np.float32) + np.float32(epsilon)).astype(np.float64)
    numerator = np.float64(1.0) if gamma is None else np.asarray(gamma, np.float32).astype(np.float64)
    return (numerator / np.sqrt(shifted)).astype(np.float32)


@contextlib.contextmanager
def float64_batchnorm(tf: Any) -> Iterator[None]:
    """While in this context, ``tf.nn.batch_normalization`` computes its scale in float64 (the module's
    docstring); ``tf`` is the imported ``tensorflow`` module."""
    original = tf.nn.batch_normalization

    def batch_normalization(x, mean, variance, offset, scale, variance_epsilon, name=None):
        """``tf.nn.batch_normalization``'s signature and ops, the scale as :func:`batchnorm_scale`."""
        with tf.name_scope(name or "batchnorm"):
            shifted = tf.math.add(variance, variance_epsilon, name="add")  # float32, as TensorFlow's
            with tf.name_scope("float64"):
                inv = tf.math.divide(
                    tf.constant(1.0, tf.float64) if scale is None else tf.cast(scale, tf.float64),
                    tf.math.sqrt(tf.cast(shifted, tf.float64)),
                )
            inv = tf.cast(inv, variance.dtype, name="Rsqrt" if scale is None else "mul")
            product = tf.math.multiply(mean, inv, name="mul_2")
            centred = (
                tf.math.subtract(offset, product, name="sub")
                if offset is not None
                else tf.math.negative(product, name="Neg")
            )
            scaled = tf.math.multiply(x, tf.cast(inv, x.dtype), name="mul_1")
            return tf.math.add(scaled, tf.cast(centred, x.dtype), name="add_1")

    tf.nn.batch_normalization = batch_normalization
    try:
        yield
    finally:
        tf.nn.batch_normalization = original


def fold_into_dense(model):
    """Fold each BatchNormalization that follows a dense layer into it: a Gemm (constant weights and bias)
    whose output only a ``Mul`` by a constant vector reads, whose output only an ``Add`` of one reads, becomes
    one Gemm with ``W * scale`` and ``bias * scale + shift`` (float32, IEEE-rounded alike on every CPU).
    ORT's optimiser folds a BatchNorm into a convolution (``ConvMulFusion``, ``ConvAddFusion``) but has no
    such fusion for a Gemm, so without this a Keras ``Dense -> BatchNormalization`` (MLPerf Tiny's anomaly
    detection autoencoder) keeps a float Mul and Add that neither the integer device nor a crossbar
    computes."""
    from onnx import helper, numpy_helper

    graph = model.graph
    constants = {tensor.name: tensor for tensor in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def vector_operand(node, op_type: str, features: int) -> tuple[str, np.ndarray] | None:
        """The node's other (constant, per-feature) operand, where it is an ``op_type`` with one."""
        if node.op_type != op_type:
            return None
        for name in node.input:
            if name in constants:
                value = numpy_helper.to_array(constants[name])
                if value.size == features and value.ndim <= 2:
                    return name, value.reshape(-1).astype(np.float32)
        return None

    for gemm in [node for node in graph.node if node.op_type == "Gemm"]:
        attributes = {a.name: helper.get_attribute_value(a) for a in gemm.attribute}
        if attributes.get("transA", 0) or len(gemm.input) < 3 or not set(gemm.input[1:]) <= set(constants):
            continue
        if any(len(readers[name]) != 1 for name in gemm.input[1:]):  # weights another node reads too
            continue
        weight = numpy_helper.to_array(constants[gemm.input[1]]).astype(np.float32)
        bias = numpy_helper.to_array(constants[gemm.input[2]]).astype(np.float32)
        transposed = attributes.get("transB", 0)
        features = weight.shape[0 if transposed else 1]
        if bias.size != features or attributes.get("alpha", 1.0) != 1.0 or attributes.get("beta", 1.0) != 1.0:
            continue
        after = readers.get(gemm.output[0], [])
        scale = vector_operand(after[0], "Mul", features) if len(after) == 1 else None
        shifted = readers.get(after[0].output[0], []) if scale else []
        shift = vector_operand(shifted[0], "Add", features) if len(shifted) == 1 else None
        if shift is None:
            continue
        mul, add = after[0], shifted[0]
        scaled = weight * (scale[1][:, None] if transposed else scale[1][None, :])
        for name, value in ((gemm.input[1], scaled), (gemm.input[2], bias.reshape(-1) * scale[1] + shift[1])):
            constants[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
        gemm.output[0] = add.output[0]
        graph.node.remove(mul)
        graph.node.remove(add)
    read = {name for node in graph.node for name in node.input}
    for constant in [tensor for tensor in graph.initializer if tensor.name not in read]:
        graph.initializer.remove(constant)  # the BatchNorms' scales and shifts
    return model

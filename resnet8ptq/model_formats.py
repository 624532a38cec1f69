"""The file formats a network may come in (``model.path``), told apart before any work, and the Keras loader
both TensorFlow children share.

Formats: ``keras`` (an HDF5 ``.h5`` or a ``.keras`` archive), ``tflite`` (a float ``.tflite``), ``onnx``.
Every format becomes the canonical FP32 ONNX model (:mod:`resnet8ptq.model`); the TFLite backend's converter
takes Keras models only (:data:`KERAS_SUFFIXES`). A SavedModel directory is refused with what to give instead:
the locked TensorFlow cannot load every SavedModel Keras 2 wrote (MLPerf Tiny's KWS one fails on its
optimizer's slots), and its float ``.tflite`` converts.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from resnet8ptq.errors import ModelError

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
TFLITE_IDENTIFIER = b"TFL3"  # the flatbuffer's file identifier, bytes 4-8
FORMATS = ("keras", "tflite", "onnx")
KERAS_SUFFIXES = (".h5", ".keras")
"""The files the TFLite backend's converter reads (the Keras ones)."""


def model_format(path: Path) -> str:
    """The format of the model file at ``path`` (:data:`FORMATS`), from its suffix and checked against its
    first bytes; :class:`ModelError` for a directory, an unknown suffix or contents that do not match."""
    if path.is_dir():
        raise ModelError(
            f"{path} is a directory (a SavedModel?): give a Keras .h5/.keras file, a float .tflite or an "
            ".onnx file (TensorFlow's converter writes a .tflite from a SavedModel: "
            "tf.lite.TFLiteConverter.from_saved_model)."
        )
    suffix = path.suffix.lower()
    with path.open("rb") as f:
        head = f.read(8)
    if suffix == ".h5":
        if head != HDF5_SIGNATURE:
            raise ModelError(f"{path} is not an HDF5 file (bad signature {head!r}); give a Keras .h5 model.")
        return "keras"
    if suffix == ".keras":
        if not zipfile.is_zipfile(path):
            raise ModelError(f"{path} is not a .keras archive (not a zip file).")
        return "keras"
    if suffix == ".tflite":
        if head[4:8] != TFLITE_IDENTIFIER:
            raise ModelError(f"{path} is not a TFLite flatbuffer (no 'TFL3' identifier).")
        return "tflite"
    if suffix == ".onnx":
        return "onnx"
    raise ModelError(
        f"{path}: unknown model format {suffix or '(no suffix)'!r}; model.path takes a Keras .h5 or .keras "
        "file, a float .tflite or an .onnx file."
    )


def load_keras(path: str | Path) -> Any:
    """The Keras model at ``path`` (imports TensorFlow: call it in a TensorFlow child only). Keras 2 wrote a
    ``groups`` entry into every DepthwiseConv2D's config that Keras 3 refuses (MLPerf Tiny's ``vww_96.h5``);
    a depthwise layer has one group per channel by definition, so the entry is dropped as it is read."""
    import tensorflow as tf

    class DepthwiseConv2D(tf.keras.layers.DepthwiseConv2D):
        """Keras' own layer, reading a Keras 2 config."""

        @classmethod
        def from_config(cls, config: dict) -> Any:
            config = {key: value for key, value in config.items() if key != "groups"}
            return super().from_config(config)

    try:
        return tf.keras.models.load_model(
            path, compile=False, custom_objects={"DepthwiseConv2D": DepthwiseConv2D}
        )
    except Exception as err:  # Keras raises many types for unreadable files
        raise ModelError(f"Keras could not load {path}: {err}") from err

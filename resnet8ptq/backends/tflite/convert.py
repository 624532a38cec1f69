"""Keras .h5 -> .tflite with ``tf.lite.TFLiteConverter``, in a child process (TensorFlow is never imported by
the runner: :func:`resnet8ptq.model.tensorflow_child`).

Modes: ``float`` (the FP32 model), ``int8`` (full-integer: int8 activations, int8 weights, int8 input and
output: the TFLite Micro format MLPerf Tiny ships) and ``int16x8`` (int16 activations, int8 weights:
TFLite's 16x8 mode). The converter calibrates activation ranges (min-max) on a ``representative_dataset``:
here the calibration images, in batches of ``batch_size``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from resnet8ptq.errors import ModelError
from resnet8ptq.model import tensorflow_child
from resnet8ptq.model_formats import load_keras

MODES = ("float", "int8", "int16x8")


@dataclass(frozen=True)
class Conversion:
    """One conversion of ``h5`` into ``out``."""

    h5: str
    out: str
    mode: str
    per_channel: bool = True
    calibration: str | None = None  # .npy of NHWC float32 calibration images (quantized modes)
    batch_size: int = 100


@dataclass(frozen=True)
class Timing:
    """Seconds of the conversion in the child: ``convert_seconds`` of ``TFLiteConverter.convert()``, of which
    ``calib_seconds`` from the first calibration batch to the last (the converter calibrates, then
    quantizes; TensorFlow's import and the .h5's loading are in neither)."""

    calib_seconds: float
    convert_seconds: float


def convert(
    h5: Path,
    out: Path,
    mode: str,
    calibration_images: np.ndarray | None = None,
    per_channel: bool = True,
    batch_size: int = 100,
) -> Timing:
    """Convert the Keras model at ``h5`` into ``out`` (written atomically) in a child process."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: expected one of {MODES}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".tflite-") as tmp:
        calibration = None
        if calibration_images is not None:
            calibration = str(Path(tmp) / "calibration.npy")
            np.save(calibration, np.ascontiguousarray(calibration_images, np.float32))
        staged = Path(tmp) / out.name
        job = Conversion(str(h5), str(staged), mode, per_channel, calibration, batch_size)
        failure = tensorflow_child(__name__, json.dumps(asdict(job)))
        if failure is not None or not staged.is_file():
            raise ModelError(f"Converting {h5} to TFLite ({mode}) failed: {failure or 'no output'}")
        timing = Timing(**json.loads(staged.with_suffix(".json").read_text()))
        os.replace(staged, out)
    return timing


def convert_in_this_process(job: Conversion) -> None:
    """The conversion itself (imports TensorFlow): what the child process runs."""
    import tensorflow as tf

    from resnet8ptq.backends.tflite.private_api import disable_per_channel

    keras_model = load_keras(job.h5)
    converter = tf.lite.TFLiteConverter.from_keras_model(keras_model)
    calibration: list[float] = []  # when the first and the last batch were taken
    if job.mode != "float":
        images = np.load(job.calibration)

        def representative_dataset():
            calibration.append(time.perf_counter())
            for start in range(0, len(images), job.batch_size):
                yield [images[start : start + job.batch_size]]
            calibration.append(time.perf_counter())

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative_dataset
        ops, io_type = {
            "int8": (tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.int8),
            "int16x8": (tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8, tf.int16),
        }[job.mode]
        converter.target_spec.supported_ops = [ops]
        converter.inference_input_type = io_type
        converter.inference_output_type = io_type
        if not job.per_channel:
            disable_per_channel(converter)
    start = time.perf_counter()
    Path(job.out).write_bytes(converter.convert())
    seconds = time.perf_counter() - start
    calib_seconds = calibration[-1] - calibration[0] if len(calibration) >= 2 else 0.0
    timing = Timing(calib_seconds, seconds)
    Path(job.out).with_suffix(".json").write_text(json.dumps(asdict(timing)))


if __name__ == "__main__":  # the child process: python -m resnet8ptq.backends.tflite.convert '<job json>'
    convert_in_this_process(Conversion(**json.loads(sys.argv[1])))

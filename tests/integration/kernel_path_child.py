"""What a kernel path makes of the headline configurations: each one calibrated and quantized by its backend
directly (no evaluation), its calibration ranges and its model digest printed as JSON on stdout. Run by
tests/integration/test_kernel_paths.py in processes whose environment forces a kernel path (the variables
torch and oneDNN read at import, a thread count).

Usage: python kernel_path_child.py ONNX H5 CALIBRATION.npy WORKDIR THREADS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from resnet8ptq.calibration import CalibConfig
from resnet8ptq.digests import model_digest, ranges_digest
from resnet8ptq.dtype import DtypeConfig
from resnet8ptq.memory import keep_freed_memory
from resnet8ptq.spec import QuantSpec

CONFIGURATIONS = {
    "onnx int8": ("onnx", "int8", "int8", False),
    "onnx uint8": ("onnx", "uint8", "uint8", False),
    "torch int8": ("torch", "int8", "int8", False),
    "torch uint8": ("torch", "uint8", "uint8", False),
    "tflite int8 per-channel": ("tflite", "int8", "int8", True),
}
"""The headline sweep (`make sweep`: onnx, torch x int8, uint8, MinMax, per tensor) and a TFLite run."""


def backend(name: str, threads: int):
    """The backend, reference form only (its native form is not what the digests are about)."""
    if name == "onnx":
        from resnet8ptq.backends.onnx.backend import OnnxRuntimeBackend

        return OnnxRuntimeBackend(native=False, threads=threads)
    if name == "torch":
        from resnet8ptq.backends.torch.backend import TorchBackend

        return TorchBackend(native=False, threads=threads)
    from resnet8ptq.backends.tflite.backend import TFLiteBackend

    return TFLiteBackend(native=False, threads=threads, mlperf_reference=False)


def main(onnx_path: Path, h5: Path, calibration: Path, workdir: Path, threads: int) -> None:
    keep_freed_memory()  # as a job's process does
    images = np.load(calibration)
    made = {}
    for label, (name, activation, weight, per_channel) in CONFIGURATIONS.items():
        spec = QuantSpec(DtypeConfig(activation, weight), CalibConfig("minmax"), per_channel)
        source = h5 if name == "tflite" else onnx_path
        quantized = backend(name, threads).quantize(source, images, spec, workdir / label.replace(" ", "-"))
        made[label] = {
            "model": model_digest(quantized.path),
            "ranges": ranges_digest(quantized.ranges),
            "tensors": {r.tensor: [r.min.hex(), r.max.hex()] for r in quantized.ranges},
        }
    print(json.dumps(made))


if __name__ == "__main__":
    main(*(Path(arg) for arg in sys.argv[1:5]), int(sys.argv[5]))

"""The 18-configuration ORT sweep as a bare script: no Hydra, no MLflow, no plots (the overhead baseline).

Does the same numeric work per configuration as `run.py` (ORT calibration over the same 1,000-image
stratified sample, quantize_static, evaluation of all 10,000 test images, 100 single-image latencies),
and prints one line per configuration. Usage: python bench/bare_ort_sweep.py CANONICAL.onnx CIFAR_BIN_DIR
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnxruntime import InferenceSession
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    create_calibrator,
    quantize_static,
)
from onnxruntime.quantization.calibrate import save_tensors_data

METHODS = {
    "minmax": (CalibrationMethod.MinMax, {"symmetric": False}),
    "entropy": (CalibrationMethod.Entropy, {"symmetric": False, "num_bins": 2048, "num_quantized_bins": 128}),
    "percentile": (CalibrationMethod.Percentile, {"symmetric": True, "num_bins": 2048, "percentile": 99.999}),
}
DTYPES = {
    "int8": (QuantType.QInt8, QuantType.QInt8),
    "uint8": (QuantType.QUInt8, QuantType.QUInt8),
    "u8s8": (QuantType.QUInt8, QuantType.QInt8),
}


def read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8).reshape(-1, 3073)
    return raw[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float32), raw[:, 0].astype(
        np.int64
    )


class Reader(CalibrationDataReader):
    def __init__(self, images: np.ndarray) -> None:
        self.batches = iter([{"input": images[i : i + 100]} for i in range(0, len(images), 100)])

    def get_next(self):
        return next(self.batches, None)


def main(model: Path, cifar: Path) -> None:
    train = [read(cifar / f"data_batch_{i}.bin") for i in range(1, 6)]
    train_x, train_y = np.concatenate([t[0] for t in train]), np.concatenate([t[1] for t in train])
    test_x, test_y = read(cifar / "test_batch.bin")
    rng = np.random.default_rng(42)
    idx = np.sort(
        np.concatenate([rng.choice(np.flatnonzero(train_y == c), 100, replace=False) for c in range(10)])
    )
    calib = train_x[idx]
    with tempfile.TemporaryDirectory() as tmp:
        for dtype, method, per_channel in itertools.product(DTYPES, METHODS, (False, True)):
            start = time.perf_counter()
            out, ranges = Path(tmp) / "q.onnx", Path(tmp) / "ranges.json"
            calibrator = create_calibrator(
                model,
                augmented_model_path=str(Path(tmp) / "aug.onnx"),
                calibrate_method=METHODS[method][0],
                extra_options=METHODS[method][1],
            )
            calibrator.collect_data(Reader(calib))
            save_tensors_data(calibrator.compute_data(), ranges)
            quantize_static(
                model,
                out,
                None,
                calibration_cache_path=ranges,
                calibrate_method=METHODS[method][0],
                quant_format=QuantFormat.QDQ,
                activation_type=DTYPES[dtype][0],
                weight_type=DTYPES[dtype][1],
                per_channel=per_channel,
            )
            session = InferenceSession(str(out), providers=["CPUExecutionProvider"])
            probs = np.concatenate(
                [session.run(None, {"input": test_x[i : i + 500]})[0] for i in range(0, 10000, 500)]
            )
            for image in test_x[:110]:
                session.run(None, {"input": image[None]})
            accuracy = (probs.argmax(1) == test_y).mean()
            print(
                f"{dtype:6s} {method:10s} per_channel={per_channel!s:5s} accuracy={accuracy:.4f} "
                f"{time.perf_counter() - start:.1f}s",
                flush=True,
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

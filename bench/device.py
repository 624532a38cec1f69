"""The device model's speed as ratios on this machine: the integer executor (device=integer) and a crossbar
over the 10,000 test images against ONNX Runtime's reference pass (graph optimisations off) of the same QDQ
model, and a noisy crossbar over 5 noise draws. Rounds are interleaved; the medians are printed.

Usage: RESNET8PTQ_ASSETS=../shared python bench/device.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resnet8ptq.backends.onnx.backend import OnnxRuntimeBackend  # noqa: E402
from resnet8ptq.backends.onnx.integer import integer_model  # noqa: E402
from resnet8ptq.calibration import CalibConfig  # noqa: E402
from resnet8ptq.data import calibration_set, load_cifar10, to_model_input  # noqa: E402
from resnet8ptq.device.config import DeviceConfig  # noqa: E402
from resnet8ptq.device.evaluate import arithmetic  # noqa: E402
from resnet8ptq.device.executor import execute  # noqa: E402
from resnet8ptq.dtype import DtypeConfig  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402
from resnet8ptq.model import MODEL_SHA256, canonical_onnx, resolve_h5  # noqa: E402
from resnet8ptq.spec import QuantSpec  # noqa: E402

DEVICES = {
    "integer": DeviceConfig(kind="integer"),
    "cim rows=128 adc=6": DeviceConfig(kind="cim", rows=128, adc_bits=6, adc_range="worst_case"),
    "cim noise 0.02 x5 draws": DeviceConfig(kind="cim", weight_noise=0.02, noise_seeds=5),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    assets = Path(os.environ.get("RESNET8PTQ_ASSETS", REPO.parent / "shared"))
    data = load_cifar10(assets, download=False)
    images = to_model_input(data.test_images)
    calibration, _ = calibration_set(data, 100, 42)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        h5, sha256 = resolve_h5(assets / "models" / "pretrainedResnet.h5", MODEL_SHA256, cache)
        canonical = canonical_onnx(h5, sha256, cache)
        spec = QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"), per_channel=True)
        quantized = OnnxRuntimeBackend(native=False).quantize(
            canonical.onnx_path, calibration, spec, cache / "q"
        )
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(str(quantized.path), options)
        name = session.get_inputs()[0].name
        model = integer_model(quantized.path)
        seconds: dict[str, list[float]] = {"ORT reference": [], **{key: [] for key in DEVICES}}
        for _ in range(args.rounds):
            start = time.perf_counter()
            for i in range(0, len(images), 500):
                session.run(None, {name: images[i : i + 500]})
            seconds["ORT reference"].append(time.perf_counter() - start)
            for key, device in DEVICES.items():
                start = time.perf_counter()
                for seed in range(device.seeds):
                    execute(
                        model,
                        images,
                        arithmetic(device, seed, _steps(model, device)),
                        device.images_per_step,
                    )
                seconds[key].append(time.perf_counter() - start)
    base = statistics.median(seconds["ORT reference"])
    cpu = detect().tags()["hardware.cpu"]
    print(f"# {cpu}, {os.cpu_count()} cores; 10,000 images; medians of {args.rounds} rounds")
    for key, values in seconds.items():
        median = statistics.median(values)
        print(
            f"{key:28s} {median:7.1f} s  {median / base:5.2f}x ORT reference  (rounds: {np.round(values, 1)})"
        )


def _steps(model, device: DeviceConfig) -> dict:
    """worst-case ADC steps (no calibration pass: the bench times the evaluation)."""
    from resnet8ptq.device.evaluate import adc_steps

    return adc_steps(model, device, np.empty((0, 32, 32, 3), np.float32))


if __name__ == "__main__":
    main()

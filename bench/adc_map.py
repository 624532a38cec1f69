"""Accuracy on the crossbar over ADC settings, in one process: ONNX Runtime int8 per-channel MinMax quantized
once, the calibration partial sums profiled once per crossbar layout (rows), every cell of the grid evaluated
on the full test set (8-bit inputs at once, one 8-bit cell per weight, no noise: the settings docs/device.md
maps). The same numbers as `python run.py -m backend=onnx dtype=int8 per_channel=true device=cim ...`
gives cell by cell, without MLflow; worst_case and granular do not depend on the granularity or window and
run once per (rows, bits).

Usage: RESNET8PTQ_ASSETS=../shared python bench/adc_map.py --rows 128 --bits 4,5,6 \
    --ranges max,percentile,mse --granularities layer,column [--windows asymmetric] [--steps pow2] \
    [--csv out.csv]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resnet8ptq.backends.onnx.backend import OnnxRuntimeBackend  # noqa: E402
from resnet8ptq.backends.onnx.integer import integer_model  # noqa: E402
from resnet8ptq.calibration import CalibConfig  # noqa: E402
from resnet8ptq.data import calibration_set, load_cifar10, to_model_input  # noqa: E402
from resnet8ptq.device.config import DeviceConfig  # noqa: E402
from resnet8ptq.device.evaluate import adc_steps, arithmetic  # noqa: E402
from resnet8ptq.device.executor import execute, predictions  # noqa: E402
from resnet8ptq.dtype import DtypeConfig  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402
from resnet8ptq.model import MODEL_SHA256, canonical_onnx, resolve_h5  # noqa: E402
from resnet8ptq.spec import QuantSpec  # noqa: E402


def grid(args: argparse.Namespace) -> list[DeviceConfig]:
    """Every combination asked for, once: worst_case and granular once per (rows, bits, step)."""
    devices, seen = [], set()
    for rows, bits, rule, granularity, window, step in itertools.product(
        args.rows, args.bits, args.ranges, args.granularities, args.windows, args.steps
    ):
        if rule in ("worst_case", "granular"):
            granularity, window = "layer", "symmetric"
        device = DeviceConfig(kind="cim", rows=rows, adc_bits=bits, adc_range=rule,
                              adc_granularity=granularity, adc_window=window, adc_step=step)  # fmt: skip
        if device.label not in seen:
            seen.add(device.label)
            devices.append(device)
    return devices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    listed = lambda kind: lambda text: [kind(item) for item in text.split(",")]  # noqa: E731
    parser.add_argument("--rows", type=listed(int), default=[128])
    parser.add_argument("--bits", type=listed(int), default=[4, 5, 6])
    parser.add_argument("--ranges", type=listed(str), default=["max", "percentile", "mse"])
    parser.add_argument("--granularities", type=listed(str), default=["layer", "column"])
    parser.add_argument("--windows", type=listed(str), default=["asymmetric"])
    parser.add_argument("--steps", type=listed(str), default=["pow2"])
    parser.add_argument("--csv", type=Path, default=None)
    args = parser.parse_args()
    devices = grid(args)
    assets = Path(os.environ.get("RESNET8PTQ_ASSETS", REPO.parent / "shared"))
    data = load_cifar10(assets, download=False)
    images, labels = to_model_input(data.test_images), data.test_labels
    calibration, _ = calibration_set(data, 100, 42)  # the run's default sample: 100 training images a class
    print(f"CPU: {detect().cpu}; {len(devices)} devices")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        h5, sha256 = resolve_h5(assets / "models" / "pretrainedResnet.h5", MODEL_SHA256, cache)
        canonical = canonical_onnx(h5, sha256, cache)
        spec = QuantSpec(DtypeConfig("int8", "int8"), CalibConfig("minmax"), per_channel=True)
        quantized = OnnxRuntimeBackend(native=False).quantize(
            canonical.onnx_path, calibration, spec, cache / "q"
        )
        model = integer_model(quantized.path)
        reference = predictions(model, execute(model, images)[0])
        print(f"reference (integer device): {100 * np.mean(reference == labels):.2f} %")
        profiles: dict = {}
        for device in devices:
            start = time.perf_counter()
            steps = adc_steps(model, device, calibration, profiles)
            calibrated = time.perf_counter()
            logits, _ = execute(model, images, arithmetic(device, 0, steps), device.images_per_step)
            accuracy = float(np.mean(predictions(model, logits) == labels))
            done = time.perf_counter()
            rows.append((device, accuracy))
            print(f"{device.label:40s} {100 * accuracy:6.2f} %  (ranges {calibrated - start:4.1f} s, "
                  f"test set {done - calibrated:4.1f} s)", flush=True)  # fmt: skip
    if args.csv:
        import pandas as pd

        pd.DataFrame(
            [
                {
                    "rows": d.rows,
                    "adc_bits": d.adc_bits,
                    "adc_range": d.range_rule,
                    "granularity": d.adc_granularity,
                    "window": d.adc_window,
                    "step": d.adc_step,
                    "accuracy": a,
                }
                for d, a in rows
            ]
        ).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()

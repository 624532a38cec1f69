"""Accuracy on the crossbar over ADC settings, in one process: ONNX Runtime int8 per-channel MinMax quantized
once, the calibration partial sums profiled once per crossbar layout (rows), every cell of the grid evaluated
on the full test set (8-bit inputs at once, one 8-bit cell per weight, no noise: the settings
docs/device_measured.md maps). The same numbers as
`python run.py -m backend=onnx dtype=int8 per_channel=true device=cim ...` gives cell by cell, without
MLflow; worst_case and granular do not depend on the granularity or window and run once per (rows, bits).

Usage: RESNET8PTQ_ASSETS=../shared python bench/adc_map.py --rows 128 --bits 4,5,6 \
    --ranges max,percentile,mse --granularities layer,column [--windows asymmetric] [--steps pow2] \
    [--csv out.csv]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _int8 import canonical_model, inputs, quantized_int8  # noqa: E402  (bench/_int8.py)

from resnet8ptq.backends.onnx.integer import integer_model  # noqa: E402
from resnet8ptq.device.config import DeviceConfig  # noqa: E402
from resnet8ptq.device.evaluate import adc_steps, arithmetic  # noqa: E402
from resnet8ptq.device.executor import execute, predictions  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402


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
    given = inputs()
    images, labels, calibration = given.images, given.labels, given.calibration
    print(f"CPU: {detect().cpu}; {len(devices)} devices")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        model = integer_model(quantized_int8(canonical_model(cache), calibration, cache))
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

"""The device model's speed as ratios on this machine, per test image: the integer executor (device=integer),
crossbars (128 rows with a calibrated 4-bit ADC; bit-serial 1-bit inputs with an 8-bit weight in two
4-bit cells, on the first 1,000 images; a noisy crossbar over 5 noise draws; the 4-bit crossbar aged a day
with PCM drift, its compensation and read noise, one chip, on the first 2,000) against the integer executor
(issue 63's targets, printed beside them: the 4-bit crossbar at most 1.5x, the bit-serial one at most 8x
the integer executor, the aged crossbar at most 2x the fresh 4-bit one) and against ONNX
Runtime's reference pass (graph optimisations off) of the same QDQ model. The ADC ranges are calibrated
before the timing. Rounds are interleaved; the medians are printed.

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

import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _devices import DEVICES  # noqa: E402  (bench/_devices.py)
from _int8 import canonical_model, inputs, quantized_int8  # noqa: E402  (bench/_int8.py)

from resnet8ptq.backends.onnx.integer import integer_model  # noqa: E402
from resnet8ptq.device.evaluate import adc_steps, arithmetic  # noqa: E402
from resnet8ptq.device.executor import execute  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402
from resnet8ptq.memory import keep_freed_memory  # noqa: E402

TARGETS = {  # issue 63's: a device's time per image at most this many times another's
    "cim rows=128 adc=4": ("integer", 1.5),
    "cim rows=128 adc=8 dac=1 4x2": ("integer", 8.0),
    "cim rows=128 adc=4 aged x1": ("cim rows=128 adc=4", 2.0),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    keep_freed_memory()  # as every run's process does (resnet8ptq/app.py): the same allocator as a run
    given = inputs()
    images, calibration = given.images, given.calibration
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        quantized = quantized_int8(canonical_model(cache), calibration, cache)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(str(quantized), options)
        name = session.get_inputs()[0].name
        model = integer_model(quantized)
        steps = {key: adc_steps(model, device, calibration) for key, (device, _) in DEVICES.items()}
        seconds: dict[str, list[float]] = {"ORT reference": [], **{key: [] for key in DEVICES}}
        for _ in range(args.rounds):
            start = time.perf_counter()
            for i in range(0, len(images), 500):
                session.run(None, {name: images[i : i + 500]})
            seconds["ORT reference"].append((time.perf_counter() - start) / len(images))
            for key, (device, count) in DEVICES.items():
                start = time.perf_counter()
                for seed in range(device.seeds):
                    execute(
                        model,
                        images[:count],
                        arithmetic(device, seed, steps[key]),
                        device.images_per_step,
                        device="cpu",
                    )
                seconds[key].append((time.perf_counter() - start) / count)
    base, integer = statistics.median(seconds["ORT reference"]), statistics.median(seconds["integer"])
    cpu = detect().tags()["hardware.cpu"]
    print(f"# {cpu}, {os.cpu_count()} cores; ms per test image, medians of {args.rounds} rounds")
    for key, values in seconds.items():
        median = statistics.median(values)
        target = ""
        if key in TARGETS:
            other, limit = TARGETS[key]
            ratio = median / statistics.median(seconds[other])
            verdict = "met" if ratio <= limit else "missed"
            target = f"  {ratio:5.2f}x {other} (target <= {limit:g}x: {verdict})"
        print(
            f"{key:30s} {1e3 * median:7.2f} ms  {median / integer:5.2f}x integer executor  "
            f"{median / base:5.2f}x ORT reference{target}"
        )


if __name__ == "__main__":
    main()

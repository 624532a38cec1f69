"""The device model on a CUDA GPU: the same integers as on the CPU, and how fast.

Two steps, because a GPU machine may lack this project's toolchains (ONNX Runtime, MLflow, Hydra):
``prepare`` (here) quantizes ResNet8 as a default device run does (ONNX Runtime int8 per-channel MinMax),
runs every device of bench/_devices.py on this CPU and saves the integer model, the images (uint8: the
model's raw 0-255 pixels are integers), the ADC steps and the CPU's logits; ``run`` (on the GPU machine:
torch and numpy only) calibrates the ADC ranges again on CUDA, runs every device there, checks that steps
and logits equal the CPU's, and prints ms per image on CUDA and on that machine's CPU.

Usage:
  RESNET8PTQ_ASSETS=../shared python bench/device_cuda.py prepare [--bundle .cache/cuda-bundle]
  python bench/device_cuda.py run [--bundle .cache/cuda-bundle] [--batch-size 4000] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pickle
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _devices import DEVICES  # noqa: E402  (bench/_devices.py)

from resnet8ptq.device.adc import LayerSteps, PartialSumProfile  # noqa: E402
from resnet8ptq.device.adc_ranges import AdcRule, calibrated_steps  # noqa: E402
from resnet8ptq.device.cim import CrossbarArithmetic  # noqa: E402
from resnet8ptq.device.config import DeviceConfig  # noqa: E402
from resnet8ptq.device.executor import Arithmetic, Ideal, execute  # noqa: E402
from resnet8ptq.device.graph import IntegerModel  # noqa: E402


def arithmetic(device: DeviceConfig, seed: int, steps: dict[str, LayerSteps]) -> Arithmetic:
    """As resnet8ptq.device.evaluate.arithmetic (not imported: it needs tqdm and scipy)."""
    if device.kind == "integer":
        return Ideal()
    return CrossbarArithmetic(device.crossbar(), seed=seed, adc_steps=steps)


def steps_on(model: IntegerModel, device: DeviceConfig, calibration: np.ndarray, on: str) -> dict:
    """The ADC steps calibrated on ``on`` (as resnet8ptq.device.evaluate.adc_steps for calibrated rules)."""
    crossbar = device.crossbar()
    if crossbar.adc_bits is None:
        return {}
    profile = PartialSumProfile()
    ideal = CrossbarArithmetic(crossbar.ideal(), profile=profile)
    execute(model, calibration, ideal, device.images_per_step, device=on)
    return calibrated_steps(profile, AdcRule.of(crossbar, device.range_rule))


def logits_on(model: IntegerModel, device: DeviceConfig, steps: dict, images: np.ndarray, on: str) -> list:
    """Each noise draw's logits, computed on ``on``."""
    return [
        execute(model, images, arithmetic(device, seed, steps), device.images_per_step, device=on)[0]
        for seed in range(device.seeds)
    ]


def timed(on: str, work: callable) -> tuple[object, float]:
    """``work()`` and its wall time, the GPU synchronised."""
    if on == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = work()
    if on == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def prepare(bundle: Path) -> None:
    import tempfile

    from _int8 import canonical_model, inputs, quantized_int8

    from resnet8ptq.backends.onnx.integer import integer_model

    given = inputs()
    with tempfile.TemporaryDirectory() as tmp:
        model = integer_model(quantized_int8(canonical_model(Path(tmp)), given.calibration, Path(tmp)))
    bundle.mkdir(parents=True, exist_ok=True)
    np.save(bundle / "images.npy", given.images.astype(np.uint8))
    np.save(bundle / "calibration.npy", given.calibration.astype(np.uint8))
    assert np.array_equal(given.images.astype(np.uint8), given.images), "the model's input is 0-255 integers"
    cpu = {}
    for key, (device, count) in DEVICES.items():
        steps = steps_on(model, device, given.calibration, "cpu")
        cpu[key] = {"steps": steps, "logits": logits_on(model, device, steps, given.images[:count], "cpu")}
        print(f"prepared {key}", flush=True)
    with open(bundle / "bundle.pkl", "wb") as file:
        pickle.dump({"model": model, "cpu": cpu, "machine": platform.processor() or platform.machine()}, file)


def same_steps(a: dict[str, LayerSteps], b: dict[str, LayerSteps]) -> bool:
    """Whether two calibrations gave every layer the same steps and windows."""
    fields = dataclasses.astuple
    return a.keys() == b.keys() and all(
        all(np.array_equal(x, y) for x, y in zip(fields(a[k]), fields(b[k]), strict=True)) for k in a
    )


def measure(model: IntegerModel, device: DeviceConfig, bench: dict, expected: dict, on: str) -> dict:
    """Calibrate and run ``device`` on ``on`` (``bench``: the images, the calibration sample, how many test
    images); its times and whether its steps and logits equal ``expected`` (the CPU's)."""
    images, count = bench["images"][: bench["count"]], bench["count"]
    steps, calibration_s = timed(on, lambda: steps_on(model, device, bench["calibration"], on))
    logits_on(model, device, steps, images[: device.batch_size], on)  # warm-up
    logits, seconds = timed(on, lambda: logits_on(model, device, steps, images, on))
    pairs = zip(logits, expected["logits"], strict=True)
    return {
        f"{on}_calibration_s": round(calibration_s, 3),
        f"{on}_steps_equal": same_steps(steps, expected["steps"]),
        f"{on}_logits_equal": all(np.array_equal(a, b) for a, b in pairs),
        f"{on}_ms_per_image": round(1e3 * seconds / count, 4),
    }


def run(bundle: Path, batch_size: int, out: Path | None, limit: int | None) -> None:
    with open(bundle / "bundle.pkl", "rb") as file:
        saved = pickle.load(file)  # our own bundle, from `prepare`
    model: IntegerModel = saved["model"]
    images = np.load(bundle / "images.npy").astype(np.float32)
    calibration = np.load(bundle / "calibration.npy").astype(np.float32)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cpu = platform.processor() or platform.machine()
    print(f"# GPU: {gpu}; CPU: {cpu}, {torch.get_num_threads()} threads; batch {batch_size} images")
    rows = []
    for key, (device, count) in DEVICES.items():
        device = dataclasses.replace(device, batch_size=batch_size)
        count = min(count, limit or count)
        expected = {
            "steps": saved["cpu"][key]["steps"],
            "logits": [a[:count] for a in saved["cpu"][key]["logits"]],
        }
        bench = {"images": images, "calibration": calibration, "count": count}
        row: dict[str, object] = {"device": key, "images": count}
        for on in ["cuda", "cpu"] if gpu else ["cpu"]:
            row |= measure(model, device, bench, expected, on)
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = {on: rows[0].get(f"{on}_ms_per_image") for on in ("cuda", "cpu")}
    print(f"\n# equal: against the CPU of `prepare` ({saved['machine']}); ratios to the integer executor")
    for row in rows:
        cells = [
            f"{on} {row[f'{on}_ms_per_image']:8.4f} ms {row[f'{on}_ms_per_image'] / base[on]:5.2f}x  "
            f"equal: logits {row[f'{on}_logits_equal']}, steps {row[f'{on}_steps_equal']}"
            for on in ("cuda", "cpu")
            if f"{on}_ms_per_image" in row
        ]
        print(f"{row['device']:30s} " + " | ".join(cells))
    if out:
        (out / "device_cuda.json").write_text(json.dumps({"gpu": gpu, "cpu": cpu, "rows": rows}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("--bundle", type=Path, default=REPO / ".cache" / "cuda-bundle")
    parser.add_argument("--batch-size", type=int, default=4000, help="images per batch (run)")
    parser.add_argument("--out", type=Path, default=None, help="where run writes device_cuda.json")
    parser.add_argument("--images", type=int, default=None, help="at most this many test images (run)")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.bundle)
    else:
        run(args.bundle, args.batch_size, args.out, args.images)


if __name__ == "__main__":
    main()

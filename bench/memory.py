"""What keeping freed memory (resnet8ptq/memory.py: glibc's ``M_TOP_PAD``) saves, as ratios on this machine:
the integer executor and the 128-row 4-bit crossbar (bench/_devices.py) over the first N test images, each
in a fresh process with glibc's defaults and in one with :func:`~resnet8ptq.memory.keep_freed_memory`,
interleaved for R rounds. Printed per device: the medians of wall-clock, CPU (user + system) and system
seconds per image, and kept / default for each.

Usage: RESNET8PTQ_ASSETS=../shared python bench/memory.py [--images 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _devices import DEVICES  # noqa: E402  (bench/_devices.py)
from _int8 import canonical_model, inputs, quantized_int8  # noqa: E402  (bench/_int8.py)

TIMED = ("integer", "cim rows=128 adc=4")
MODES = ("default", "kept")
KEYS = ("wall", "cpu", "system")


def child(model_path: Path, device_key: str, mode: str, count: int) -> dict[str, float]:
    """One device pass in this process; its wall-clock, user and system seconds."""
    from resnet8ptq.memory import keep_freed_memory

    if mode == "kept" and not keep_freed_memory():
        sys.exit("glibc's malloc is not in use, or the environment tunes it: nothing to compare")
    from resnet8ptq.backends.onnx.integer import integer_model
    from resnet8ptq.device.evaluate import adc_steps, arithmetic
    from resnet8ptq.device.executor import execute

    given = inputs()
    device, _ = DEVICES[device_key]
    model = integer_model(model_path)
    steps = adc_steps(model, device, given.calibration)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    execute(model, given.images[:count], arithmetic(device, 0, steps), device.images_per_step, device="cpu")
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    system = after.ru_stime - before.ru_stime
    return {"wall": wall, "cpu": after.ru_utime - before.ru_utime + system, "system": system}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "DEVICE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, device_key, mode = args.child
        print(json.dumps(child(Path(model), device_key, mode, args.images)))
        return
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TOP_PAD_" and k != "GLIBC_TUNABLES"}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        model = quantized_int8(canonical_model(cache), inputs().calibration, cache)
        seconds: dict[tuple[str, str], list[dict[str, float]]] = {}
        for _ in range(args.rounds):
            for device_key in TIMED:
                for mode in MODES:
                    command = [sys.executable, __file__, "--images", str(args.images)]
                    command += ["--child", str(model), device_key, mode]
                    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                    result = json.loads(done.stdout.splitlines()[-1])
                    seconds.setdefault((device_key, mode), []).append(result)
    from resnet8ptq.hardware import detect

    print(f"# {detect().tags()['hardware.cpu']}, {os.cpu_count()} cores; {args.images} test images,")
    print(f"# seconds per 1,000 images, medians of {args.rounds} rounds, each pass in a fresh process")
    for device_key in TIMED:
        medians = {
            mode: {key: statistics.median(r[key] for r in seconds[device_key, mode]) for key in KEYS}
            for mode in MODES
        }
        per_k = 1000 / args.images
        print(f"{device_key}:")
        for key in KEYS:
            default, kept = medians["default"][key], medians["kept"][key]
            ratio = kept / default
            figures = f"default {per_k * default:6.2f}  kept {per_k * kept:6.2f}  kept/default {ratio:5.2f}"
            print(f"  {key:6s} {figures}")


if __name__ == "__main__":
    main()

"""The microcontroller path's cost on this machine: MLPerf Tiny's int8 ResNet8 per test image in TensorFlow
Lite Micro (the `mcu` stage), in LiteRT's reference kernels (a TFLite run's reference evaluation) and in
LiteRT's optimised kernels (its native pass), each on one core, one image per `invoke`; printed as ms per
image and as ratios to TFLM's, the CPU named. What `mcu.images` saves follows: TFLM's time scales with the
images it runs.

Usage: RESNET8PTQ_ASSETS=../shared python bench/mcu.py [--images 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resnet8ptq.backends.tflite.litert_runner import quantize  # noqa: E402
from resnet8ptq.data import load_cifar10, to_model_input  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402
from resnet8ptq.mcu import tflm  # noqa: E402

MODEL = "models/pretrainedResnet_quant.tflite"  # MLPerf Tiny's int8 ResNet8 (../shared/README.md)


def per_image_ms(invoke: Callable[[np.ndarray], None], inputs: np.ndarray) -> float:
    invoke(inputs[0])  # warm-up: allocation, first-call setup
    start = time.perf_counter()
    for image in inputs:
        invoke(image)
    return 1e3 * (time.perf_counter() - start) / len(inputs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as each TFLM worker has
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    from tflite_micro import runtime

    assets = Path(os.environ.get("RESNET8PTQ_ASSETS", REPO.parent / "shared"))
    model = (assets / MODEL).read_bytes()
    source, _ = tflm.io(model)
    images = to_model_input(load_cifar10(assets, download=False).test_images[: args.images])
    inputs = quantize(images, source.scale, source.zero_point, source.dtype)[:, None]

    micro = runtime.Interpreter.from_bytes(model)  # as the mcu stage makes it (resnet8ptq/mcu/tflm.py)

    def on_tflm(image: np.ndarray) -> None:
        micro.set_input(image, 0)
        micro.invoke()

    def litert(resolver: OpResolverType) -> Callable[[np.ndarray], None]:
        interpreter = Interpreter(model_content=model, experimental_op_resolver_type=resolver, num_threads=1)
        interpreter.allocate_tensors()
        index = interpreter.get_input_details()[0]["index"]

        def invoke(image: np.ndarray) -> None:
            interpreter.set_tensor(index, image)
            interpreter.invoke()

        return invoke

    paths = {
        "TFLite Micro (mcu stage)": on_tflm,
        "LiteRT reference kernels (BUILTIN_REF)": litert(OpResolverType.BUILTIN_REF),
        "LiteRT optimised kernels": litert(OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES),
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):  # interleaved: drift in the machine's speed hits every path alike
        for name, invoke in paths.items():
            times[name].append(per_image_ms(invoke, inputs))
    print(f"{detect().label}: MLPerf's int8 ResNet8 on {args.images} test images; median of {args.rounds}")
    first = statistics.median(next(iter(times.values())))
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:40s} {median:7.2f} ms/image   {median / first:5.2f}x TFLM's")


if __name__ == "__main__":
    main()

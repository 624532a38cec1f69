"""Does a run make the same thing on other kernel paths of this CPU? Runs one configuration per
toolchain under several kernel paths (thread counts; torch's and oneDNN's instruction sets forced down),
each in a store of its own, and compares the runs' digests (calibration ranges, model, predictions) with
the first path's, naming the first difference (resnet8ptq.diff). Issue 44's question, on one machine.

Usage: RESNET8PTQ_ASSETS=../shared python bench/kernel_paths.py [--out DIR] [--backends onnx,torch,tflite]
       [--paths 0,2] [--configuration "backend=onnx algo=brecq ..."]   (one configuration of your own)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resnet8ptq.diff import Side, differences  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402

CONFIGURATIONS = {
    "onnx": ["backend=onnx", "dtype=int8", "per_channel=true"],
    "torch": ["backend=torch", "dtype=u8s8", "per_channel=true"],
    "tflite": ["backend=tflite", "dtype=int8", "per_channel=true", "backend.mlperf_reference=false"],
}
"""The headline configurations (README's table), one per toolchain."""
PATHS = {
    "native, 2 threads": ({}, ["threads=2"]),
    "native, 1 thread": ({}, ["threads=1"]),
    "AVX2 (ATen, oneDNN)": ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, ["threads=2"]),
    "no SIMD dispatch (ATen default, oneDNN SSE4.1)": (
        {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
        ["threads=2"],
    ),
}
"""Kernel paths: environment and overrides. ONNX Runtime has no switch for its instruction set: only its
thread count changes there."""
LEAN = ["layer_analysis=false", "mlflow.log_models=false", "report.enabled=false"]


def run(folder: Path, configuration: list[str], env: dict[str, str], overrides: list[str]) -> Side:
    """One run in a store of its own in ``folder``; its quantized run."""
    folder.mkdir(parents=True)
    command = [sys.executable, str(REPO / "run.py"), *configuration, *overrides, *LEAN]
    done = subprocess.run(command, cwd=folder, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("resnet8ptq")
    (found,) = client.search_runs([experiment.experiment_id], "tags.quantized = 'true'")
    return Side(client, found)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None, help="keep the stores here (default: a temp dir)")
    parser.add_argument("--backends", default="onnx,torch,tflite")
    parser.add_argument("--paths", default=None, help="indices into PATHS (default: all)")
    parser.add_argument("--configuration", default=None, help="overrides of one configuration to run instead")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="kernel-paths-"))
    configurations = (
        {"custom": args.configuration.split()}
        if args.configuration
        else {backend: CONFIGURATIONS[backend] for backend in args.backends.split(",")}
    )
    paths = list(PATHS.items())
    if args.paths:
        paths = [paths[int(index)] for index in args.paths.split(",")]
    print(f"# {detect().label}; stores in {root}")
    for backend, configuration in configurations.items():
        sides = {}
        for name, (env, overrides) in paths:
            start = time.perf_counter()
            folder = root / backend / f"path-{len(sides)}"
            sides[name] = run(folder, configuration, env, overrides)
            tags = sides[name].tags
            digests = " ".join(
                f"{k.removeprefix('digest.')}={v[:8]}"
                for k, v in sorted(tags.items())
                if k.startswith("digest.")
            )
            accuracy, seconds = sides[name].run.data.metrics["accuracy"], time.perf_counter() - start
            print(
                f"{backend:6s} {name:46s} {100 * accuracy:6.2f} %  {digests}  ({seconds:.0f} s)", flush=True
            )
        first_name, first = next(iter(sides.items()))
        for name, side in list(sides.items())[1:]:
            # the hardware stage names the forced path itself (hardware.kernel_path): what follows is the news
            found = next(
                ((stage, d) for stage, d in differences(first, side) if d and stage != "hardware"), None
            )
            verdict = "the same" if found is None else f"first difference: {found[0]}: {found[1]}"
            print(f"  {backend}: {name} against {first_name}: {verdict}", flush=True)


if __name__ == "__main__":
    main()

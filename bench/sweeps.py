"""Benchmark: wall-clock time of whole sweeps through `run.py`, sequential and with 2 parallel jobs
(hydra-joblib-launcher), and the import cost of the entry point for an ONNX-only run.

Usage: RESNET8PTQ_ASSETS=../shared python bench/sweeps.py [--grid]   (--grid adds the 36-run full grid)
Each sweep runs in a fresh temporary directory (fresh MLflow store) with the model conversion cached and
none of an earlier sweep's calibrations or evaluations (overhead.tool).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from overhead import tool  # bench/ is on sys.path when this script runs

REPO = Path(__file__).resolve().parents[1]
HEADLINE = ["backend=onnx,torch", "dtype=int8,uint8"]
GRID = [
    "backend=onnx,torch",
    "dtype=int8,uint8,u8s8",
    "calib=minmax,entropy,percentile",
    "per_channel=false,true",
]
PARALLEL = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
IMPORT_PROBE = """
import sys, time
start = time.perf_counter()
import hydra, resnet8ptq.config, resnet8ptq.app  # what run.py imports: Hydra, the config schema, the app
import resnet8ptq.pipeline, resnet8ptq.backends.onnx  # what an ONNX run imports
seconds = time.perf_counter() - start
heavy = [name for name in ("tensorflow", "torch", "tf2onnx", "keras") if name in sys.modules]
print(f"{seconds:.2f} {','.join(heavy) or 'none'}")
"""


def sweep_seconds(overrides: list[str]) -> float:
    """Wall-clock seconds of a sweep in a new directory (a failed one stops the benchmark, printing why)."""
    with tempfile.TemporaryDirectory() as tmp:
        return tool(Path(tmp), *overrides)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", action="store_true", help="also time the 36-run full grid")
    args = parser.parse_args()
    os.environ.setdefault("RESNET8PTQ_ASSETS", str(REPO.parent / "shared"))
    probe = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    print(f"entry point + ONNX pipeline import: {float(probe[0]):.2f} s; heavy modules imported: {probe[1]}")
    sweeps = [("headline (4 runs)", HEADLINE, 4)] + ([("full grid (36 runs)", GRID, 36)] if args.grid else [])
    for name, overrides, runs in sweeps:
        sequential = sweep_seconds(overrides)
        parallel = sweep_seconds(overrides + PARALLEL)
        print(
            f"{name}: sequential {sequential:6.1f} s ({sequential / runs:.1f} s/run); "
            f"2 parallel jobs {parallel:6.1f} s ({parallel / runs:.1f} s/run); "
            f"speed-up {sequential / parallel:.2f}x"
        )


if __name__ == "__main__":
    main()

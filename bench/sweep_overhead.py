"""Benchmark: the 18-run ORT sweep through `run.py` (Hydra + MLflow + artifacts) versus a bare script doing
the same quantize + evaluate work (bench/bare_ort_sweep.py). Prints wall-clock times and their ratio.

Usage: RESNET8PTQ_ASSETS=../shared python bench/sweep_overhead.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEP = [
    "-m",
    "backend=onnx",
    "dtype=int8,uint8,u8s8",
    "calib=minmax,entropy,percentile",
    "per_channel=false,true",
]


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    sys.path.insert(0, str(REPO))
    from resnet8ptq.model import canonical_onnx, resolve_h5

    assets = Path(os.environ.get("RESNET8PTQ_ASSETS", REPO.parent / "shared")).resolve()
    os.environ["RESNET8PTQ_ASSETS"] = str(assets)
    cache = Path(os.environ.get("RESNET8PTQ_CACHE", Path.home() / ".cache" / "resnet8ptq"))
    h5, sha256 = resolve_h5(None, None, cache)
    model = canonical_onnx(h5, sha256, cache).onnx_path  # converted before timing: both sides start cached
    with tempfile.TemporaryDirectory() as tmp:
        tool = timed([sys.executable, str(REPO / "run.py"), *SWEEP], Path(tmp))
        bare = timed(
            [
                sys.executable,
                str(REPO / "bench" / "bare_ort_sweep.py"),
                str(model),
                str(assets / "cifar-10-batches-bin"),
            ],
            Path(tmp),
        )
    print("18-run ONNX Runtime sweep (3 dtypes x 3 calib x per_channel), sequential, cached conversion")
    print(f"  run.py (Hydra + MLflow + artifacts): {tool:7.1f} s  ({tool / 18:.2f} s/run)")
    print(f"  bare quantize_static + evaluate:     {bare:7.1f} s  ({bare / 18:.2f} s/run)")
    print(f"  overhead ratio run.py / bare:        {tool / bare:7.2f}x")


if __name__ == "__main__":
    main()

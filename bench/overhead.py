"""How much the tool costs over the work it does: the headline sweep and the 18-run ORT sweep through `run.py`
against bench/bare_sweep.py doing the same quantize + evaluate work, as ratios, from one invocation.

Usage: RESNET8PTQ_ASSETS=../shared python bench/overhead.py [--repeat N]
The headline sweep is also measured lean (`mlflow.log_models=false layer_analysis=false`: no MLflow Model per
run and no per-layer SQNR; the same quantize + evaluate work), to show what those two cost.
Every command runs in its own process (imports included), the tool in a new directory (a new MLflow store),
with the canonical model converted and the torch programs compiled once before (warm caches), and without
the calibration ranges, algorithm outputs and evaluations an earlier command kept (`tool`). The headline
sweep's five commands run N times (default 3), interleaved, since the same command's time moves by 10-20%
from one run to the next on a shared 2-core VM: the ratios are of the medians, with the spread of the ratios
of each round. Printed:
- tool / bare wall-clock, for the headline sweep and the 18-run ORT sweep (target <= 1.2);
- the warm headline sweep (`rerun=true`, store and model there) / the bare script's quantize + evaluate
  seconds (target <= 1.3);
- torch simulated throughput / torch FP32 eager throughput, from the bare run (target >= 1).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEADLINE = ["backend=onnx,torch", "dtype=int8,uint8"]
LEAN = ["mlflow.log_models=false", "layer_analysis=false"]
ORT_GRID = [
    "backend=onnx",
    "dtype=int8,uint8,u8s8",
    "calib=minmax,entropy,percentile",
    "per_channel=false,true",
]


def timed(command: list[str], cwd: Path) -> tuple[float, str]:
    """Wall-clock seconds of a command, and its output (it must succeed)."""
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return seconds, result.stdout + result.stderr


WORK_KEPT = ("calib", "algo", "eval")
"""What `cache_dir` keeps of the runs' own work (ONNX Runtime's calibration ranges, the algorithms' output,
the evaluations): a measured command starts without it, so the tool does all the work the bare script does."""


def tool(workdir: Path, *overrides: str) -> float:
    """Seconds of `run.py -m overrides` in ``workdir``, with a copy of the warm cache directory (the converted
    model, MLflow's empty store) that holds none of an earlier command's work (:data:`WORK_KEPT`)."""
    warm = Path(os.environ.get("RESNET8PTQ_CACHE") or Path.home() / ".cache" / "resnet8ptq")
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=workdir))
    if warm.is_dir():
        shutil.copytree(warm, cache, ignore=shutil.ignore_patterns(*WORK_KEPT), dirs_exist_ok=True)
    return timed([sys.executable, str(REPO / "run.py"), "-m", *overrides, f"cache_dir={cache}"], workdir)[0]


def bare(*axes: str) -> tuple[float, float, str]:
    """Wall-clock seconds, quantize + evaluate seconds, output."""
    seconds, output = timed([sys.executable, str(REPO / "bench" / "bare_sweep.py"), *axes], REPO)
    return seconds, float(re.search(r"work_seconds ([\d.]+)", output).group(1)), output


def throughput(output: str, pattern: str) -> list[float]:
    return [float(m) for m in re.findall(pattern + r".*?, ([\d.]+) img/s", output)]


def main(repeat: int) -> None:
    warm_up = tempfile.mkdtemp(prefix="bench-")
    # Converts and caches the model, and fills inductor's compile cache for the torch programs of the headline
    # sweep: every measured command then starts from the same warm caches (else the first one pays for them).
    timed([sys.executable, str(REPO / "run.py"), "-m", *HEADLINE, "report.enabled=false"], Path(warm_up))
    cold, warm, lean_cold, lean_warm, walls, works, fp32, simulated = [], [], [], [], [], [], [], []
    for _ in range(repeat):
        for settings, cold_times, warm_times in (([], cold, warm), (LEAN, lean_cold, lean_warm)):
            with tempfile.TemporaryDirectory(prefix="bench-") as headline:
                cold_times.append(tool(Path(headline), *HEADLINE, *settings))
                warm_times.append(tool(Path(headline), *HEADLINE, *settings, "rerun=true"))
        wall, work, output = bare(*HEADLINE)
        walls.append(wall)
        works.append(work)
        print(
            f"round {len(walls)}: headline tool {cold[-1]:.1f} s, warm {warm[-1]:.1f} s; "
            f"lean {lean_cold[-1]:.1f} s, warm {lean_warm[-1]:.1f} s; "
            f"bare {wall:.1f} s (quantize + evaluate {work:.1f} s)",
            flush=True,
        )
        fp32 += throughput(output, r"torch fp32: [\d.]+")
        simulated.append(throughput(output, r"torch-(?:int8|uint8)-[\w-]+: accuracy [\d.]+, simulated"))
    with tempfile.TemporaryDirectory(prefix="bench-") as grid:
        grid_tool = tool(Path(grid), *ORT_GRID)
    grid_bare, _, _ = bare(*ORT_GRID)
    rows = [
        ("headline sweep: tool / bare script (wall)", cold, walls, 1.2),
        ("18-run ORT sweep: tool / bare script (wall)", [grid_tool], [grid_bare], 1.2),
        ("warm headline sweep (rerun=true) / bare quantize + evaluate", warm, works, 1.3),
        ("lean headline sweep: tool / bare script (wall)", lean_cold, walls, 1.2),
        ("lean warm headline sweep / bare quantize + evaluate", lean_warm, works, 1.3),
    ]
    print(f"CPU: {cpu()}; headline rounds: {repeat}, ORT sweep: 1")
    print(f"{'what':<62} {'tool s':>8} {'bare s':>8} {'ratio':>6}  {'rounds':>11}  target")
    for what, mine, theirs, target in rows:
        ratio = statistics.median(mine) / statistics.median(theirs)
        rounds = [m / t for m, t in zip(mine, theirs, strict=True)]
        spread = f"{min(rounds):.2f}-{max(rounds):.2f}"
        print(
            f"{what:<62} {statistics.median(mine):8.1f} {statistics.median(theirs):8.1f} {ratio:6.2f}  "
            f"{spread:>11}  <= {target}"
        )
    for index, dtype in enumerate(("int8/int8", "uint8/uint8")):
        values = [round_[index] / eager for round_, eager in zip(simulated, fp32, strict=True)]
        print(
            f"torch simulated {dtype} / FP32 eager throughput: median {statistics.median(values):.2f} "
            f"(rounds {min(values):.2f}-{max(values):.2f}; >= 1)"
        )


def cpu() -> str:
    sys.path.insert(0, str(REPO))
    from resnet8ptq.hardware import detect

    return detect().label


if __name__ == "__main__":
    os.environ.setdefault("RESNET8PTQ_ASSETS", str(REPO.parent / "shared"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the headline sweep's commands")
    main(parser.parse_args().repeat)

"""ONNX Runtime calibration's speed with and without this package's two shortcuts, as ratios on this machine:
the MinMax calibrator's extrema in one pass (resnet8ptq/backends/onnx/float64.py, ``one_pass_extrema``) and
the entropy calibrator's vectorised threshold search (resnet8ptq/entropy_threshold.py). Each round quantizes
ResNet8 (uint8/int8, the run's default calibration sample) with each method of conf/calib/ twice, with the
shortcuts and with ORT's own code, each with an empty cache; the two models must be the same bytes. Rounds
are interleaved; the medians are printed.

Usage: RESNET8PTQ_ASSETS=../shared python bench/calibration.py [--rounds 2] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _int8 import canonical_model, inputs  # noqa: E402  (bench/_int8.py)

from resnet8ptq.backends.onnx import backend, float64  # noqa: E402
from resnet8ptq.calibration import CalibConfig  # noqa: E402
from resnet8ptq.dtype import DtypeConfig  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402
from resnet8ptq.spec import QuantSpec  # noqa: E402

METHODS = {  # conf/calib/*.yaml
    "minmax": CalibConfig("minmax"),
    "entropy": CalibConfig("entropy", num_bins=2048, num_quantized_bins=128),
    "percentile": CalibConfig("percentile", symmetric=True, num_bins=2048, percentile=99.999),
}


@contextlib.contextmanager
def orts_own_code() -> Iterator[None]:
    """The calibration as ORT alone does it: onnx2torch's reductions, ORT's threshold search."""
    extrema, search = float64.one_pass_extrema, backend.use_fast_search
    float64.one_pass_extrema, backend.use_fast_search = (lambda module: module), (lambda calibrator: None)
    try:
        yield
    finally:
        float64.one_pass_extrema, backend.use_fast_search = extrema, search


def quantize(onnx_path: Path, calibration, calib: CalibConfig, threads: int) -> tuple[float, bytes]:
    """Seconds to quantize with an empty cache, and the model's bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        onnx = backend.OnnxRuntimeBackend(native=False, threads=threads)
        onnx.cache_dir = Path(tmp) / "cache"
        spec = QuantSpec(DtypeConfig("uint8", "int8"), calib, per_channel=False)
        start = time.perf_counter()
        model = onnx.quantize(onnx_path, calibration, spec, Path(tmp) / "q")
        return time.perf_counter() - start, model.path.read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    given = inputs()
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = canonical_model(Path(tmp)).onnx_path
        seconds: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for method, calib in METHODS.items():
                fast, fast_model = quantize(onnx_path, given.calibration, calib, args.threads)
                with orts_own_code():
                    own, own_model = quantize(onnx_path, given.calibration, calib, args.threads)
                if fast_model != own_model:
                    raise SystemExit(f"{method}: the shortcuts made another model than ORT's own code")
                seconds.setdefault((method, "shortcuts"), []).append(fast)
                seconds.setdefault((method, "ORT"), []).append(own)
    print(f"{detect().cpu}, {args.threads} thread(s), median of {args.rounds} rounds; models identical")
    for method in METHODS:
        fast, own = (statistics.median(seconds[method, kind]) for kind in ("shortcuts", "ORT"))
        print(f"{method:>10}: quantize {own:5.1f} s with ORT's own code, {fast:5.1f} s ({fast / own:.2f}x)")


if __name__ == "__main__":
    main()

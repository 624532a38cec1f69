"""The quantize + evaluate work of a `run.py` sweep, as a bare script: for each backend its FP32 model is
evaluated once; for each configuration the backend calibrates and quantizes, then the reference form and the
runtime form are evaluated on the 10,000 test images and judged, and the latency measured. The same backend
classes and conf/ files as the tool; no Hydra composition, MLflow, per-run files or figures, layer analysis,
report.

Usage: RESNET8PTQ_ASSETS=../shared python bench/bare_sweep.py backend=onnx,torch dtype=int8,uint8
       [calib=minmax,...] [per_channel=false,true]
Prints one line per configuration, then `work_seconds <s>`: the seconds spent quantizing and evaluating
(imports and data loading excluded).
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resnet8ptq.calibration import CalibConfig  # noqa: E402
from resnet8ptq.data import MD5_CACHE, calibration_set, load_cifar10, to_model_input  # noqa: E402
from resnet8ptq.dtype import DtypeConfig  # noqa: E402
from resnet8ptq.evaluate import evaluate_baseline  # noqa: E402
from resnet8ptq.execution import evaluate_quantized  # noqa: E402
from resnet8ptq.model import MODEL_SHA256, canonical_onnx, resolve_source  # noqa: E402
from resnet8ptq.spec import QuantSpec  # noqa: E402

DEFAULTS = {"backend": "onnx", "dtype": "int8", "calib": "minmax", "per_channel": "false"}


def group(name: str, choice: str) -> dict:
    """A config group's yaml as it is in conf/ (without a defaults list)."""
    node = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / name / f"{choice}.yaml"))
    node.pop("defaults", None)
    return node


def main(argv: list[str]) -> None:
    axes = dict(DEFAULTS) | dict(arg.split("=", 1) for arg in argv)
    names = list(axes)
    configs = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(axes[n].split(",") for n in names))
    ]
    assets = Path(os.environ.get("RESNET8PTQ_ASSETS", REPO.parent / "shared"))
    cache = Path(os.environ.get("RESNET8PTQ_CACHE", Path.home() / ".cache" / "resnet8ptq"))
    h5, sha256 = resolve_source(assets / "models" / "pretrainedResnet.h5", MODEL_SHA256, cache)
    onnx_path = canonical_onnx(h5, sha256, cache).onnx_path
    data = load_cifar10(assets, download=False, md5_cache=cache / MD5_CACHE)  # as the tool reads it
    calibration, _ = calibration_set(data, 100, 42)
    images, labels = to_model_input(data.test_images), data.test_labels
    work, backends = 0.0, {}
    for config in configs:
        start = time.perf_counter()
        if config["backend"] not in backends:
            backend = instantiate(group("backend", config["backend"]))
            model = backend.load_fp32(onnx_path, cache / backend.NAME)
            fp32 = evaluate_baseline(model, images, labels, "fp32").evaluation
            backends[config["backend"]] = backend
            print(f"{backend.NAME} fp32: {fp32.accuracy:.4f}, {fp32.throughput_img_s:.0f} img/s")
        backend = backends[config["backend"]]
        spec = QuantSpec(
            DtypeConfig(**group("dtype", config["dtype"])),
            CalibConfig(**group("calib", config["calib"])),
            per_channel=config["per_channel"] == "true",
        )
        name = "-".join(config.values())
        workdir = Path(tempfile.gettempdir()) / f"bare-{os.getpid()}" / name
        quantized = backend.quantize(onnx_path, calibration, spec, workdir)
        result = evaluate_quantized(quantized, images, labels, name, 0.3)
        work += time.perf_counter() - start
        print(
            f"{name}: accuracy {result.reference.accuracy:.4f}, {result.verdict.execution}, "
            f"{result.speed.throughput_img_s:.0f} img/s"
        )
    print(f"work_seconds {work:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])

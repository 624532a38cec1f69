"""What the benches against IBM's simulators (bench/aihwkit_lightning.py, bench/aihwkit_pcm.py) share: the
simulator installed beside the project, accuracy batch by batch, and this tool's integer layers paired with
the FP32 model's layers (their input ranges and ADC full scales in the simulators' units)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from resnet8ptq.device.cim import tile_sizes
from resnet8ptq.device.graph import Conv, IntegerModel

BATCH = 250


def listed(kind: type) -> Callable[[str], list]:
    """An argparse type: a comma-separated list of ``kind``."""
    return lambda text: [kind(item) for item in text.split(",") if item]


def install_target(requirement: str, site: Path) -> None:
    """``requirement`` installed with ``--no-deps`` into ``site`` (pip, else uv) unless there already, then
    put first on sys.path: the project's interpreter, torch and numpy, no second venv. Installed into a
    temporary folder renamed into place, so an interrupted install leaves nothing half-written."""
    if not site.is_dir():
        site.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{site.name}.", dir=site.parent))
        spec = [requirement, "--no-deps", "--target", str(partial)]
        if importlib.util.find_spec("pip") is not None:
            command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *spec]
        elif shutil.which("uv"):
            command = ["uv", "pip", "install", "--python", sys.executable, *spec]
        else:
            sys.exit(f"Neither pip nor uv is available to install {requirement}.")
        print(f"Installing {requirement} into {site}", flush=True)
        subprocess.run(command, check=True)
        os.replace(partial, site)
    sys.path.insert(0, str(site))


def accuracy(module: torch.nn.Module, images: torch.Tensor, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Top-1 accuracy and the predicted classes, batch by batch."""
    predicted = []
    with torch.inference_mode():
        for start in range(0, len(images), BATCH):
            predicted.append(module(images[start : start + BATCH]).argmax(1).numpy())
    predicted = np.concatenate(predicted)
    return float(np.mean(predicted == labels)), predicted


def input_range(conv: Conv) -> float:
    """The layer's input range as this tool's quantizer calibrated it: scale · (qmax - zero point)."""
    q = conv.input_quant
    return float(q.scale) * (q.qmax - q.zero_point)


def pair_layers(model: IntegerModel, layers: dict[str, torch.nn.Module]) -> dict[str, torch.nn.Module]:
    """Each integer layer's layer among ``layers`` (name: a module with FP32 ``weight``): the one whose
    weights its int8 weights dequantize to."""
    layers = dict(layers)
    pairs = {}
    for conv in model.convs:
        real = conv.centered_weight.reshape(len(conv.weight), -1) * conv.weight_scale[:, None].astype(
            np.float64
        )
        errors = {
            name: float(np.abs(layer.weight.detach().reshape(real.shape).numpy() - real).max())
            for name, layer in layers.items()
            if layer.weight.numel() == real.size
        }
        name = min(errors, key=errors.get)
        if errors[name] > float(conv.weight_scale.max()):
            raise RuntimeError(
                f"{conv.name}: no analog layer with its weights (closest {name}, {errors[name]})"
            )
        pairs[conv.name] = layers.pop(name)
    return pairs


def tile_wmax(layer: torch.nn.Module, rows: int) -> np.ndarray:
    """max|w| over each tile's rows of each column (T, O): aihwkit-lightning's ``assumed_wmax``, aihwkit's
    per-tile column scale (``mapping.weight_scaling_columnwise``)."""
    weight = layer.weight.detach().reshape(layer.weight.shape[0], -1).abs().numpy().astype(np.float64)
    return np.stack(
        [
            part.max(axis=1)
            for part in np.split(weight, np.cumsum(tile_sizes(weight.shape[1], rows))[:-1], axis=1)
        ]
    )


def out_bounds(
    model: IntegerModel, steps: dict, pairs: dict, rows: int
) -> dict[str, tuple[float, float, float]]:
    """Per layer, this tool's ADC full scale as aihwkit's ``out_bound`` (bench/aihwkit_lightning.py): the
    median over the layer's tiles and columns of the exact per-column value, with their min and max."""
    result = {}
    for conv in model.convs:
        layer_steps = steps[conv.name]
        geometry = layer_steps.geometry
        half = np.maximum(np.abs(layer_steps.code_min), np.abs(layer_steps.code_max)) * layer_steps.steps
        bound = layer_steps.per_column(half).reshape(geometry.tiles, geometry.slices, geometry.outputs)[:, 0]
        real = bound * float(conv.input_quant.scale) * conv.weight_scale.astype(np.float64)[None, :]
        exact = real / (input_range(conv) * tile_wmax(pairs[conv.name], rows))
        result[conv.name] = (float(np.median(exact)), float(exact.min()), float(exact.max()))
    return result

"""What the benches against the field's simulators (bench/aihwkit_lightning.py, bench/aihwkit_pcm.py,
bench/crosssim_sonos.py) share: the simulator installed beside the project, accuracy batch by batch, this
tool's integer layers paired with the FP32 model's layers (their input ranges and ADC full scales in the
simulators' units), this tool's chips as weights and as devices, and the results files and tables."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import yaml

from resnet8ptq.device.config import DeviceConfig
from resnet8ptq.device.evaluate import adc_steps, arithmetic
from resnet8ptq.device.executor import execute, predictions
from resnet8ptq.device.graph import Conv, IntegerModel
from resnet8ptq.device.mapping import tile_sizes

BATCH = 250
PRESETS = Path(__file__).resolve().parents[1] / "conf" / "device" / "chip"


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


def chip_preset(name: str, **overrides) -> DeviceConfig:
    """conf/device/chip/<name>.yaml as a DeviceConfig, with ``overrides``."""
    return DeviceConfig(**{**yaml.safe_load((PRESETS / f"{name}.yaml").read_text()), **overrides})


def with_weights(fp32: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A copy of ``fp32`` with the layers named in ``weights`` holding those weights (float arithmetic)."""
    model = copy.deepcopy(fp32)
    modules = dict(model.named_modules())
    for name, weight in weights.items():
        modules[name].weight.data = weight.reshape(modules[name].weight.shape).to(torch.float32)
    return model


def our_weights(
    model, device: DeviceConfig, chip: int, steps, names: dict[str, str]
) -> dict[str, torch.Tensor]:
    """The weights this tool's chip computes with: each layer's cells (programmed, drifted) as levels times
    its drift compensation and its int8 scales; per FP32 layer name (``names``: integer layer -> FP32)."""
    crossbar = arithmetic(device, chip, steps)
    weights = {}
    for conv in model.convs:
        levels = sum(cells * 2.0**shift for cells, shift in crossbar.weight_slices(conv))
        scale = crossbar._compensation.get(conv.name, 1.0) * torch.from_numpy(
            conv.weight_scale.astype(np.float64)
        )
        weights[names[conv.name]] = levels * scale[:, None]
    return weights


def run_ours(model, preset: DeviceConfig, calibration, images, labels, chips: range, times, profiles) -> dict:
    """This tool's accuracy per time and chip (noise seeds ``chips``); the ADC ranges calibrated once, on the
    fresh ideal crossbar, as a run does."""
    steps = adc_steps(model, preset, calibration, profiles)
    result: dict[str, list[float]] = {}
    for t in times:
        device = replace(preset, t_inference=float(t))
        result[str(t)] = [
            float(
                np.mean(
                    predictions(model, execute(model, images, arithmetic(device, chip, steps))[0]) == labels
                )
            )
            for chip in chips
        ]
    return result


def deep_merge(target: dict, source: dict) -> dict:
    """``source``'s nested dicts merged into ``target`` (leaves replaced); ``target``."""
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            deep_merge(target[key], value)
        else:
            target[key] = value
    return target


def by_chip(results: dict) -> dict:
    """``results`` (as saved: each leaf a list over the chips ``meta.first_chip`` on) with every leaf list a
    dict chip -> value, so that files of other chips merge into it with :func:`deep_merge`."""
    first = int(results.get("meta", {}).get("first_chip", 0))

    def keyed(node):
        if isinstance(node, list):
            return {first + index: value for index, value in enumerate(node)}
        if isinstance(node, dict):
            return {key: value if key == "meta" else keyed(value) for key, value in node.items()}
        return node

    return keyed(results)


def run_meta(**meta) -> dict:
    """A results file's ``meta``: ``meta`` and this run's command line."""
    return {**meta, "command": shlex.join(["python", *sys.argv])}


def load_tables(paths: list[Path]) -> tuple[dict, list[tuple[Path, dict]]]:
    """Saved results files merged chip by chip (:func:`by_chip`), and each file's ``meta``."""
    results: dict = {}
    metas = []
    for path in paths:
        saved = json.loads(path.read_text())
        metas.append((path, dict(saved.get("meta", {}))))  # a copy: deep_merge updates the first in place
        deep_merge(results, by_chip(saved))
    for key in ("commit", "cpu"):  # each file's in the report's list of runs
        if len({meta.get(key) for _, meta in metas}) > 1:
            results["meta"][key] = "several (each run's own)"
    return results, metas


def write_report(path: Path, title: str, tables: Callable[[dict], None], results: dict, metas: list) -> None:
    """``tables(results)``'s printed tables as a markdown report at ``path``, headed by the command that
    wrote it and, per results file, the run's command, commit, CPU, test images and chips."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        tables(results)
    written = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"# {title}",
        "",
        f"Written by `{shlex.join(['python', *sys.argv])}` on {written} from these runs (one process each, "
        "one thread):",
        "",
        "| file | command | commit | CPU | test images | chips |",
        "|---|---|---|---|---|---|",
    ]
    for file, meta in metas:
        first, chips = int(meta.get("first_chip", 0)), meta.get("chips")
        span = f"{first}..{first + int(chips) - 1}" if chips else "?"
        command = f"`{meta['command']}`" if "command" in meta else "(not recorded)"
        lines.append(
            f"| {file.name} | {command} | {meta.get('commit', '?')} | {meta.get('cpu', '?')} "
            f"| {meta.get('images', '?')} | {span} |"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")  # renamed into place whole, as save() writes
    partial.write_text("\n".join(lines) + "\n" + printed.getvalue())
    partial.replace(path)
    print(f"Wrote {path}")


def save(path: Path | None, results: dict) -> None:
    """``results`` merged into the JSON file at ``path`` (written whole to a temporary file, then renamed)."""
    if path is None:
        return
    merged = deep_merge(json.loads(path.read_text()) if path.exists() else {}, results)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(merged, indent=1))
    partial.replace(path)


def summary(values: list[float] | dict[int, float]) -> tuple[float, float, int]:
    """Mean and sample standard deviation (percent) and count; of a list, or of a dict's values (chip ->
    value, :func:`by_chip`)."""
    array = 100 * np.asarray(list(values.values()) if isinstance(values, dict) else values)
    return float(array.mean()), float(array.std(ddof=1)) if len(array) > 1 else 0.0, len(array)


def when(t: str | float) -> str:
    """A time since programming as a person reads it."""
    names = {0: "0", 3600: "1 hour", 86400: "1 day", 432000: "5 days", 31536000: "1 year"}
    return names.get(int(float(t)), f"{float(t):g} s")


def difference(theirs: list[float] | dict, ours: list[float] | dict) -> tuple[float, float]:
    """This tool's mean - the simulator's (percent; unpaired: other chips) and its standard error
    √(s₁²/n₁ + s₂²/n₂)."""
    (m1, s1, n1), (m2, s2, n2) = summary(theirs), summary(ours)
    return m2 - m1, math.sqrt(s1**2 / n1 + s2**2 / n2)


def compared(theirs: list[float] | dict | None, ours: list[float] | dict | None) -> list[str]:
    """Table cells: each tool's mean ± std (chips), the difference this tool - the simulator ± its standard
    error (:func:`difference`), and whether the difference is within one standard error."""
    cells = ["{:.2f} ± {:.2f}".format(*summary(values)[:2]) if values else "" for values in (theirs, ours)]
    if not theirs or not ours:
        return [*cells, "", ""]
    mean, se = difference(theirs, ours)
    return [*cells, f"{mean:+.2f} ± {se:.2f}", "yes" if abs(mean) <= se else "no"]

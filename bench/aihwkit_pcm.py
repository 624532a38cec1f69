"""The ``pcm`` chip preset (conf/device/chip/pcm.yaml) beside IBM's aihwkit 1.2.0 itself (issue 62): the same
FP32 ResNet8, test images, times since programming and number of chips, each tool's accuracy per chip; then
aihwkit moved one switch at a time towards this tool's model, to find where the two part. Outside CI.

aihwkit 1.2.0 (its CPython 3.12 wheel, compiled against torch 2.x) is installed on first use with
``pip install --no-deps --target`` into ~/.cache/resnet8ptq-aihwkit/ and put on sys.path: the project's
interpreter, torch 2.14.1 and numpy (aihwkit's other imports, scipy and scikit-learn among them, are the
project's). ``OMP_WAIT_POLICY=PASSIVE`` is set before torch loads: torch's and aihwkit's OpenMP runtimes
otherwise spin against each other (about 12x slower).

aihwkit, as the preset cites it (``InferenceRPUConfig``; aihwkit's names):

* tiles of ``mapping.max_input_size = 512`` rows (the preset's ``rows``), split as this tool splits them;
  every column of a tile scaled to its largest weight (``weight_scaling_omega = 1``, columnwise), which
  ``PCMLikeNoiseModel`` maps to ``g_max`` = 25 µS: the preset's top level at each column's largest
  int8 weight;
* 8-bit converters (``forward.inp_res = out_res = 254``, ``out_bound = 10`` of StandardHWATrainingPreset),
  or ``out_res = -1`` (the ideal ADC); the inputs' range of every tile (``pre_post.input_range``, not
  learned) the activation range this tool's int8 quantizer calibrated, as bench/aihwkit_lightning.py;
* ``PCMLikeNoiseModel`` with its published programming noise and drift, ``read_noise_scale = 0`` (the 1/f
  noise the preset leaves out), ``GlobalDriftCompensation``; no ``w_noise``, ``out_noise`` or ``ir_drop``
  (the preset leaves them out too).

Parts (``--parts``):

* ``preset``: both tools, ideal and 8-bit ADC, ``--chips`` chips (aihwkit: ``torch.manual_seed(chip)`` before
  ``program_analog_weights``; this tool: noise seeds 0..chips-1, as a run's ``device.noise_seeds``), each read
  at every ``--times``;
* ``drift``: drift alone (no programming noise), 128 rows, 8-bit and ideal ADC (``--drift-adcs``), with and
  without compensation;
* ``weights``: the preset's chips of both tools (ideal ADC) as weights of the FP32 model (float activations,
  no converters): only the weight models (programming noise, drift, compensation) differ;
* ``switches`` (aihwkit only, 8-bit ADC, 512 rows; ``switches-ideal``: the ideal ADC): aihwkit changed
  cumulatively, one switch at a time, into this tool's model before issue 62 (now ``pcm_signed``):
  (1) programming noise on the pair's signed weight, no clamp at 0, instead of on both conductances clamped
  at 0; (2) nu drawn from the programmed weight instead of the target conductance; (3) the exact
  compensation Σ|W(t0)| / Σ|W(t)| of the tile's cells instead of aihwkit's read of one-hot inputs through
  the tile's ADC; (4) the ADC full scale from this tool's calibration (``out_bound`` per layer, as
  bench/aihwkit_lightning.py) instead of 10; (5) the DAC on this tool's input grid (``inp_res = 510``: 255
  steps over a non-negative input) instead of 127.

Not switchable inside aihwkit: this tool's int8 weights (aihwkit's are float) and its 8-bit activations
requantized after every layer (aihwkit's stay float between tiles): the ``switches`` part's last row against
this tool's preset row is what those two, with the ADC's asymmetric per-column windows, leave.

Usage: RESNET8PTQ_ASSETS=../shared .venv/bin/python bench/aihwkit_pcm.py [--images 2000] [--chips 10] \
    [--first-chip 0] [--times 0,3600,86400,31536000] [--parts preset,drift,switches] \
    [--tools aihwkit,resnet8ptq] [--dac 254] [--save FILE.json] [--table FILE.json ... [--report FILE.md]]
``--save`` merges this run's accuracies into FILE (the two tools can run in two processes, one core each,
each with a file of its own), and the switches reuse the aihwkit preset's chips found there; chips
``--first-chip`` on go to a file of their own. ``--table`` prints the tables from saved files without running
anything, the files merged chip by chip (seeds), and ``--report`` writes them as a markdown report headed by
each file's command, commit and CPU. With both the preset (ideal ADC) and the weights part saved, the table
splits the tools' difference into their weights' difference and each tool's device against its own chips as
weights (paired: the same chips), and lists each layer's weight error against FP32. One thread per process.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch's OpenMP runtime starts

import argparse
import contextlib
import copy
import importlib.metadata
import io
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _analog import (  # noqa: E402
    accuracy,
    by_chip,
    chip_preset,
    compared,
    deep_merge,
    difference,
    input_range,
    install_target,
    listed,
    load_tables,
    our_weights,
    out_bounds,
    pair_layers,
    run_meta,
    run_ours,
    save,
    summary,
    when,
    with_weights,
    write_report,
)
from _int8 import canonical_model, inputs, quantized_int8  # noqa: E402

from resnet8ptq.backends.onnx.integer import integer_model  # noqa: E402
from resnet8ptq.backends.torch.convert import onnx_to_torch  # noqa: E402
from resnet8ptq.device.evaluate import adc_steps  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402
from resnet8ptq.memory import keep_freed_memory  # noqa: E402

VERSION = "1.2.0"
SITE = Path.home() / ".cache" / "resnet8ptq-aihwkit" / f"aihwkit-{VERSION}"
NO_PROGRAMMING_NOISE = {"weight_noise": 0.0, "weight_noise_model": "constant"}
OUT_BOUND = 10.0  # StandardHWATrainingPreset's forward.out_bound
SWITCHES = (
    "aihwkit",
    "+ noise on the signed weight",
    "+ nu from the programmed weight",
    "+ exact compensation",
    "+ ADC full scale calibrated",
    "+ DAC on 255 steps",
)
"""The ``switches`` part's rows: aihwkit, then each switch added to the ones above it (module docstring)."""


def import_aihwkit() -> dict:
    """aihwkit's classes used here, installed first into :data:`SITE` if needed."""
    install_target(f"aihwkit=={VERSION}", SITE)
    with contextlib.redirect_stdout(io.StringIO()):
        from aihwkit.inference import GlobalDriftCompensation, PCMLikeNoiseModel
        from aihwkit.nn.conversion import convert_to_analog
        from aihwkit.simulator.configs import InferenceRPUConfig
        from aihwkit.simulator.parameters.enums import BoundManagementType, NoiseManagementType
    installed = importlib.metadata.version("aihwkit")
    if installed != VERSION:
        sys.exit(f"Expected aihwkit {VERSION}, found {installed}")
    return dict(
        compensation=GlobalDriftCompensation,
        pcm=PCMLikeNoiseModel,
        convert=convert_to_analog,
        config=InferenceRPUConfig,
        bound=BoundManagementType,
        noise=NoiseManagementType,
    )


def level_noise_model(pcm: type, nu_from_programmed: bool) -> type:
    """This tool's PCM programming noise inside aihwkit (a subclass of ``PCMLikeNoiseModel``): aihwkit's σ(ĝ)
    on the pair's signed weight, the empty cell noiseless and nothing clamped at 0; nu from the target
    conductances (aihwkit) or from the programmed ones (this tool)."""

    class LevelNoise(pcm):
        @torch.no_grad()
        def apply_programming_noise(self, weights: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
            scale = float(weights.abs().max().clamp(min=1e-7))
            level = weights.abs() / scale  # ĝ: 1 at the tile's largest weight (every column's, here)
            c0, c1, c2 = self.prog_coeff
            sigma = (
                self.prog_noise_scale * (c0 + c1 * level + c2 * level**2) / self.prog_coeff_g_max_reference
            )
            programmed = weights + sigma * scale * torch.randn_like(weights)
            source = programmed if nu_from_programmed else weights
            g_max = self.g_max
            nus = [
                self.generate_drift_coefficients(source.clamp(min=0) / scale * g_max),
                self.generate_drift_coefficients((-source).clamp(min=0) / scale * g_max),
            ]
            return programmed, nus

    return LevelNoise


def aihwkit_model(
    kit: dict,
    fp32: torch.nn.Module,
    ranges: dict[str, float],
    rows: int,
    adc: bool,
    programming_noise: bool = True,
    compensation: bool = True,
    switches: int = 0,
    dac: int = 254,
    bounds: list[tuple[torch.Tensor, float]] | None = None,
) -> torch.nn.Module:
    """``fp32`` converted to aihwkit's analog layers as the module docstring sets them; ``ranges``: each FP32
    layer's (module name's) input range; ``switches``: how many of :data:`SWITCHES`' changes (after the
    first row) apply; ``dac``: ``forward.inp_res`` (254 as the preset, 510 as this tool's DAC); ``bounds``:
    each layer's FP32 weight and ``out_bound``, for the fourth."""
    config = kit["config"]()
    config.mapping.max_input_size = rows
    config.mapping.max_output_size = 0
    config.mapping.weight_scaling_omega = 1.0
    config.mapping.weight_scaling_columnwise = True
    config.mapping.digital_bias = True
    forward = config.forward
    forward.inp_res = 510 if switches >= 5 else dac
    forward.out_res = 254 if adc else -1
    forward.out_bound = OUT_BOUND if adc else 0.0
    forward.out_noise = forward.w_noise = forward.ir_drop = 0.0
    forward.bound_management = kit["bound"].NONE
    forward.noise_management = kit["noise"].NONE
    config.pre_post.input_range.enable = True
    config.pre_post.input_range.learn_input_range = False
    noise = level_noise_model(kit["pcm"], switches >= 2) if switches >= 1 else kit["pcm"]
    config.noise_model = noise(g_max=25.0, read_noise_scale=0.0, prog_noise_scale=float(programming_noise))
    config.drift_compensation = kit["compensation"]() if compensation else None

    def per_layer(name: str, module: torch.nn.Module, layer_config):  # aihwkit's specific_rpu_config_fun
        weighted = isinstance(module, torch.nn.Conv2d | torch.nn.Linear)  # not the containers it converts
        if weighted and bounds is not None and switches >= 4 and adc:  # found by its weights (names differ)
            layer_config.forward.out_bound = next(
                bound
                for weight, bound in bounds
                if weight.shape == module.weight.shape and torch.equal(weight, module.weight)
            )
        return layer_config

    analog = kit["convert"](copy.deepcopy(fp32), config, specific_rpu_config_fun=per_layer).eval()
    for name, layer in analog.named_analog_layers():
        for tile in layer.analog_tiles():
            tile.set_input_range(ranges[name])
    return analog


def exact_compensation(analog: torch.nn.Module) -> None:
    """Every tile's drift compensation set to Σ|W(t0)| / Σ|W(t)| of its cells (no read through its ADC)."""
    for layer in analog.analog_layers():
        for tile in layer.analog_tiles():
            now = float(torch.as_tensor(tile.tile.get_weights()).abs().sum())
            tile.alpha = torch.tensor([float(tile.programmed_weights.abs().sum()) / now])


def run_aihwkit(kit: dict, fp32, ranges, images, labels, chips: range, times: list, **settings) -> dict:
    """aihwkit's accuracy per time and chip (``torch.manual_seed(chip)``): each chip programmed once, then
    drifted to every time."""
    exact = settings.get("switches", 0) >= 3 and settings.get("compensation", True)
    analog = aihwkit_model(kit, fp32, ranges, **settings)
    result: dict[str, list[float]] = {str(t): [] for t in times}
    for chip in chips:
        torch.manual_seed(chip)
        analog.program_analog_weights()
        for t in times:
            analog.drift_analog_weights(t)
            if exact:
                exact_compensation(analog)
            result[str(t)].append(accuracy(analog, images, labels)[0])
    return result


def aihwkit_weights(analog: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights an aihwkit chip computes with now: each tile's (drifted) weights with its digital column
    scales and its drift compensation, the tiles side by side along the inputs; per layer name."""
    return {
        name: torch.cat(
            [
                torch.as_tensor(tile.get_weights(apply_weight_scaling=True)[0]) * tile.alpha
                for tile in layer.analog_tiles()
            ],
            dim=1,
        )
        for name, layer in analog.named_analog_layers()
    }


def weight_errors(fp32: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """Per layer, how a chip's weights ``weights`` differ from the FP32 ones: the relative error energy
    ‖W - W₀‖² / ‖W₀‖² and the gain ⟨W, W₀⟩ / ‖W₀‖² (1: no overall scale error)."""
    result = {}
    for name, weight in weights.items():
        target = fp32[name].detach().reshape(weight.shape).double()
        energy = float((target**2).sum())
        result[name] = (
            float(((weight.double() - target) ** 2).sum()) / energy,
            float((weight.double() * target).sum()) / energy,
        )
    return result


def run_weights(
    kit, fp32, ranges, model, preset, steps, names, images, labels, chips: range, times
) -> tuple[dict, dict]:
    """The tools' chips (aihwkit's when ``kit`` is given, and this tool's) as weights in the FP32 model: float
    activations, no DAC or ADC, so that only the weight models (programming noise, drift, compensation)
    differ. Accuracy per tool, time and chip; and per measure of :func:`weight_errors`, layer, tool and
    time, the chips' values."""
    analog = aihwkit_model(kit, fp32, ranges, rows=preset.rows, adc=False) if kit else None
    result: dict[str, dict[str, list[float]]] = (
        {"aihwkit": {}, "resnet8ptq": {}} if kit else {"resnet8ptq": {}}
    )
    targets = {name: module.weight for name, module in fp32.named_modules() if hasattr(module, "weight")}
    errors: dict = {"relative error energy": {}, "gain": {}}
    for chip in chips:
        if analog is not None:
            torch.manual_seed(chip)
            analog.program_analog_weights()
        for t in times:
            tools = [
                ("resnet8ptq", our_weights(model, replace(preset, t_inference=float(t)), chip, steps, names))
            ]
            if analog is not None:
                analog.drift_analog_weights(t)
                tools.insert(0, ("aihwkit", aihwkit_weights(analog)))
            for tool, weights in tools:
                result[tool].setdefault(str(t), []).append(
                    accuracy(with_weights(fp32, weights), images, labels)[0]
                )
                for layer, measures in weight_errors(targets, weights).items():
                    for measure, value in zip(errors, measures, strict=True):
                        by_time = errors[measure].setdefault(layer, {}).setdefault(tool, {})
                        by_time.setdefault(str(t), []).append(value)
    return result, errors


def table(results: dict) -> None:
    """The side-by-side tables: per configuration and time, each tool's mean ± std over its chips, the
    difference this tool - aihwkit and its standard error √(s₁²/n₁ + s₂²/n₂)."""
    meta = results.get("meta", {})
    print(
        f"\n{meta.get('images', '?')} test images; {meta.get('cpu', '?')}; commit {meta.get('commit', '?')}"
    )
    for part in ("preset", "drift", "weights"):
        configs = results.get(part, {})
        if not configs:
            continue
        labels = sorted({label for tools in configs.values() for label in tools if label != "aihwkit"})
        for label in labels or ["resnet8ptq"]:
            print(f"\n{part}: aihwkit {VERSION} and {label} (%, mean ± std over the chips)")
            print("| setting | t | aihwkit | this tool | difference ± SE | within 1 SE |")
            print("|---|---|---|---|---|---|")
            for config, tools in configs.items():
                theirs, ours = tools.get("aihwkit", {}), tools.get(label, {})
                for t in sorted(set(theirs) | set(ours), key=float):
                    print(
                        f"| {config} | {when(t)} | " + " | ".join(compared(theirs.get(t), ours.get(t))) + " |"
                    )
    decomposition(results)
    dac_part(results)
    weight_error_table(results)
    for part, adc in (("switches", "8-bit ADC"), ("switches-ideal", "ideal ADC")):
        rows = results.get(part, {})
        if not rows:
            continue
        times = sorted({t for row in rows.values() for t in row.get("aihwkit", {})}, key=float)
        chips = sorted(next(iter(next(iter(rows.values()))["aihwkit"].values())))
        print(
            f"\n{part}: aihwkit ({adc}, 512 rows) changed one switch at a time "
            f"(%, mean ± std over {len(chips)} chips)"
        )
        print("| aihwkit with | " + " | ".join(f"t = {when(t)}" for t in times) + " |")
        print("|---|" + "---|" * len(times))
        for label, tools in [
            *rows.items(),
            ("this tool: pcm preset", results.get("preset", {}).get(adc, {})),
        ]:
            row = tools.get("aihwkit" if label in SWITCHES else "resnet8ptq")
            if row:  # this tool's row over the switches' chips only
                row = {t: {chip: row[t][chip] for chip in chips if chip in row[t]} for t in row}
                cells = ("{:.2f} ± {:.2f}".format(*summary(row[t])[:2]) if t in row else "" for t in times)
                print(f"| {label} | " + " | ".join(cells) + " |")


def paired(first: dict, second: dict, chips: list) -> tuple[float, float]:
    """Mean and standard error (percent) of ``first`` - ``second`` over ``chips``, chip by chip."""
    differences = 100 * np.array([first[chip] - second[chip] for chip in chips])
    return float(differences.mean()), float(differences.std(ddof=1) / np.sqrt(len(chips)))


def decomposition(results: dict) -> None:
    """The ideal-ADC chips' difference (this tool - aihwkit) split into the weights' part and each tool's
    device part: on the chips both parts ran, device = weights + (this tool's device - its weights) -
    (aihwkit's device - its weights) exactly; each tool's device - weights is paired (the same chips, as
    weights and as devices), so its standard error is small; the weights' difference is then taken over all
    the weights part's chips."""
    presets, weights = results.get("preset", {}), results.get("weights", {})
    weights = next(iter(weights.values()), {})
    our_devices = presets.get("ideal ADC", {})
    labels = [label for label in our_devices if label != "aihwkit" and label in weights]
    if "aihwkit" not in weights:
        return
    configs = [
        config for config, tools in presets.items() if config.startswith("ideal ADC") and "aihwkit" in tools
    ]
    for config, label in [(config, label) for config in configs for label in labels]:
        device = {"aihwkit": presets[config]["aihwkit"], label: our_devices[label]}
        print(f"\n{config}: this tool ({label}) - aihwkit, split (points; ± standard error)")
        print(
            "| t | chips | devices | their weights | this tool's device - weights "
            "| aihwkit's device - weights | weights, all chips | weights + device parts |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for t in sorted(device["aihwkit"], key=float):
            parts = [device["aihwkit"][t], device[label][t], weights["aihwkit"][t], weights[label][t]]
            chips = sorted(set.intersection(*(set(part) for part in parts)))
            if len(chips) < 2:
                continue
            devices, own_weights = (paired(parts[i + 1], parts[i], chips)[0] for i in (0, 2))
            (ours, ours_se), (theirs, theirs_se) = (paired(parts[i], parts[i + 2], chips) for i in (1, 0))
            whole, whole_se = difference(weights["aihwkit"][t], weights[label][t])
            print(
                f"| {when(t)} | {len(chips)} | {devices:+.2f} | {own_weights:+.2f} "
                f"| {ours:+.2f} ± {ours_se:.2f} | {theirs:+.2f} ± {theirs_se:.2f} "
                f"| {whole:+.2f} ± {whole_se:.2f} (n = {len(weights[label][t])}) "
                f"| {whole + ours - theirs:+.2f} ± {np.sqrt(whole_se**2 + ours_se**2 + theirs_se**2):.2f} |"
            )


def dac_part(results: dict) -> None:
    """What aihwkit's DAC resolution is worth: each configuration run with ``--dac`` against the same one
    without, aihwkit on the same chips (paired)."""
    rows = []
    for part in ("preset", "drift"):
        configs = results.get(part, {})
        for config, tools in configs.items():
            base, _, dac = config.partition(", DAC inp_res ")
            if not dac or "aihwkit" not in tools or "aihwkit" not in configs.get(base, {}):
                continue
            theirs, given = configs[base]["aihwkit"], tools["aihwkit"]
            for t in sorted(given, key=float):
                chips = sorted(set(given[t]) & set(theirs.get(t, {})))
                if len(chips) > 1:
                    mean, se = paired(given[t], theirs[t], chips)
                    rows.append(
                        f"| {part}: {base} | {dac} | {when(t)} | {len(chips)} | {mean:+.2f} ± {se:.2f} |"
                    )
    if rows:
        print("\naihwkit's DAC: inp_res N against 254, the same chips (points; ± standard error)")
        print("| setting | inp_res | t | chips | difference |")
        print("|---|---|---|---|---|")
        print("\n".join(rows))


def weight_error_table(results: dict) -> None:
    """Per layer and time, each tool's chips' mean relative weight error energy ‖W - W₀‖² / ‖W₀‖² and gain
    ⟨W, W₀⟩ / ‖W₀‖² against the FP32 weights (the weights part's chips), and the ratio of the errors."""
    errors = results.get("weight errors", {})
    if not errors:
        return
    mean = lambda values: float(np.mean(list(values.values())))  # noqa: E731
    for measure, layers in errors.items():
        tools = next(iter(layers.values()))
        times = sorted(next(iter(tools.values())), key=float)
        for label in [label for label in tools if label != "aihwkit"]:
            print(f"\nweights: {measure} against FP32, aihwkit / {label} (mean over the chips)")
            print("| layer | " + " | ".join(f"t = {when(t)}" for t in times) + " |")
            print("|---|" + "---|" * len(times))
            for layer, by_tool in layers.items():
                cells = []
                for t in times:
                    theirs, ours = mean(by_tool["aihwkit"][t]), mean(by_tool[label][t])
                    ratio = f" ({ours / theirs:.3f}x)" if measure == "relative error energy" else ""
                    cells.append(f"{theirs:.4f} / {ours:.4f}{ratio}")
                print(f"| {layer} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000, help="first N test images (10000: all)")
    parser.add_argument("--chips", type=int, default=10)
    parser.add_argument(
        "--first-chip", type=int, default=0, help="chips --first-chip on (seeds): more chips in another file"
    )
    parser.add_argument("--times", type=listed(float), default=[0, 3600, 86400, 31536000])
    parser.add_argument("--parts", type=listed(str), default=["preset", "drift", "weights", "switches"])
    parser.add_argument("--tools", type=listed(str), default=["aihwkit", "resnet8ptq"])
    parser.add_argument("--save", type=Path, help="merge the accuracies into this JSON file")
    parser.add_argument(
        "--preset-adcs", type=listed(str), default=["ideal", "8"], help="the preset part's ADCs: ideal, 8"
    )
    parser.add_argument(
        "--dac",
        type=int,
        default=254,
        help="aihwkit's forward.inp_res in the preset and drift parts: 254 (StandardHWATrainingPreset's), or "
        "510 (255 steps over a non-negative input, as this tool's 8-bit DAC); this tool's runs do not change",
    )
    parser.add_argument(
        "--drift-adcs", type=listed(str), default=["8", "ideal"], help="the drift part's ADCs: 8, ideal"
    )
    parser.add_argument(
        "--drift-compensation",
        type=listed(str),
        default=["no", "with"],
        help="the drift part's compensation: no, with",
    )
    parser.add_argument(
        "--weight-noise-model",
        help="this tool's device.weight_noise_model instead of the preset's (pcm_signed)",
    )
    parser.add_argument("--as", dest="label", default="resnet8ptq", help="this tool's name in the results")
    parser.add_argument("--table", type=Path, nargs="+", help="print the tables of saved files; run nothing")
    parser.add_argument(
        "--report", type=Path, help="with --table: write the tables to this markdown file too"
    )
    args = parser.parse_args()
    if args.table:
        results, metas = load_tables(args.table)  # files of other chips add chips, of other parts parts
        table(results)
        if args.report:
            write_report(args.report, "The `pcm` preset beside aihwkit 1.2.0", table, results, metas)
        return
    unknown = (
        (set(args.parts) - {"preset", "drift", "weights", "switches", "switches-ideal"})
        | (set(args.drift_compensation) - {"no", "with"})
        | (set(args.tools) - {"aihwkit", "resnet8ptq"})
    )
    if unknown:
        sys.exit(f"unknown parts, tools or compensation: {', '.join(sorted(unknown))}")
    args.drift_adcs = [adc == "8" for adc in args.drift_adcs]
    args.preset_adcs = [adc == "8" for adc in args.preset_adcs]
    args.our_settings = {"weight_noise_model": args.weight_noise_model} if args.weight_noise_model else {}
    torch.set_num_threads(1)
    keep_freed_memory()  # the allocator a run sets (resnet8ptq/memory.py): freed blocks kept, not unmapped
    started = time.perf_counter()
    kit = import_aihwkit() if "aihwkit" in args.tools else {}
    given = inputs()
    images, labels = given.images[: args.images], given.labels[: args.images]
    cpu = detect().label
    commit = os.popen(f"git -C {REPO} rev-parse --short HEAD").read().strip()
    print(f"CPU: {cpu}; torch {torch.__version__}, 1 thread; aihwkit {VERSION if kit else '-'}; "
          f"{len(images)} test images; chips {args.first_chip}..{args.first_chip + args.chips - 1}; "
          f"times {args.times}", flush=True)  # fmt: skip
    chips = range(args.first_chip, args.first_chip + args.chips)
    meta = run_meta(images=len(images), cpu=cpu, commit=commit, chips=args.chips)
    meta["first_chip"] = chips.start
    saved = json.loads(args.save.read_text()) if args.save and args.save.exists() else {}
    if saved and (saved["meta"]["images"], saved["meta"]["chips"], saved["meta"].get("first_chip", 0)) != (
        len(images),
        args.chips,
        chips.start,
    ):
        sys.exit(f"{args.save} holds results of other images or chips: {saved['meta']}")  # fmt: skip
    results: dict = deep_merge(saved, {"meta": meta})  # a preset's chips already run are reused
    with tempfile.TemporaryDirectory() as tmp:
        canonical = canonical_model(Path(tmp))
        fp32 = onnx_to_torch(canonical.onnx_path)
        model = integer_model(quantized_int8(canonical, given.calibration, Path(tmp)))
    modules = {n: m for n, m in fp32.named_modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)}
    pairs = pair_layers(model, modules)
    names = {id(module): name for name, module in modules.items()}
    ranges = {names[id(pairs[conv.name])]: input_range(conv) for conv in model.convs}
    test = torch.from_numpy(images)
    profiles: dict = {}

    def record(part: str, config: str, tool: str, accuracies: dict, seconds: float) -> None:
        results.setdefault(part, {}).setdefault(config, {})[tool] = accuracies
        means = ", ".join(
            f"t={float(t):g}: {summary(v)[0]:.2f} ± {summary(v)[1]:.2f}" for t, v in accuracies.items()
        )
        print(f"{part:8s} {config:40s} {tool:10s} {means}  ({seconds:.0f} s)", flush=True)
        save(args.save, {part: {config: {tool: accuracies}}, "meta": results["meta"]})

    def both(part: str, config: str, rows: int, adc: bool, **settings) -> None:
        for tool in args.tools:
            start = time.perf_counter()
            if tool == "aihwkit":
                accuracies = run_aihwkit(kit, fp32, ranges, test, labels, chips, args.times, rows=rows,
                                         adc=adc, **settings)  # fmt: skip
            else:
                device = chip_preset(
                    "pcm",
                    rows=rows,
                    adc_bits=8 if adc else None,
                    **(
                        args.our_settings if settings.get("programming_noise", True) else NO_PROGRAMMING_NOISE
                    ),
                    drift_compensation=settings.get("compensation", True),
                    noise_seeds=args.chips,
                )
                accuracies = run_ours(model, device, given.calibration, images, labels, chips, args.times,
                                      profiles)  # fmt: skip
            record(
                part,
                config,
                tool if tool == "aihwkit" else args.label,
                accuracies,
                time.perf_counter() - start,
            )

    if "preset" in args.parts:
        for adc in args.preset_adcs:
            name = ("8-bit ADC" if adc else "ideal ADC") + (
                f", DAC inp_res {args.dac}" if args.dac != 254 else ""
            )
            both("preset", name, 512, adc, dac=args.dac)
    if "drift" in args.parts:
        for adc in args.drift_adcs:
            for with_ in args.drift_compensation:
                kind, dac = (
                    "8-bit" if adc else "ideal",
                    f", DAC inp_res {args.dac}" if args.dac != 254 else "",
                )
                name = f"128 rows, {kind} ADC, {with_} compensation{dac}"
                both(
                    "drift",
                    name,
                    128,
                    adc,
                    programming_noise=False,
                    compensation=with_ == "with",
                    dac=args.dac,
                )
    if "weights" in args.parts:
        start = time.perf_counter()
        preset = chip_preset("pcm", adc_bits=None, noise_seeds=args.chips, **args.our_settings)
        layer_names = {conv.name: names[id(pairs[conv.name])] for conv in model.convs}
        both_weights, errors = run_weights(
            kit, fp32, ranges, model, preset, {}, layer_names, test, labels, chips, args.times
        )
        labelled = {"aihwkit": "aihwkit", "resnet8ptq": args.label}
        for tool, accuracies in both_weights.items():
            record(
                "weights",
                "preset's chips as FP32 weights",
                labelled[tool],
                accuracies,
                time.perf_counter() - start,
            )
        errors = {
            measure: {layer: {labelled[t]: v for t, v in tools.items()} for layer, tools in layers.items()}
            for measure, layers in errors.items()
        }
        results["weight errors"] = errors
        save(args.save, {"weight errors": errors, "meta": results["meta"]})
    switched = [part for part in ("switches", "switches-ideal") if part in args.parts]
    if switched and "aihwkit" in args.tools:
        preset = chip_preset("pcm", noise_seeds=args.chips)
        steps = adc_steps(model, preset, given.calibration, profiles)
        calibrated = out_bounds(model, steps, pairs, 512)
        bounds = [(pairs[name].weight, median) for name, (median, _, _) in calibrated.items()]
    for part in switched if "aihwkit" in args.tools else []:
        adc = part == "switches"
        baseline = results.get("preset", {}).get("8-bit ADC" if adc else "ideal ADC", {}).get("aihwkit")
        for count, name in enumerate(SWITCHES):
            if count == 4 and not adc:
                continue  # no ADC range to calibrate
            start = time.perf_counter()
            if count == 0 and baseline:
                accuracies = baseline  # the same chips: not run twice
            else:
                accuracies = run_aihwkit(kit, fp32, ranges, test, labels, chips, args.times, rows=512,
                                         adc=adc, switches=count, bounds=bounds)  # fmt: skip
            record(part, name, "aihwkit", accuracies, time.perf_counter() - start)
    table(by_chip(results))
    print(f"Total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

"""The ``sonos`` chip preset (conf/device/chip/sonos.yaml) beside Sandia's CrossSim 3.2.0 itself (issue 62):
the same FP32 ResNet8, test images, times since programming and number of chips; each tool's chips as the
weights of the FP32 model, then this tool's whole device. Outside CI.

CrossSim (BSD-3, numpy and scipy only) is installed on first use with ``pip install --no-deps --target``
into ~/.cache/resnet8ptq-crosssim/ from ``--crosssim`` (default: its 3.2.0 release on GitHub; a local
checkout's path works too) and put on sys.path beside the project.

CrossSim, as the preset cites it: ``simulator/configs/SONOS-TCAS.json`` as shipped (a balanced core, 8-bit
weights on a pair of 7-bit cells, 1152 x 256 arrays, SONOS programming error and drift, no read noise), with
``xbar.device.Vread = 0.06`` V as CrossSim's DNN inference script sets it for SONOS (``inference_net.py``:
Imax = 0.06 V / 35 kΩ = 1714 nA, within the 1800 nA its drift model accepts) and ``xbar.device.time`` the
time since programming in days. Each layer's matrix (outputs x inputs·kh·kw) is one ``AnalogCore``:
CrossSim maps it with **one scale per layer** (``mapping.weights``: the matrix's largest |w|, clipped,
percentile 1.0), quantizes each cell to 128 levels and draws the whole error at time t from the target
(``IDevice.apply_write_error``: the programming error at t = 0, ``SONOS.drift_error(t)`` after it, which
holds the spread at t; each cell clipped at 0). ``AnalogCore.get_matrix()`` reads the programmed matrix
with its errors back in weight units; without read noise, DAC, ADC or parasitics CrossSim's MVM is that
matrix times the input (checked here on every layer of the first chip: ``matvec`` against ``get_matrix() @
x``), so the FP32 model with these weights is CrossSim's inference with ideal converters.
``np.random.seed(chip)`` before a chip's layers; every time point is a new draw of the same targets (as
CrossSim reprograms a core for each ``time``).

This tool: the preset's chips (noise seeds 0..chips-1) of the int8 model quantized **per tensor**
(CrossSim's mapping: one scale per layer) and **per channel** (a default device run's model: one scale per
column, more cells near the top where SONOS's relative error is smallest), each as weights of the FP32
model (``weights``), and the per-channel model on this tool's whole device (``device``: 8-bit DAC, int8
activations requantized after every layer, an ideal and the preset's 8-bit ADC with calibrated ranges).

Usage: RESNET8PTQ_ASSETS=../shared .venv/bin/python bench/crosssim_sonos.py [--images 2000] [--chips 30] \
    [--times 0,3600,86400,432000] [--parts weights,device] [--crosssim PATH_OR_URL] \
    [--config SONOS-TCAS.json] [--save FILE.json] [--table FILE.json ...]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _analog import (  # noqa: E402
    accuracy,
    chip_preset,
    compared,
    install_target,
    listed,
    load_tables,
    our_weights,
    pair_layers,
    run_meta,
    run_ours,
    save,
    when,
    with_weights,
    write_report,
)
from _int8 import canonical_model, inputs, quantized_int8  # noqa: E402

from resnet8ptq.backends.onnx.integer import integer_model  # noqa: E402
from resnet8ptq.backends.torch.convert import onnx_to_torch  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402
from resnet8ptq.memory import keep_freed_memory  # noqa: E402

VERSION = "3.2.0"
RELEASE = "0a2eb1eda183326ef4d98d792995c721105d3726"  # "3.2.0 Release (#38)" on sandialabs/cross-sim
SOURCE = f"crosssim @ git+https://github.com/sandialabs/cross-sim@{RELEASE}"
CONFIG_URL = (
    f"https://raw.githubusercontent.com/sandialabs/cross-sim/{RELEASE}/simulator/configs/SONOS-TCAS.json"
)
SITE = Path.home() / ".cache" / "resnet8ptq-crosssim" / f"crosssim-{VERSION}"
V_READ = 0.06  # V: applications/dnn/inference/interface/inference_net.py for SONOS error models
SECONDS_PER_DAY = 86_400.0
CROSSSIM = "crosssim"


def crosssim_parameters(source: str, config: Path | None):
    """CrossSim's SONOS-TCAS parameters with the DNN scripts' SONOS read voltage (CrossSim installed first).
    CrossSim's package leaves its configs out: ``config``, else the file of the release, downloaded once."""
    install_target(source, SITE)
    from simulator import CrossSimParameters

    if config is None:
        config = SITE.parent / f"SONOS-TCAS-{RELEASE[:7]}.json"
        if not config.exists():
            print(f"Downloading {CONFIG_URL}", flush=True)
            with urllib.request.urlopen(CONFIG_URL, timeout=60) as response:
                text = response.read().decode()
            partial = config.with_suffix(".partial")
            partial.write_text(text)
            partial.replace(config)
    parameters = CrossSimParameters.from_json(str(config))
    parameters.xbar.device.Vread = V_READ
    return parameters


def crosssim_weights(parameters, fp32: torch.nn.Module, days: float) -> dict[str, torch.Tensor]:
    """One CrossSim chip ``days`` after programming (from NumPy's global generator): per analog layer, the
    matrix an ``AnalogCore`` of SONOS-TCAS holds, with its errors, in weight units."""
    from simulator.cores.analog_core import AnalogCore

    parameters = parameters.copy()
    parameters.xbar.device.time = days
    weights = {}
    for name, layer in fp32.named_modules():
        if isinstance(layer, torch.nn.Conv2d | torch.nn.Linear):
            weight = layer.weight.detach().numpy().astype(np.float64)
            core = AnalogCore(weight.reshape(len(weight), -1), parameters)
            weights[name] = torch.from_numpy(np.asarray(core.get_matrix()))
    return weights


def check_ideal_mvm(parameters, fp32: torch.nn.Module) -> None:
    """CrossSim's MVM equals ``get_matrix() @ x`` with ideal converters and no read noise (module docstring):
    checked on every layer of a chip with random inputs; exits if not."""
    from simulator.cores.analog_core import AnalogCore

    parameters = parameters.copy()
    for converters in (parameters.xbar.adc.mvm, parameters.xbar.adc.vmm):
        converters.bits = 0
    for converters in (parameters.xbar.dac.mvm, parameters.xbar.dac.vmm):
        converters.bits, converters.input_bitslicing = 0, False
    np.random.seed(0)
    for name, layer in fp32.named_modules():
        if isinstance(layer, torch.nn.Conv2d | torch.nn.Linear):
            weight = layer.weight.detach().numpy().astype(np.float64)
            core = AnalogCore(weight.reshape(len(weight), -1), parameters)
            x = np.random.default_rng(1).uniform(0, 1, weight.reshape(len(weight), -1).shape[1])
            error = np.abs(np.asarray(core.matvec(x)) - np.asarray(core.get_matrix()) @ x).max()
            if error > 1e-9 * np.abs(weight).sum():
                sys.exit(f"{name}: CrossSim's MVM is not get_matrix() @ x ({error:.3g})")


def run_weights(parameters, fp32, models, images, labels, chips: int, times: list[float]) -> dict:
    """Accuracy per tool, time and chip of the FP32 model holding each tool's chips: CrossSim's, and this
    tool's for each int8 model in ``models`` (label: (integer model, integer layer -> FP32 layer))."""
    result: dict[str, dict[str, list[float]]] = {CROSSSIM: {}, **{label: {} for label in models}}
    preset = chip_preset("sonos", adc_bits=None, noise_seeds=chips)
    for chip in range(chips):
        for t in times:
            np.random.seed(chip)
            tools = {CROSSSIM: crosssim_weights(parameters, fp32, t / SECONDS_PER_DAY)}
            for label, (model, names) in models.items():
                tools[label] = our_weights(model, replace(preset, t_inference=float(t)), chip, {}, names)
            for tool, weights in tools.items():
                result[tool].setdefault(str(t), []).append(
                    accuracy(with_weights(fp32, weights), images, labels)[0]
                )
        print(f"  chip {chip + 1}/{chips}", end="\r", flush=True)
    return result


def table(results: dict) -> None:
    """Per part and setting, CrossSim's chips beside each of this tool's: mean ± std over the chips, the
    difference and its standard error."""
    meta = results.get("meta", {})
    print(
        f"\n{meta.get('images', '?')} test images; {meta.get('chips', '?')} chips; {meta.get('cpu', '?')}; "
        f"commit {meta.get('commit', '?')}"
    )
    print(f"\n| part | this tool | t | CrossSim {VERSION} | this tool | difference ± SE | within 1 SE |")
    print("|---|---|---|---|---|---|---|")
    theirs = results.get("weights", {}).get(CROSSSIM, {})
    for part in ("weights", "device"):
        for label, ours in results.get(part, {}).items():
            if label == CROSSSIM:
                continue
            for t in sorted(ours, key=float):
                cells = compared(theirs.get(t), ours[t])
                print(f"| {part} | {label} | {when(t)} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000, help="first N test images (10000: all)")
    parser.add_argument("--chips", type=int, default=30)
    parser.add_argument("--times", type=listed(float), default=[0, 3600, 86400, 432000], help="seconds")
    parser.add_argument("--parts", type=listed(str), default=["weights", "device"])
    parser.add_argument("--crosssim", default=SOURCE, help="pip requirement or path of CrossSim 3.2.0")
    parser.add_argument(
        "--config", type=Path, help="CrossSim's simulator/configs/SONOS-TCAS.json (default: the release's)"
    )
    parser.add_argument("--save", type=Path, help="merge the accuracies into this JSON file")
    parser.add_argument("--table", type=Path, nargs="+", help="print the table of saved files; run nothing")
    parser.add_argument(
        "--report", type=Path, help="with --table: write the tables to this markdown file too"
    )
    args = parser.parse_args()
    if args.table:
        results, metas = load_tables(args.table)  # files of other chips add chips, of other parts parts
        table(results)
        if args.report:
            write_report(args.report, "The `sonos` preset beside CrossSim 3.2.0", table, results, metas)
        return
    unknown = set(args.parts) - {"weights", "device"}
    if unknown:
        sys.exit(f"unknown parts: {', '.join(sorted(unknown))} (weights, device)")
    if max(args.times) > 5 * SECONDS_PER_DAY:
        print("Past 5 days both tools extrapolate CrossSim's fits, which CrossSim does not vouch for.")
    torch.set_num_threads(1)
    keep_freed_memory()  # the allocator a run sets (resnet8ptq/memory.py)
    started = time.perf_counter()
    parameters = crosssim_parameters(args.crosssim, args.config)
    given = inputs()
    images, labels = given.images[: args.images], given.labels[: args.images]
    commit = os.popen(f"git -C {REPO} rev-parse --short HEAD").read().strip()
    meta = run_meta(images=len(images), cpu=detect().label, commit=commit, chips=args.chips)
    print(f"CPU: {meta['cpu']}; torch {torch.__version__}, 1 thread; CrossSim {VERSION}; {len(images)} test "
          f"images; {args.chips} chips; times {args.times} s", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        canonical = canonical_model(Path(tmp))
        fp32 = onnx_to_torch(canonical.onnx_path)
        models = {
            f"resnet8ptq {kind}": integer_model(quantized_int8(canonical, given.calibration, Path(tmp), per))
            for kind, per in (("per-tensor", False), ("per-channel", True))
        }
    check_ideal_mvm(parameters, fp32)
    layers = {n: m for n, m in fp32.named_modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)}
    named = {}
    for label, model in models.items():
        pairs = pair_layers(model, copy.copy(layers))
        names = {id(module): name for name, module in layers.items()}
        named[label] = (model, {conv.name: names[id(pairs[conv.name])] for conv in model.convs})
    test = torch.from_numpy(images)
    results: dict = {"meta": meta}

    def record(part: str, label: str, accuracies: dict, seconds: float) -> None:
        results.setdefault(part, {})[label] = accuracies
        print(f"{part:8s} {label:32s} ({seconds:.0f} s)", flush=True)
        save(args.save, {part: {label: accuracies}, "meta": meta})

    if "weights" in args.parts:
        start = time.perf_counter()
        by_tool = run_weights(parameters, fp32, named, test, labels, args.chips, args.times)
        for label, accuracies in by_tool.items():
            record("weights", label, accuracies, time.perf_counter() - start)
    if "device" in args.parts:
        model = models["resnet8ptq per-channel"]
        profiles: dict = {}
        for adc_bits, kind in ((None, "ideal ADC"), (8, "8-bit ADC")):
            start = time.perf_counter()
            device = chip_preset("sonos", adc_bits=adc_bits, noise_seeds=args.chips)
            accuracies = run_ours(
                model, device, given.calibration, images, labels, range(args.chips), args.times, profiles
            )
            record("device", f"resnet8ptq per-channel, {kind}", accuracies, time.perf_counter() - start)
    table(results)
    print(f"Total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

"""The same FP32 ResNet8 on IBM's aihwkit-lightning 2.1.0 (its pure-PyTorch CPU path, no triton) and on this
tool's crossbar model (resnet8ptq/device/cim.py), with settings matched where the two tools' semantics allow,
each tool's accuracy printed on the same test images. Outside CI (issue 41). aihwkit-lightning is installed
on first use with ``pip install --no-deps --target`` into ~/.cache/resnet8ptq-aihwkit/ (it pins torch
2.13.0; its modules run on the project's torch 2.14.1), then put on sys.path: the same interpreter, torch and
numpy as the project, no second venv. This tool's cells: the int8 per-channel MinMax integer model (ONNX
Runtime, 100 training images a class, seed 42: a run's defaults, as bench/adc_map.py), ADC ranges ``max``
per layer with a symmetric window and ``mse`` per column with an asymmetric window, ``pow2`` steps.

Matched (aihwkit-lightning names; its source: src/aihwkit_lightning/nn/modules/torch_utils/torch_linear.py,
quant_utils.py, simulator/parameters/io.py, nn/modules/conv.py):

* tiles: ``mapping.max_input_size = rows`` (128): both split the C_in·kh·kw terms, in the same (c, kh, kw)
  order, into the same equal tiles (576 -> 116 + 4 x 115) and read every tile's partial sum on its own ADC;
* ADC: ``forward.out_res = 2^b - 2`` (its b-bit convention, docs/source/user_guide.rst): step = 2·bound /
  out_res, round half to even, clamped to ±bound, i.e. codes ±(2^(b-1) - 1): this tool's ``symmetric`` window;
  the bound is ``input_range(tile) · out_bound · max|w|`` with max|w| over the tile's rows of each column
  (``clip.type = LAYER_GAUSSIAN_PER_CHANNEL`` makes it per column; the clip itself only runs in
  ``AnalogOptimizer.step``, never here), one ``out_bound`` per layer;
* DAC: ``forward.inp_res = 2^8 - 2`` (its 8-bit convention: codes ±127 over ±input_range, so 0..127 for the
  non-negative inputs here), the input range of every tile the activation range this tool's int8 quantizer
  calibrated (scale · (qmax - zero point), the same calibration images; aihwkit-lightning's own calibration,
  ``calibrate_input_ranges``, would set one per tile); ``--dac-levels 510`` gives this tool's input grid
  exactly (x - x_zp in 0..255);
* weights: 8 bits per column, ``modifier.quantization_type = DISCRETIZE_PER_CHANNEL``, ``res = 2^8 - 2``;
* no noise: ``out_noise = 0``, no weight noise, eval mode (no input range learning);
* fixed ``out_bound`` values beside the calibrated ones: its own default, 0 (no bound), is refused with an ADC
  (``out_res > 0``), so the grid spans 0.25 to 12 (12: the user guide's example);
* this tool's calibrated ADC full scale as ``out_bound``: this tool reads integer partial sums
  Σ (x - x_zp)(w - w_zp) = p / (s_x · s_w[c]) for the real partial sum p; its ADC group g covers
  [code_min · step, code_max · step]; the symmetric bound holding that window is B = max(|code_min|,
  |code_max|) · step (integer units), s_x · s_w[c] · B in real units, so the exact ``out_bound`` of tile t and
  column c is B · s_x · s_w[c] / (input_range · max|w[c, tile t]|) (= B / (255 · 127) where the tile holds
  the column's largest weight, as the int8 scales are max|w[c]| / 127 and input_range / 255). One scalar per
  layer can be set: the median of these over the layer's tiles and columns (exact for ``max-layer-sym`` in
  single-tile layers).

Not matched: aihwkit-lightning runs the FP32 model with float activations between layers (residual adds,
pooling, the bias and the classifier in FP32; only the tiles' inputs (DAC) are quantized), weights
quantized per (tile, column); this tool runs the int8 per-channel MinMax integer model (8-bit activations
requantized after every layer, int32 bias, weights per column), integer partial sums, ADC steps of a power
of two (``pow2``) and, for ``asymmetric`` windows, 2^b codes over a calibrated (low, high) that a symmetric
±bound cannot express; per-column or per-tile ADC ranges collapse to one ``out_bound`` per layer there.

Usage: RESNET8PTQ_ASSETS=../shared .venv/bin/python bench/aihwkit_lightning.py [--images 2000] \
    [--bits 4,5,6,8] [--out-bounds 0.25,0.5,1,2,4,12] [--dac-levels 254] [--rows 128] [--skip-ours]
One thread. The default grid on 2,000 images took 12.5 minutes on 2 cores beside two other jobs (an
aihwkit-lightning cell 17-22 s, one of this tool 7 s); all 10,000 images take about 5 times as long.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _analog import accuracy, input_range, install_target, listed, out_bounds, pair_layers  # noqa: E402
from _int8 import canonical_model, inputs, quantized_int8  # noqa: E402  (bench/_int8.py)

from resnet8ptq.backends.onnx.integer import integer_model  # noqa: E402
from resnet8ptq.backends.torch.convert import onnx_to_torch  # noqa: E402
from resnet8ptq.device.config import DeviceConfig  # noqa: E402
from resnet8ptq.device.evaluate import adc_steps, arithmetic  # noqa: E402
from resnet8ptq.device.executor import execute, predictions  # noqa: E402
from resnet8ptq.hardware import detect  # noqa: E402

VERSION = "2.1.0"
SITE = Path.home() / ".cache" / "resnet8ptq-aihwkit" / f"site-packages-{VERSION}"
"""aihwkit-lightning installed with ``--no-deps`` (it pins torch 2.13.0; its modules run on the project's
torch) into a folder put on sys.path: the project's interpreter, torch and numpy, no second venv. Its other
dependencies, tqdm and typing_extensions, are the project's."""

CELLS = {"max-layer-sym": ("max", "layer", "symmetric"), "mse-column-asym": ("mse", "column", "asymmetric")}
"""This tool's ADC range settings compared: (adc_range, adc_granularity, adc_window)."""

FP32_CORRECT = 8719
"""The FP32 model's correct test images (shared/README.md)."""


def import_lightning():
    """aihwkit_lightning's modules, installed first into :data:`SITE` if needed."""
    install_target(f"aihwkit-lightning=={VERSION}", SITE)
    os.environ.pop("AIHWKIT_USE_TRITON", None)  # its pure-PyTorch path
    with contextlib.redirect_stdout(io.StringIO()):  # "Could not import triton_utils...": expected here
        import aihwkit_lightning.nn.modules.conv as conv
        from aihwkit_lightning.nn.conversion import convert_to_analog
        from aihwkit_lightning.simulator.configs import (
            TorchInferenceRPUConfig,
            WeightClipType,
            WeightQuantizationType,
        )
    installed = importlib.metadata.version("aihwkit-lightning")
    if installed != VERSION or conv.TRITON_AVAIL:
        sys.exit(
            f"Expected aihwkit-lightning {VERSION} without triton: {installed}, triton {conv.TRITON_AVAIL}"
        )
    return convert_to_analog, TorchInferenceRPUConfig, WeightClipType, WeightQuantizationType


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000, help="first N test images (10000: all)")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--bits", type=listed(int), default=[4, 5, 6, 8])
    parser.add_argument("--out-bounds", type=listed(float), default=[0.25, 0.5, 1, 2, 4, 12])
    parser.add_argument("--dac-levels", type=listed(int), default=[254], help="inp_res: 254 (8 bits), 510")
    parser.add_argument("--skip-ours", action="store_true", help="only aihwkit-lightning")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    convert_to_analog, RPUConfig, ClipType, QuantizationType = import_lightning()
    given = inputs()
    all_images, all_labels, calibration = given.images, given.labels, given.calibration
    images, labels = all_images[: args.images], all_labels[: args.images]
    print(f"CPU: {detect().cpu}; torch {torch.__version__}, 1 thread; aihwkit-lightning {VERSION}; "
          f"{len(images)} test images; rows {args.rows}")  # fmt: skip
    ours: dict[tuple[int, str], float] = {}
    theirs: dict[tuple, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        canonical = canonical_model(cache)
        fp32 = onnx_to_torch(canonical.onnx_path)
        fp32_accuracy, _ = accuracy(fp32, torch.from_numpy(all_images), all_labels)
        print(f"FP32 torch model: {100 * fp32_accuracy:.2f} % on all {len(all_images)} test images")
        if len(all_images) == 10_000 and round(fp32_accuracy * 10_000) != FP32_CORRECT:
            sys.exit(f"expected {FP32_CORRECT / 100:.2f} % FP32: not the model of shared/README.md")
        model = integer_model(quantized_int8(canonical, calibration, cache))
    reference = predictions(model, execute(model, images)[0])
    print(
        f"this tool, integer device (ideal crossbar): {100 * np.mean(reference == labels):.2f} %", flush=True
    )
    profiles: dict = {}
    steps: dict[tuple[int, str], dict] = {}
    for bits in args.bits:
        for cell, (rule, granularity, window) in CELLS.items():
            device = DeviceConfig(kind="cim", rows=args.rows, adc_bits=bits, adc_range=rule,
                                  adc_granularity=granularity, adc_window=window)  # fmt: skip
            steps[bits, cell] = adc_steps(model, device, calibration, profiles)
            if args.skip_ours:
                continue
            start = time.perf_counter()
            logits, _ = execute(
                model, images, arithmetic(device, 0, steps[bits, cell]), device.images_per_step
            )
            ours[bits, cell] = float(np.mean(predictions(model, logits) == labels))
            print(f"this tool {bits}-bit ADC {cell:16s} {100 * ours[bits, cell]:6.2f} %  "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip

    config = RPUConfig()
    config.mapping.max_input_size = args.rows
    config.forward.out_noise = 0.0
    # per-column out_bound; the clip itself (sigma) runs in AnalogOptimizer.step only, never here
    config.clip.type = ClipType.LAYER_GAUSSIAN_PER_CHANNEL
    config.clip.sigma = 2.5
    config.modifier.quantization_type = QuantizationType.DISCRETIZE_PER_CHANNEL
    config.modifier.res = 2**8 - 2
    config.pre_post.input_range.enable = True
    config.pre_post.input_range.learn_input_range = False
    analog = convert_to_analog(fp32, config).eval()
    pairs = pair_layers(model, dict(analog.named_analog_layers()))
    for conv in model.convs:
        pairs[conv.name].input_range.data.fill_(input_range(conv))
    test = torch.from_numpy(images)
    fp32_on_test, fp32_predicted = accuracy(fp32, test, labels)
    print(f"FP32 torch model on these {len(images)} test images: {100 * fp32_on_test:.2f} %")
    calibrated = {key: out_bounds(model, value, pairs, args.rows) for key, value in steps.items()}
    for (bits, cell), bounds in calibrated.items():
        medians = " ".join(f"{median:.3g}" for median, _, _ in bounds.values())
        spread = max(high / low for _, low, high in bounds.values())
        print(f"out_bound from this tool's {cell} {bits}-bit ADC, per layer: {medians} "
              f"(exact per-column values within a layer up to {spread:.1f}x apart)")  # fmt: skip

    def run(key: tuple, dac: int, bits: int | None, bounds: dict[str, float], name: str) -> None:
        for conv in model.convs:
            forward = pairs[conv.name].rpu_config.forward
            forward.inp_res = dac
            forward.out_res = 2**bits - 2 if bits else -1
            forward.out_bound = bounds[conv.name] if bits else 0.0
        start = time.perf_counter()
        theirs[key], predicted = accuracy(analog, test, labels)
        differ, seconds = int(np.sum(predicted != fp32_predicted)), time.perf_counter() - start
        print(f"aihwkit-lightning inp_res={dac} {name:40s} {100 * theirs[key]:6.2f} %  "
              f"({differ} predictions differ from FP32; {seconds:.0f} s)", flush=True)  # fmt: skip

    for dac in args.dac_levels:
        run((dac, None, "no ADC"), dac, None, {}, "no ADC")
        for bits in args.bits:
            for bound in args.out_bounds:
                run(
                    (dac, bits, bound),
                    dac,
                    bits,
                    dict.fromkeys(pairs, bound),
                    f"{bits}-bit ADC, out_bound {bound:g}",
                )
            for cell in CELLS:
                bounds = {name: b[0] for name, b in calibrated[bits, cell].items()}
                run((dac, bits, cell), dac, bits, bounds, f"{bits}-bit ADC, out_bound <- {cell}")

    print(
        f"\nAccuracy (%) on {len(images)} test images, rows {args.rows}, 8-bit weights and inputs, no noise:"
    )
    header = [f"ob={bound:g}" for bound in args.out_bounds] + [f"ob<-{cell}" for cell in CELLS]
    for dac in args.dac_levels:
        print(f"aihwkit-lightning inp_res={dac} (no ADC: {100 * theirs[dac, None, 'no ADC']:.2f})"
              + ("" if args.skip_ours else "  |  this tool"))  # fmt: skip
        print("| bits | " + " | ".join(header) + ("" if args.skip_ours else " | " + " | ".join(CELLS)) + " |")
        for bits in args.bits:
            cells = [theirs[dac, bits, bound] for bound in args.out_bounds] + [
                theirs[dac, bits, c] for c in CELLS
            ]
            cells += [] if args.skip_ours else [ours[bits, cell] for cell in CELLS]
            print(f"| {bits} | " + " | ".join(f"{100 * value:.2f}" for value in cells) + " |")
    print(f"Total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

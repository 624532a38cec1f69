"""What a hardware team checks a design against: a quantized model's integer parameters, layer by layer, and
golden vectors (the exact integers the ideal integer device computes), written as plain NumPy/JSON/CSV.

Files (``device/`` in a run's artifacts):

* ``integer_model.json``: the model input's quantization and rounding, the requantization scheme, and every
  layer in execution order: kind, tensors read and written, quantizations, stride/padding, clamp, rounding,
  and the keys of its arrays in ``integer_model.npz``;
* ``integer_model.npz``: per layer ``<index>/weight`` (int32, O×I×kh×kw), ``weight_zero_point``,
  ``weight_scale``, ``bias`` (int32), ``multiplier`` (int64), ``shift`` (int64), and for a fused residual its
  multiplier and shift; ``<index>/input_multipliers`` etc. for an add;
* ``layers.csv``: one readable line per layer;
* ``golden.npz``: ``input`` (the first images, quantized, NCHW int), ``output/<tensor>`` for every layer's
  output on those images, ``accumulator/<layer>`` (int32 with bias, NCHW) of the first image;
* ``crossbar.json`` (a ``device=cim`` run): the crossbar's settings, every convention of its arithmetic in
  words (term order, tiles, slices, noise draws, ADC rounding, accumulation) and each layer's tiles and
  slices; with ``adc_steps.csv`` (every ADC's step and window) it is enough to recompute the run's device
  predictions (tests/integration/test_device_cim.py does, with NumPy alone).

Every layer kind's arithmetic is written out in words in ``integer_model.json`` (:data:`ARITHMETIC`).

``python -m resnet8ptq.export <run_id>`` writes them for any quantized run (see :mod:`resnet8ptq.export`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from resnet8ptq.device.config import Crossbar, DeviceConfig
from resnet8ptq.device.effects import STEPS, configured
from resnet8ptq.device.executor import execute
from resnet8ptq.device.graph import Add, AveragePool, Conv, IntegerModel, MaxPool
from resnet8ptq.device.mapping import (
    dac_window,
    input_range,
    on_crossbar,
    slice_shifts,
    tile_sizes,
    value_bits,
)

GOLDEN_IMAGES = 16
SCHEME = (
    "Requantization y = clamp(MBQM(acc, multiplier, shift) + output_zero_point, act_min, act_max), TFLite's "
    "MultiplyByQuantizedMultiplier: 'double' = SaturatingRoundingDoublingHighMul(acc << max(shift, 0), "
    "multiplier) then RoundingDivideByPOT(max(-shift, 0)) (gemmlowp; TFLite's default build); 'single' = "
    "(acc * multiplier + 2^(30 - shift)) >> (31 - shift) (TFLITE_SINGLE_ROUNDING). acc = sum over C_in*kh*kw "
    "of (x - x_zp)(w - w_zp) + bias, padding with the input zero point."
)


ARITHMETIC = {
    "input": "q = clamp(round(x / input_quant.scale) + input_quant.zero_point, qmin, qmax) of the "
    "NHWC float32 image (raw 0-255 pixels, no normalisation), transposed to NCHW; round per "
    "input_rounding (half_away_from_zero: TFLite; half_to_even: ONNX/PyTorch "
    "QuantizeLinear), in float32.",
    "Conv": "acc[o] = sum over the C_in/groups*kh*kw terms of (x - x_zp) * (w[o] - w_zp[o]) + bias[o] "
    "(groups > 1, a grouped or depthwise convolution: output o reads only the input channels of its "
    "group g = o // (O / groups), channels g*C_in/groups onwards; weight O x C_in/groups x kh x kw) "
    "(int64; int32 never overflows for this network), the input zero-padded by padding = "
    "[top, bottom, left, right] (a padded position contributes 0 after centring) and strided "
    "by stride = [h, w]; then y = clamp(MBQM(acc, multiplier[o], shift[o]) + "
    "output_quant.zero_point, act_min, act_max) with the layer's rounding (see "
    "requantization). output_quant null: the output is acc itself (float logits left to the "
    "host). weight_scale is the real scale of w - w_zp: folded into multiplier and shift, it "
    "plays no part in the integer arithmetic, only in the prediction of a layer whose output "
    "is acc.",
    "dense": "a Conv with dense = true: its input (N, C) or (N, C, 1, 1) is flattened to C terms in "
    "channel order (a 1x1 convolution on a 1x1 input); weight O x C x 1 x 1.",
    "Conv with residual": "residual = {tensor, quant, multiplier, shift}: the conv's acc and the "
    "residual tensor r are added in fixed point with F = 20 fraction bits "
    "before one requantization: y = clamp(((MBQMs(acc, multiplier[o], shift[o])"
    " + MBQMs(r - r_zp, residual.multiplier, residual.shift) + 2^(F-1)) >> F) +"
    " output_quant.zero_point, act_min, act_max), MBQMs the single-rounding "
    "form, each term rounded once, the sum rounded once (half up: arithmetic "
    "shift of sum + 2^(F-1)).",
    "Add": "y = clamp(MBQM(a' + b', output_multiplier, output_shift) + output_quant.zero_point, "
    "act_min, act_max) with a' = MBQM((a - a_zp) << left_shift, input_multipliers[0], "
    "input_shifts[0]) and b' likewise (TFLite's reference AddElementwise): three MBQMs, each "
    "with the layer's rounding, in int64.",
    "AveragePool": "a global average over H x W (count = H*W). rounding_divide (input and output "
    "share their quantization): the sum of the raw integers q (not centred) divided by"
    " count, rounded half away from zero (C's (sum +- count/2) / count), or half to "
    "even when half_to_even (a QDQ model's QuantizeLinear), clamped to output_quant's "
    "qmin..qmax; otherwise y = clamp(MBQM(sum of (q - input_zp), multiplier, shift) + "
    "output zero point, qmin, qmax) with TFLite's double rounding.",
    "MaxPool": "y = clamp(max over each kernel window, strided by stride, of the raw integers q; "
    "padding = [top, bottom, left, right] positions never win; clamped to act_min..act_max, or "
    "output_quant's qmin..qmax when null). Input and output share their quantization.",
    "prediction": "the class is the argmax of the last layer's real values: (q - zp) * scale, or acc "
    "* input_quant.scale * weight_scale[o] when its output_quant is null (per-channel "
    "scales differ), the first class on a tie.",
}
"""Every layer kind's integer arithmetic in words (``integer_model.json``'s ``arithmetic``), so that a
hardware team re-implements the forward pass from the export alone."""


def layer_arrays(index: int, layer: object) -> dict[str, np.ndarray]:
    """A layer's arrays for ``integer_model.npz``, keyed ``<index>/<name>``."""
    key = f"{index:02d}"
    if isinstance(layer, Conv):
        arrays = {
            "weight": layer.weight.astype(np.int32),
            "weight_zero_point": layer.weight_zero_point.astype(np.int32),
            "weight_scale": layer.weight_scale.astype(np.float32),
            "bias": layer.bias.astype(np.int32),
            "multiplier": np.asarray(layer.multiplier, np.int64),
            "shift": np.asarray(layer.shift, np.int64),
        }
    elif isinstance(layer, Add):
        arrays = {
            "input_multipliers": np.asarray(layer.input_multipliers, np.int64),
            "input_shifts": np.asarray(layer.input_shifts, np.int64),
        }
    else:
        arrays = {}
    return {f"{key}/{name}": value for name, value in arrays.items()}


def layer_description(index: int, layer: object) -> dict[str, object]:
    """A layer's JSON entry: every scalar field (quantizations as dicts), and its array keys."""
    entry: dict[str, object] = {"index": index, "kind": type(layer).__name__}
    for name, value in vars(layer).items():
        if isinstance(value, np.ndarray):
            continue
        if hasattr(value, "__dataclass_fields__"):
            value = asdict(value)
        elif isinstance(value, tuple) and value and hasattr(value[0], "__dataclass_fields__"):
            value = [asdict(item) for item in value]
        entry[name] = value
    entry["arrays"] = sorted(layer_arrays(index, layer))
    return entry


def summary_row(layer: object) -> dict[str, object]:
    """One line of ``layers.csv``."""
    row: dict[str, object] = {"layer": layer.name, "kind": type(layer).__name__, "output": layer.output}
    if isinstance(layer, Conv):
        q_out = layer.output_quant
        row |= {
            "weight_shape": "x".join(map(str, layer.weight.shape)),
            "terms": layer.terms,
            "per_channel": bool(len(set(layer.weight_scale.tolist())) > 1),
            "input_scale": layer.input_quant.scale,
            "input_zero_point": layer.input_quant.zero_point,
            "output_scale": q_out.scale if q_out else None,
            "output_zero_point": q_out.zero_point if q_out else None,
            "multiplier_min": int(np.min(layer.multiplier)),
            "multiplier_max": int(np.max(layer.multiplier)),
            "shift_min": int(np.min(layer.shift)),
            "shift_max": int(np.max(layer.shift)),
            "rounding": layer.rounding,
            "residual": layer.residual.tensor if layer.residual else "",
        }
    elif isinstance(layer, Add | AveragePool | MaxPool):
        row |= {"output_scale": layer.output_quant.scale, "output_zero_point": layer.output_quant.zero_point}
    return row


def export(model: IntegerModel, images: np.ndarray, out_dir: Path) -> list[Path]:
    """Write the integer parameters and the golden vectors of the first :data:`GOLDEN_IMAGES` of ``images``
    (NHWC float32) into ``out_dir``; return the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for index, layer in enumerate(model.layers):
        arrays |= layer_arrays(index, layer)
    description = {
        "source": model.source,
        "input": model.input,
        "input_quant": asdict(model.input_quant),
        "input_rounding": model.input_rounding,
        "output": model.output,
        "layout": "NCHW; weights O x I x kh x kw; a dense layer's weight O x I x 1 x 1",
        "requantization": SCHEME,
        "arithmetic": ARITHMETIC,
        "notes": model.notes,
        "layers": [layer_description(index, layer) for index, layer in enumerate(model.layers)],
    }
    paths = [out_dir / "integer_model.json", out_dir / "integer_model.npz", out_dir / "layers.csv"]
    paths[0].write_text(json.dumps(description, indent=1, default=_plain))
    np.savez_compressed(paths[1], **arrays)
    pd.DataFrame([summary_row(layer) for layer in model.layers]).to_csv(paths[2], index=False)

    count = min(GOLDEN_IMAGES, len(images))
    _, trace = execute(model, images[:count], batch_size=count, trace_images=count)
    golden = {"input": trace.outputs[model.input].numpy()}
    golden |= {
        f"output/{name}": values.numpy() for name, values in trace.outputs.items() if name != model.input
    }
    golden |= {f"accumulator/{name}": values[:1].numpy() for name, values in trace.accumulators.items()}
    paths.append(out_dir / "golden.npz")
    np.savez_compressed(paths[-1], **golden)
    return paths


CROSSBAR_CONVENTIONS = {
    "terms": "A conv/dense output's dot product runs over its K = C_in*kh*kw terms in C_in-major "
    "order: term k = (c*kh + i)*kw + j of the zero-padded, strided window of the centred "
    "input x - x_zp (integer_model.json gives padding, stride and zero points); a dense "
    "layer's terms are its input channels. A grouped (depthwise) layer's output o sums its group's "
    "K = C_in/groups*kh*kw terms only (group o // (O / groups); layers[].groups): depthwise crossbar "
    "maps each group block-diagonally (its own rows and columns); depthwise digital computes the layer "
    "exactly on the digital unit (layers[].mapping digital: no tiles, slices or ADCs).",
    "tiles": "The K terms are split into ceil(K / rows) row tiles as equal as possible, the larger "
    "first (aihwkit-lightning's split; layers[].tile_sizes); tile t holds terms [sum of the "
    "sizes before t, + its size). rows null: one tile.",
    "dac": "The DAC applies x - x_zp clipped to layers[].input_range: with dac_range full the quantized "
    "input's whole range (layers[].quantized_input_range, so nothing is clipped); with dac_range "
    "percentile the smallest m-bit range holding the (100 - dac_percentile)-th and dac_percentile-th "
    "percentiles of the layer's inputs on the calibration sample (ideal integer device), inputs beyond it "
    "applied as its ends (dac_ranges.csv).",
    "input_slices": "x - x_zp (after the DAC's clip: integers in layers[].input_range) is applied "
    "dac_bits bits per cycle: digits of the value, lowest first, each with its shift "
    "(layers[].input_slice_shifts); when the range has negative values the digits are"
    " those of its two's complement over layers[].input_bits, the top digit "
    "negative-weighted (value = sum of digit * 2^shift). dac_bits >= input_bits: one "
    "slice, the value itself.",
    "weight_slices": "w - w_zp is a sign (a differential pair of cells) and a magnitude cut into "
    "cells_per_weight digits of bits_per_cell bits, lowest first "
    "(layers[].weight_slice_shifts); the cell holds sign * digit.",
    "effects": "effects lists the non-idealities on, per step of the chip (program, perturb: the cells once "
    "per programmed chip; read: each tile's partial sums; convert: the partial sums at the ADC's input, "
    "before it rounds them), in the order they act; docs/device.md gives each one's formula. With "
    "drift_compensation, each layer's column sums are multiplied digitally by alpha = sum |W| after the "
    "program effects / sum |W| after the perturb effects (W = sum of cell * 2^shift over the slices), "
    "then rounded to the integer accumulator.",
    "programming_noise": "weight_noise > 0: each cell's level gets sigma * n, sigma = weight_noise * "
    "(2^bits_per_cell - 1), n standard normal from "
    "torch.Generator().manual_seed(seed), drawn once per programmed chip: layer "
    "by layer in execution order, per layer one torch.randn((O, K), "
    "dtype=float64) per weight slice, lowest slice first. seed = 0 .. "
    "noise_seeds - 1, one chip per seed; predictions.csv holds seed 0's "
    "predictions, accuracy_by_draw.csv every seed's accuracy.",
    "partial_sums": "p = sum over the tile's terms of input digit * cell level: one partial sum per "
    "image, output position, input slice, tile, weight slice and output column (exact"
    " integers without noise; float64 with it).",
    "adc": "adc_bits null: an ideal ADC, reading = p rounded to an integer (half to even). Otherwise "
    "each partial sum is read by its column's ADC (adc_steps.csv: one row per ADC at "
    "adc_granularity: layer, tile, or column = (tile, cell_slice, column); input slices share "
    "their column's ADC): code = round(p / adc_step) with ties to even, clamped to [code_min, "
    "code_max]; reading = code * adc_step. adc_step is a power of two (adc_step = pow2) or a "
    "multiple of 2^-8 (free). The steps were set from the calibration sample's partial sums on"
    " the ideal crossbar (same tiles and slices, no noise, exact ADC) by adc_range.",
    "accumulation": "acc = sum over tiles, in tile order, of (sum over input and weight slices of "
    "reading * 2^(input shift + weight shift)), added tile by tile into a saturating "
    "two's-complement register of accumulator_bits bits; with free steps the register"
    " keeps 8 fraction bits and the sum is rounded half to even to an integer once, "
    "after the last tile. Then acc + bias is requantized as in integer_model.json "
    "(the ideal layer's arithmetic from the accumulator on).",
}
"""The crossbar's arithmetic in words (``crossbar.json``), the conventions :mod:`.cim` implements."""


def crossbar_layers(
    model: IntegerModel, crossbar: Crossbar, dac: dict[str, tuple[int, int]] | None = None
) -> list[dict[str, object]]:
    """Each conv/dense layer's tiles and slices on ``crossbar``; its input range is the DAC's (``dac``: the
    calibrated ranges of ``dac_range=percentile``), else the quantized input's."""
    layers = []
    for layer in model.convs:
        if not on_crossbar(layer, crossbar):
            layers.append({"name": layer.name, "groups": layer.groups, "mapping": "digital"})
            continue
        low, high = dac_window(layer, dac)
        bits, signed = value_bits(low, high)
        capacity = crossbar.bits_per_cell * crossbar.cells_per_weight
        layers.append(
            {
                "name": layer.name,
                "terms": layer.terms,
                "tile_sizes": tile_sizes(layer.terms, crossbar.rows),
                "input_range": [low, high],
                "quantized_input_range": list(input_range(layer)),
                "input_bits": bits,
                "input_signed": signed,
                "input_slice_shifts": slice_shifts(crossbar.dac_bits, bits),
                "weight_slice_shifts": slice_shifts(crossbar.bits_per_cell, capacity),
                "output_columns": len(layer.weight),
                "groups": layer.groups,
                "mapping": "crossbar",
            }
        )
    return layers


def export_crossbar(
    model: IntegerModel,
    device: DeviceConfig,
    calibration: dict[str, object],
    out_dir: Path,
    dac: dict[str, tuple[int, int]] | None = None,
) -> Path:
    """``crossbar.json``: a ``device=cim`` run's crossbar settings, its conventions in words
    (:data:`CROSSBAR_CONVENTIONS`), each layer's tiles and slices, and the calibration sample the ADC
    steps (``adc_steps.csv``) were set from."""
    crossbar = device.crossbar()
    description = {
        "settings": asdict(crossbar),
        "range_rule": device.range_rule,
        "effects": {
            step: [{"effect": type(e).__name__, **asdict(e)} for e in configured(crossbar, step)]
            for step in STEPS
        },
        "noise_seeds": device.seeds,
        "calibration": calibration,
        "conventions": CROSSBAR_CONVENTIONS,
        "layers": crossbar_layers(model, crossbar, dac),
        "files": {
            "adc_steps.csv": "every ADC: layer, granularity, group, tile, cell_slice, column (empty where "
            "the group spans them), adc_step, code_min, code_max, range_low, range_high (= code * adc_step)",
            "integer_model.json": "the layers' integer parameters and arithmetic around the accumulator",
            "predictions.csv": "per test image: label, the reference's and the device's (seed 0) prediction",
            "dac_ranges.csv": "dac_range percentile: every layer's quantized input range, the DAC's range "
            "and its bits, and the input cycles at dac_bits before and after the clip",
        },
    }
    path = out_dir / "crossbar.json"
    path.write_text(json.dumps(description, indent=1, default=_plain))
    return path


def _plain(value: object) -> object:
    """JSON for NumPy scalars."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"Not JSON serializable: {type(value)}")

"""A hardware team's reading of the device export (``device/``: integer_model.json + .npz, crossbar.json,
adc_steps.csv): the forward pass rebuilt with NumPy from those files and their words alone, importing nothing
from resnet8ptq, so that a test can check that the export is a specification (issue 41)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pandas as pd

Accumulate = Callable[[dict, np.ndarray, np.ndarray], np.ndarray]
"""(layer entry, centred input NCHW, centred weight O x I x kh x kw) -> acc without bias, NCHW."""


def mbqm(x: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, rounding: str) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier as written in integer_model.json's scheme, in int64 NumPy."""
    x, multiplier, shift = (np.asarray(v, np.int64) for v in (x, multiplier, shift))
    if rounding == "single":
        return (x * multiplier + (np.int64(1) << (30 - shift))) >> (31 - shift)
    product = (x << np.maximum(shift, 0)) * multiplier
    total = product + np.where(product >= 0, 1 << 30, 1 - (1 << 30))
    high = np.sign(total) * (np.abs(total) >> 31)
    right = np.maximum(-shift, 0)
    mask = (np.int64(1) << right) - 1
    return (high >> right) + ((high & mask) > (mask >> 1) + (high < 0))


def numpy_conv(x: np.ndarray, weight: np.ndarray, stride: list[int], padding: list[int]) -> np.ndarray:
    top, bottom, left, right = padding
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    kh, kw = weight.shape[2:]
    windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[
        :, :, :: stride[0], :: stride[1]
    ]
    return np.einsum("nchwij,ocij->nohw", windows, weight)


def ideal_accumulate(layer: dict, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """integer_model.json's Conv: the exact sum over the padded, strided window."""
    return numpy_conv(x, weight, layer["stride"], layer["padding"])


def rebuild(
    description: dict,
    arrays: dict[str, np.ndarray],
    quantized_input: np.ndarray,
    accumulate: Accumulate = ideal_accumulate,
) -> tuple[dict, dict]:
    """Every layer's output and accumulator, from the exported description alone; ``accumulate`` computes a
    conv/dense layer's sums (the ideal device's, or a crossbar's: :func:`crossbar_accumulate`)."""
    tensors, accumulators = {description["input"]: quantized_input.astype(np.int64)}, {}
    for layer in description["layers"]:
        key = f"{layer['index']:02d}/"
        out_q = layer.get("output_quant")
        if layer["kind"] == "Conv":
            x = tensors[layer["input"]]
            x = (x.reshape(*x.shape, 1, 1) if x.ndim == 2 else x) - layer["input_quant"]["zero_point"]
            weight = (
                arrays[key + "weight"].astype(np.int64)
                - arrays[key + "weight_zero_point"][:, None, None, None]
            )
            acc = accumulate(layer, x, weight) + arrays[key + "bias"][None, :, None, None]
            accumulators[layer["name"]] = acc
            multiplier = arrays[key + "multiplier"][None, :, None, None]
            shift = arrays[key + "shift"][None, :, None, None]
            if out_q is None:
                out = acc
            elif layer["residual"]:
                res = layer["residual"]
                fraction = 20
                conv_term = mbqm(acc, multiplier, shift, "single")
                res_term = mbqm(
                    tensors[res["tensor"]] - res["quant"]["zero_point"],
                    res["multiplier"],
                    res["shift"],
                    "single",
                )
                out = ((conv_term + res_term + (1 << (fraction - 1))) >> fraction) + out_q["zero_point"]
            else:
                out = mbqm(acc, multiplier, shift, layer["rounding"]) + out_q["zero_point"]
            tensors[layer["output"]] = (
                out if out_q is None else np.clip(out, layer["act_min"], layer["act_max"])
            )
        elif layer["kind"] == "Add":
            total = 0
            for name, q, m, s in zip(
                layer["inputs"],
                layer["input_quants"],
                layer["input_multipliers"],
                layer["input_shifts"],
                strict=True,
            ):
                total = total + mbqm(
                    (tensors[name] - q["zero_point"]) << layer["left_shift"], m, s, layer["rounding"]
                )
            out = mbqm(total, layer["output_multiplier"], layer["output_shift"], layer["rounding"])
            tensors[layer["output"]] = np.clip(out + out_q["zero_point"], layer["act_min"], layer["act_max"])
        else:  # AveragePool over the whole input
            x = tensors[layer["input"]]
            count = x.shape[2] * x.shape[3]
            total = x.sum(axis=(2, 3), keepdims=True)
            if layer["half_to_even"]:
                quotient = total // count
                rest = 2 * (total - quotient * count)
                out = quotient + ((rest > count) | ((rest == count) & (quotient % 2 == 1)))
            else:
                out = np.sign(total) * ((np.abs(total) + count // 2) // count)
            tensors[layer["output"]] = np.clip(out, out_q["qmin"], out_q["qmax"])
    return tensors, accumulators


def quantize_input(description: dict, images: np.ndarray) -> np.ndarray:
    """integer_model.json's ``arithmetic.input``: NHWC float32 images to the quantized NCHW input."""
    q = description["input_quant"]
    scaled = images.astype(np.float32) / np.float32(q["scale"])
    if description["input_rounding"] == "half_away_from_zero":
        rounded = np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))
    else:
        rounded = np.round(scaled)  # half to even
    q_int = np.clip(rounded.astype(np.int64) + q["zero_point"], q["qmin"], q["qmax"])
    return q_int.transpose(0, 3, 1, 2)


def predict(description: dict, arrays: dict[str, np.ndarray], logits: np.ndarray) -> np.ndarray:
    """integer_model.json's ``arithmetic.prediction``: the argmax of the last layer's real values."""
    last = description["layers"][-1]
    values = logits.reshape(len(logits), -1).astype(np.float64)
    if last["output_quant"] is None:
        scale = description["layers"][-1]["input_quant"]["scale"]
        real = values * np.float64(scale) * arrays[f"{last['index']:02d}/weight_scale"].astype(np.float64)
    else:
        real = (values - last["output_quant"]["zero_point"]) * last["output_quant"]["scale"]
    return real.argmax(axis=1)


def digits(values: np.ndarray, bits: int, total_bits: int, signed: bool, shifts: list[int]) -> list:
    """crossbar.json's input/weight slices: ``bits``-bit digits at ``shifts``, two's complement when signed
    (the top digit negative-weighted)."""
    if len(shifts) == 1:
        return [values]
    as_int = values.astype(np.int64) % (1 << total_bits) if signed else values.astype(np.int64)
    out = []
    for shift in shifts:
        width = min(bits, total_bits - shift)
        digit = (as_int >> shift) & ((1 << width) - 1)
        if signed and shift + width == total_bits:
            digit = np.where(digit >= 1 << (width - 1), digit - (1 << width), digit)
        out.append(digit)
    return out


ADC_COLUMNS = ("adc_step", "code_min", "code_max")


def adc_arrays(table: pd.DataFrame, entry: dict, tiles: int, slices: int) -> tuple[np.ndarray, ...]:
    """(step, code_min, code_max), each (tiles, slices, outputs), from adc_steps.csv's rows of one layer."""
    outputs = entry["output_columns"]
    shape = (tiles, slices, outputs)
    granularity = table["granularity"].iloc[0]
    if granularity == "column":
        rows = table.sort_values(["tile", "cell_slice", "column"])
        return tuple(rows[c].to_numpy(np.float64).reshape(shape) for c in ADC_COLUMNS)
    if granularity == "tile":
        rows = table.sort_values("tile")
        return tuple(np.broadcast_to(rows[c].to_numpy(np.float64)[:, None, None], shape) for c in ADC_COLUMNS)
    return tuple(np.full(shape, float(table[c].iloc[0])) for c in ADC_COLUMNS)


def crossbar_accumulate(crossbar: dict, adc_table: pd.DataFrame | None) -> Accumulate:
    """crossbar.json's conventions (no programming noise) as an :data:`Accumulate`: the DAC's clip, tiles in
    term order, input and weight slices, each partial sum through its column's ADC (ties to even), shift and
    add, the tiles added into a saturating accumulator."""
    settings = crossbar["settings"]
    if settings["weight_noise"]:
        raise NotImplementedError("this reader leaves out programming noise (torch's generator draws it)")
    layers = {entry["name"]: entry for entry in crossbar["layers"]}
    limit = 2.0 ** (settings["accumulator_bits"] - 1)

    def accumulate(layer: dict, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        entry = layers[layer["name"]]
        top, bottom, left, right = layer["padding"]
        x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
        kh, kw = weight.shape[2:]
        windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
        windows = windows[:, :, :: layer["stride"][0], :: layer["stride"][1]]  # (N, C, H', W', kh, kw)
        terms = windows.transpose(0, 2, 3, 1, 4, 5).reshape(*windows.shape[:1], *windows.shape[2:4], -1)
        terms = np.clip(terms, *entry["input_range"])  # the DAC's range (padding's zeros lie inside it)
        weight = weight.reshape(len(weight), -1)
        x_digits = digits(terms, settings["dac_bits"], entry["input_bits"], entry["input_signed"],
                          entry["input_slice_shifts"])  # fmt: skip
        capacity = settings["bits_per_cell"] * settings["cells_per_weight"]
        magnitudes = digits(np.abs(weight), settings["bits_per_cell"], capacity, False,
                            entry["weight_slice_shifts"])  # fmt: skip
        cells = [np.sign(weight) * magnitude for magnitude in magnitudes]
        tiles = entry["tile_sizes"]
        if settings["adc_bits"] is not None:
            step, low, high = adc_arrays(adc_table[adc_table["layer"] == layer["name"]], entry, len(tiles),
                                         len(cells))  # fmt: skip
        acc = np.zeros((*terms.shape[:3], len(weight)))
        bounds = np.cumsum([0, *tiles])
        for t, (start, stop) in enumerate(itertools.pairwise(bounds)):
            for xs, x_digit in zip(entry["input_slice_shifts"], x_digits, strict=True):
                chunk = x_digit[..., start:stop].astype(np.float64)
                for s, (ws, cell) in enumerate(zip(entry["weight_slice_shifts"], cells, strict=True)):
                    partial = chunk @ cell[:, start:stop].T.astype(np.float64)  # (N, H', W', O)
                    if settings["adc_bits"] is None:
                        reading = np.round(partial)
                    else:
                        code = np.clip(np.round(partial / step[t, s]), low[t, s], high[t, s])
                        reading = code * step[t, s]
                    acc += reading * 2.0 ** (xs + ws)
            acc = np.clip(acc, -limit, limit - 1)
        return np.round(acc).transpose(0, 3, 1, 2)  # free steps: the fixed-point sum rounded once, to even

    return accumulate

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
  output on those images, ``accumulator/<layer>`` (int32 with bias, NCHW) of the first image.

``python -m resnet8ptq.export <run_id>`` writes them for any quantized run (see :mod:`resnet8ptq.export`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from resnet8ptq.device.executor import execute
from resnet8ptq.device.graph import Add, AveragePool, Conv, IntegerModel

GOLDEN_IMAGES = 16
SCHEME = (
    "Requantization y = clamp(MBQM(acc, multiplier, shift) + output_zero_point, act_min, act_max), TFLite's "
    "MultiplyByQuantizedMultiplier: 'double' = SaturatingRoundingDoublingHighMul(acc << max(shift, 0), "
    "multiplier) then RoundingDivideByPOT(max(-shift, 0)) (gemmlowp; TFLite's default build); 'single' = "
    "(acc * multiplier + 2^(30 - shift)) >> (31 - shift) (TFLITE_SINGLE_ROUNDING). acc = sum over C_in*kh*kw "
    "of (x - x_zp)(w - w_zp) + bias, padding with the input zero point."
)


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
    elif isinstance(layer, Add | AveragePool):
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


def _plain(value: object) -> object:
    """JSON for NumPy scalars."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"Not JSON serializable: {type(value)}")

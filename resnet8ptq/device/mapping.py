"""How a conv/dense layer is laid out on a crossbar's arrays (resnet8ptq/device/cim.py computes on them):
which layers the arrays take (a grouped one with ``depthwise=digital`` is the digital unit's), its terms' row
tiles, its inputs' and weights' bit slices, and the input range its DACs apply. Pure functions of a layer and
the crossbar's settings: the action counts, the exports and device-aware learning share them."""

from __future__ import annotations

import math

import torch

from resnet8ptq.device.config import Crossbar
from resnet8ptq.device.graph import Conv, IntegerModel


def on_crossbar(layer: Conv, crossbar: Crossbar) -> bool:
    """Whether ``crossbar`` computes ``layer`` on its arrays: every conv/dense layer, but a grouped
    (depthwise) one with ``depthwise=digital``, which the digital unit computes."""
    return layer.groups == 1 or crossbar.depthwise == "crossbar"


def crossbar_convs(model: IntegerModel, crossbar: Crossbar) -> list[Conv]:
    """The conv/dense layers of ``model`` on ``crossbar``'s arrays (:func:`on_crossbar`): those with ADCs."""
    return [layer for layer in model.convs if on_crossbar(layer, crossbar)]


def tile_sizes(terms: int, rows: int | None) -> list[int]:
    """``terms`` split into the fewest tiles of at most ``rows``, as equal as possible, larger ones first
    (aihwkit-lightning's split: 576 at 128 rows -> [116, 115, 115, 115, 115])."""
    if rows is None or terms <= rows:
        return [terms]
    count = math.ceil(terms / rows)
    base, extra = divmod(terms, count)
    return [base + 1] * extra + [base] * (count - extra)


def slices(values: torch.Tensor, bits: int, total_bits: int, signed: bool) -> list[tuple[torch.Tensor, int]]:
    """``values`` (integers in float) cut into ``bits``-bit digits, lowest first, with each digit's
    significance (a power of two): x = Σ digit · 2^shift. Signed values are in two's complement over
    ``total_bits``, the top digit negative-weighted."""
    if bits >= total_bits:
        return [(values, 0)]
    as_int = values.to(torch.int32)  # narrow: the bit operations stream less memory
    if signed:
        as_int = torch.where(as_int < 0, as_int + (1 << total_bits), as_int)
    digits = []
    for low in slice_shifts(bits, total_bits):
        width = min(bits, total_bits - low)
        digit = (as_int >> low) & ((1 << width) - 1)
        if signed and low + width == total_bits:  # the sign digit: two's complement of its width
            digit = torch.where(digit >= 1 << (width - 1), digit - (1 << width), digit)
        digits.append((digit.to(values.dtype), low))
    return digits


def slice_shifts(bits: int, total_bits: int) -> list[int]:
    """The significance (shift) of each ``bits``-bit digit of a ``total_bits`` value, lowest first."""
    return list(range(0, total_bits, bits)) if bits < total_bits else [0]


def value_bits(low: int, high: int) -> tuple[int, bool]:
    """(bits, signed): the width of the two's-complement (or unsigned) integers from ``low`` to ``high``."""
    if low >= 0:
        return max(int(high).bit_length(), 1), False
    return max(int(high).bit_length(), int(-low - 1).bit_length()) + 1, True


def input_range(layer: Conv) -> tuple[int, int]:
    """The centred input's integer range: qmin - zp .. qmax - zp."""
    q = layer.input_quant
    return q.qmin - q.zero_point, q.qmax - q.zero_point


def dac_window(layer: Conv, dac_ranges: dict[str, tuple[int, int]] | None) -> tuple[int, int]:
    """The centred inputs the layer's DAC applies: its calibrated range (``dac_ranges``, :mod:`.dac`), else
    the quantized input's (:func:`input_range`)."""
    return (dac_ranges or {}).get(layer.name) or input_range(layer)


def worst_case_full_scale(layer: Conv, crossbar: Crossbar, window: tuple[int, int]) -> float:
    """The largest |partial sum| a tile can produce: its rows × the largest input digit × the largest cell
    level (every cell at full scale, every input slice at its maximum), inputs in the DAC's ``window``."""
    in_bits, _ = value_bits(*window)
    digit = 2 ** min(crossbar.dac_bits, in_bits) - 1
    cell = 2**crossbar.bits_per_cell - 1
    return tile_sizes(layer.terms, crossbar.rows)[0] * digit * cell


def grouped_channels(layer: Conv, channels: slice, device: torch.device | None) -> slice | torch.Tensor:
    """The input channels a row tile's rows touch: ``channels`` of each group's C_in / groups (all of a
    group's channels: every input channel), as a slice or an index of the input's channels."""
    per_group = layer.weight.shape[1]
    if layer.groups == 1 or (channels.start, channels.stop) == (0, per_group):
        return slice(None) if layer.groups > 1 else channels
    index = [
        group * per_group + c for group in range(layer.groups) for c in range(channels.start, channels.stop)
    ]
    return torch.tensor(index, device=device)

"""A compute-in-memory (CiM) crossbar as the arithmetic of conv/dense layers (see docs/device.md).

What is modelled, per layer, for every output (a crossbar column) and every image:

* **Row tiles** (aihwkit: ``mapping.max_input_size``): the C_in·kh·kw terms of the dot product are split over
  ``rows``-row tiles as aihwkit splits them, into equal tiles (576 terms at 128 rows: 116 + 4 × 115), each
  tile's partial sum read on its own.
* **Bit-serial inputs** (aihwkit: ``forward.inp_res``): the centred input x - x_zp (an unsigned 8-bit value
  after a ReLU) is applied ``dac_bits`` bits per cycle, as two's-complement slices when it can be negative;
  the slices' results are shifted and added digitally.
* **Weight slicing**: w - w_zp is stored as a sign (a differential pair of cells) and a magnitude cut into
  ``cells_per_weight`` cells of ``bits_per_cell`` bits; each cell column is read on its own, then shifted
  and added.
* **Programming noise** (aihwkit: ``w_noise``, ``PCM`` programming noise): each cell's level gets Gaussian
  noise of σ = ``weight_noise`` × the cell's full range (2^bits_per_cell - 1), drawn once per seed (the chip
  is programmed once, then every image runs on it).
* **ADC** (aihwkit: ``forward.out_res``, ``out_bound``): each partial sum (tile × input slice × weight
  slice) is read by an ``adc_bits`` ADC: rounded half to even to its step and clamped to its window of codes
  (symmetric ±(2^(b-1) - 1), or 2^b codes over the calibrated range); steps and windows come per layer, tile
  or column from :mod:`.adc` (``adc_range``, ``adc_granularity``, ``adc_window``, ``adc_step``). Input
  slices of one column share its ADC.
* **Digital accumulator**: the ADC codes times their steps are shifted and added tile by tile into a
  saturating ``accumulator_bits`` register; with ``free`` (non power-of-two) steps the register keeps
  :data:`~.adc.STEP_FRACTION_BITS` fraction bits beside them and the sum is rounded half to even to an
  integer once, after the last tile. The bias is added last, then requantization is the integer executor's.

Not modelled: IR drop and wire resistance, conductance drift and read noise over time, device-to-device
ADC mismatch and non-linear ADC transfer curves, stuck cells, and any analog activation or pooling.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from resnet8ptq.device.adc import Geometry, LayerSteps, PartialSumProfile
from resnet8ptq.device.config import Crossbar
from resnet8ptq.device.executor import EXACT_FLOAT32, Arithmetic, float_conv
from resnet8ptq.device.graph import Conv


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
    as_int = values.to(torch.int64)
    if signed:
        as_int = torch.where(as_int < 0, as_int + (1 << total_bits), as_int)
    digits = []
    for low in range(0, total_bits, bits):
        width = min(bits, total_bits - low)
        digit = (as_int >> low) & ((1 << width) - 1)
        if signed and low + width == total_bits:  # the sign digit: two's complement of its width
            digit = torch.where(digit >= 1 << (width - 1), digit - (1 << width), digit)
        digits.append((digit.to(values.dtype), low))
    return digits


def value_bits(low: int, high: int) -> tuple[int, bool]:
    """(bits, signed): the width of the two's-complement (or unsigned) integers from ``low`` to ``high``."""
    if low >= 0:
        return max(int(high).bit_length(), 1), False
    return max(int(high).bit_length(), int(-low - 1).bit_length()) + 1, True


class CrossbarArithmetic(Arithmetic):
    """A layer's accumulators on :class:`Crossbar`, for one programming of the weights (one noise seed).

    ``adc_steps`` (per layer name) come from :func:`resnet8ptq.device.evaluate.adc_steps`; with ``profile``,
    every partial sum is added to it (calibration, on the ideal crossbar). ``seed`` draws the programming
    noise, once per layer, at first use."""

    def __init__(
        self,
        crossbar: Crossbar,
        seed: int = 0,
        adc_steps: dict[str, LayerSteps] | None = None,
        profile: PartialSumProfile | None = None,
    ) -> None:
        self.crossbar = crossbar
        self.seed = seed
        self.adc_steps = dict(adc_steps or {})
        self.profile = profile
        self._weights: dict[str, list[tuple[torch.Tensor, int]]] = {}
        self._generator = torch.Generator().manual_seed(seed)
        self._tiled: dict[str, tuple[torch.Tensor, float]] = {}
        self._adcs: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]] = {}

    def weight_slices(self, layer: Conv) -> list[tuple[torch.Tensor, int]]:
        """The layer's programmed cell columns (O, K) per weight slice with their significance: sign ·
        magnitude digit, plus programming noise (drawn once per layer and seed)."""
        if layer.name not in self._weights:
            weight = torch.from_numpy(layer.centered_weight.reshape(len(layer.weight), -1)).to(torch.float64)
            sign, magnitude = torch.sign(weight), weight.abs()
            c = self.crossbar
            capacity = c.bits_per_cell * c.cells_per_weight
            needed = int(magnitude.max()).bit_length()
            if needed > capacity:
                raise ValueError(
                    f"{layer.name}: weights need {needed} magnitude bits, the cells hold {capacity} "
                    f"(device.bits_per_cell={c.bits_per_cell} x "
                    f"device.cells_per_weight={c.cells_per_weight})."
                )
            programmed = []
            for digit, shift in slices(magnitude, c.bits_per_cell, capacity, signed=False):
                cells = sign * digit
                if c.weight_noise:
                    sigma = c.weight_noise * (2**c.bits_per_cell - 1)
                    noise = torch.randn(cells.shape, generator=self._generator, dtype=torch.float64)
                    cells = cells + sigma * noise
                programmed.append((cells, shift))
            self._weights[layer.name] = programmed
        return self._weights[layer.name]

    def geometry(self, layer: Conv) -> Geometry:
        """The layout of the layer's partial sums: tiles × weight slices × output columns."""
        slices_ = len(self.weight_slices(layer))
        return Geometry(len(tile_sizes(layer.terms, self.crossbar.rows)), slices_, len(layer.weight))

    def tiled_weights(self, layer: Conv) -> tuple[torch.Tensor, float]:
        """Every (tile, weight slice) pair's cells as a convolution's weights (T·Sw·O, C, kh, kw), masked to
        the tile's rows, in the exact type of the layer's partial sums (float32 while no partial sum can reach
        2^24: the largest input digit times the largest column sum of cells), and that bound; made once."""
        if layer.name not in self._tiled:
            c = self.crossbar
            in_bits, _ = value_bits(*input_range(layer))
            cells = torch.stack([cell for cell, _ in self.weight_slices(layer)])
            bounds = np.cumsum([0, *tile_sizes(layer.terms, c.rows)])
            masks = torch.zeros((len(bounds) - 1, layer.terms), dtype=torch.float64)
            for tile, (low, high) in enumerate(itertools.pairwise(bounds)):
                masks[tile, low:high] = 1
            stacked = (masks[:, None, None, :] * cells[None]).reshape(-1, *layer.weight.shape[1:])
            largest = 2.0 ** min(c.dac_bits, in_bits) * float(stacked.abs().sum(dim=(1, 2, 3)).max())
            dtype = torch.float32 if largest < EXACT_FLOAT32 else torch.float64
            self._tiled[layer.name] = (stacked.to(dtype), largest)
        return self._tiled[layer.name]

    def accumulate(self, layer: Conv, x: torch.Tensor) -> torch.Tensor:
        c = self.crossbar
        n, outputs = x.shape[0], len(layer.weight)
        in_bits, in_signed = value_bits(*input_range(layer))
        digits, x_shifts = zip(*slices(x, c.dac_bits, in_bits, in_signed), strict=True)
        w_shifts = [shift for _, shift in self.weight_slices(layer)]
        tiles = len(tile_sizes(layer.terms, c.rows))
        # One convolution gives every partial sum: the input slices stacked on the batch, and on the outputs
        # every (tile, weight slice) pair as the weights masked to the tile's rows.
        weight, largest = self.tiled_weights(layer)
        partial = float_conv(layer, torch.cat(digits), weight, weight.dtype)  # (Sx·N, T·Sw·O, H', W')
        if self.profile is not None:
            self.profile.add(layer.name, self.geometry(layer), partial)
        read, reading_bound, integral = self.adc(layer, partial, largest)
        read = read.reshape(len(x_shifts), n, tiles, len(w_shifts), outputs, *partial.shape[2:])
        # The readings' sum is exact in float32 while integers stay below 2^24 (every order of summation).
        bound = tiles * reading_bound * sum(2.0 ** (xs + ws) for xs in x_shifts for ws in w_shifts)
        dtype = torch.float32 if integral and bound < EXACT_FLOAT32 else torch.float64
        if len(x_shifts) * len(w_shifts) == 1:
            columns = read[0, :, :, 0].to(dtype)  # (N, T, O, H', W')
        else:  # shift and add the slices (powers of two: exact)
            significance = torch.tensor(
                [[2.0 ** (xs + ws) for ws in w_shifts] for xs in x_shifts], dtype=read.dtype
            ).reshape(len(x_shifts), 1, 1, len(w_shifts), 1, 1, 1)
            columns = (read * significance).sum(dim=(0, 3), dtype=dtype)
        limit = 2 ** (c.accumulator_bits - 1)
        if bound < limit:  # the accumulator cannot saturate
            acc = columns.sum(dim=1)
        else:
            acc = torch.zeros_like(columns[:, 0])
            for tile in range(tiles):  # the digital accumulator adds the tiles one by one, saturating
                acc = (acc + columns[:, tile]).clamp_(-limit, limit - 1)
        if not integral:
            acc = torch.round(acc)  # fixed point (multiples of 2^-8) to the integer accumulator: half to even
        return acc

    def adc(self, layer: Conv, partial: torch.Tensor, largest: float) -> tuple[torch.Tensor, float, bool]:
        """The partial sums as the ADC reads them (in place where it can), the largest |reading| and whether
        every reading is an integer: code = round(p / step), half to even, clamped to the ADC's window of
        codes, times the step. An ideal ADC rounds to an integer, which changes only noisy sums; its
        readings stay within ``largest``."""
        if self.crossbar.adc_bits is None:
            return partial.round_(), largest + 0.5, True
        adcs = self.adc_steps[layer.name]
        if layer.name not in self._adcs:
            dtype = partial.dtype if adcs.integral else torch.float64  # code · (M / 2^8): exact in float64

            def per_column(values: np.ndarray) -> torch.Tensor:
                column = torch.from_numpy(adcs.per_column(values).astype(np.float64))
                return column.to(dtype=dtype, device=partial.device).reshape(1, -1, 1, 1)

            bound = float(np.max(np.maximum(np.abs(adcs.code_min), np.abs(adcs.code_max)) * adcs.steps))
            self._adcs[layer.name] = (per_column(adcs.steps), per_column(adcs.code_min),
                                      per_column(adcs.code_max), bound)  # fmt: skip
        step, low, high, bound = self._adcs[layer.name]
        code = partial.to(step.dtype).div_(step).round_()
        return code.clamp_(low, high).mul_(step), bound, adcs.integral


def input_range(layer: Conv) -> tuple[int, int]:
    """The centred input's integer range: qmin - zp .. qmax - zp."""
    q = layer.input_quant
    return q.qmin - q.zero_point, q.qmax - q.zero_point


def worst_case_full_scale(layer: Conv, crossbar: Crossbar) -> float:
    """The largest |partial sum| a tile can produce: its rows × the largest input digit × the largest cell
    level (every cell at full scale, every input slice at its maximum)."""
    in_bits, _ = value_bits(*input_range(layer))
    digit = 2 ** min(crossbar.dac_bits, in_bits) - 1
    cell = 2**crossbar.bits_per_cell - 1
    return tile_sizes(layer.terms, crossbar.rows)[0] * digit * cell

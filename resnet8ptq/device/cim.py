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
* **Non-idealities** (:mod:`.effects`, one module each, in the step they act in): programming noise
  (aihwkit: ``w_noise``) and stuck cells on the cells, drawn once per seed (the chip is programmed once, then
  every image runs on it); conductance drift at ``t_inference`` (aihwkit's noise models), with aihwkit's
  global drift compensation on the digital side; aihwkit's first-order IR drop and read noise per read; the
  ADCs' offset, gain error, INL and input noise.
* **ADC** (aihwkit: ``forward.out_res``, ``out_bound``): each partial sum (tile × input slice × weight
  slice) is read by an ``adc_bits`` ADC: rounded half to even to its step and clamped to its window of codes
  (symmetric ±(2^(b-1) - 1), or 2^b codes over the calibrated range); steps and windows come per layer, tile
  or column from :mod:`.adc` (``adc_range``, ``adc_granularity``, ``adc_window``, ``adc_step``). Input
  slices of one column share its ADC.
* **Grouped (depthwise) convolutions** (``depthwise``): ``crossbar`` maps them block-diagonally, each group's
  C_in/groups·kh·kw terms on rows of its own and its outputs' columns beside them (a 3x3 depthwise kernel is
  9 rows of one column), so each column sums its own group's terms only, tiled, sliced and read as any
  column; ``digital`` computes them on the digital unit, exactly (the integer executor's arithmetic).
* **Digital accumulator**: the ADC codes times their steps are shifted and added tile by tile into a
  saturating ``accumulator_bits`` register; with ``free`` (non power-of-two) steps the register keeps
  :data:`~.adc.STEP_FRACTION_BITS` fraction bits beside them and the sum is rounded half to even to an
  integer once, after the last tile. The bias is added last, then requantization is the integer executor's.

Not modelled: the exact wire network (IR drop is aihwkit's first-order model), the retention of floating-gate
flash cells (charge loss is SONOS's), aihwkit's accumulated 1/f noise at time t, temperature, and any analog
activation or pooling.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from resnet8ptq.device.adc import Geometry, LayerSteps, PartialSumProfile
from resnet8ptq.device.cells import cell_digits, drift_compensation
from resnet8ptq.device.config import Crossbar
from resnet8ptq.device.effects import STEPS, Effect, ReadStream, Site, Tile, configured, on_the_chip
from resnet8ptq.device.executor import (
    EXACT_FLOAT32,
    Arithmetic,
    Ideal,
    integer_conv2d,
    stacked_conv2d,
    zero_pad,
)
from resnet8ptq.device.graph import Conv
from resnet8ptq.device.mapping import (
    dac_window,
    grouped_channels,
    input_range,
    on_crossbar,
    slices,
    tile_sizes,
    value_bits,
)


class CrossbarArithmetic(Arithmetic):
    """A layer's accumulators on :class:`Crossbar`, for one programming of the weights (one noise seed), in
    the steps of a chip: **program** the cells (slice the weights, then the ``program`` and ``perturb``
    effects of :mod:`.effects`), **read** each row tile (one convolution per tile, then the ``read`` effects),
    **convert** (the ADC, then the ``convert`` effects) and **add** digitally (shift and add the slices, the
    tiles into a saturating accumulator).

    ``dac_ranges`` (per layer name: the DAC's (low, high), :mod:`.dac`; default: the quantized input range)
    clip each layer's input before it is sliced. ``adc_steps`` (per layer name) come from
    :func:`resnet8ptq.device.evaluate.adc_steps`; with ``profile``, every partial sum is added to it
    (calibration, on the ideal crossbar). ``effects``: the non-idealities,
    by default those the crossbar's settings switch on. ``seed`` draws the chip: the cell effects, once per
    layer at its first use (``torch.Generator().manual_seed(seed)``), and, from one generator per image of
    the run (:class:`~.effects.ReadStream`, :meth:`start_batch`), the read and convert effects."""

    def __init__(
        self,
        crossbar: Crossbar,
        seed: int = 0,
        adc_steps: dict[str, LayerSteps] | None = None,
        profile: PartialSumProfile | None = None,
        effects: list[Effect] | None = None,
        dac_ranges: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.crossbar = crossbar
        self.dac_ranges = dict(dac_ranges or {})
        self.seed = seed
        self.adc_steps = dict(adc_steps or {})
        self.profile = profile
        chosen = effects if effects is not None else [e for step in STEPS for e in configured(crossbar, step)]
        self.effects = {step: [effect for effect in chosen if effect.step == step] for step in STEPS}
        self._weights: dict[str, list[tuple[torch.Tensor, int]]] = {}
        self._generator = torch.Generator().manual_seed(seed)
        self._stream: ReadStream | None = None  # the batch's read draws, one generator per image
        self._tiled: dict[str, tuple[list[tuple[slice, torch.Tensor]], float]] = {}
        self._significance: dict[str, torch.Tensor] = {}  # noisy cells: each fixed-point digit's weight
        self._cells_of_tile: dict[str, list[torch.Tensor]] = {}  # per tile: the cells as read, float64
        self._rows_of_tile: dict[str, list[torch.Tensor]] = {}  # per tile: ones on its rows, (1, C_t, kh, kw)
        self._place_of_row: dict[str, list[torch.Tensor]] = {}  # per tile: each row's place along it
        self._compensation: dict[str, float] = {}  # drift_compensation: the layer's digital scale
        self._adcs: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        self._pow2: dict[str, bool] = {}  # per layer: every ADC step a power of two
        self._inverses: dict[tuple[str, int], torch.Tensor] = {}  # per (layer, tile): 1 / its steps

    def start_batch(self, first_image: int, images: int) -> None:
        """The read draws of the run's images ``first_image`` .. on: one generator per image."""
        if self.effects["read"] or self.effects["convert"]:
            self._stream = ReadStream(self.seed, first_image, images)

    @property
    def analog_readings(self) -> bool:
        """Read or convert effects are on: partial sums and readings need not be integers."""
        return bool(self.effects["read"] or self.effects["convert"])

    def input_window(self, layer: Conv) -> tuple[int, int]:
        """The centred inputs the layer's DAC applies (:func:`dac_window`)."""
        return dac_window(layer, self.dac_ranges)

    def weight_slices(self, layer: Conv) -> list[tuple[torch.Tensor, int]]:
        """**Program**: the layer's cell columns (O, K) per weight slice with their significance, sign ·
        magnitude digit, then every cell effect (``program``, then ``perturb``; drawn once per layer and
        seed, slice by slice, lowest first)."""
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
            site = Site(self.seed, layer.name)
            programmed, perturbed = [], []
            for digit, shift in slices(magnitude, c.bits_per_cell, capacity, signed=False):
                cells, held = on_the_chip(
                    sign * digit, self.effects["program"], self.effects["perturb"], c, self._generator, site
                )
                programmed.append(cells)
                perturbed.append((held, shift))
            if c.drift_compensation:
                self._compensation[layer.name] = drift_compensation(programmed, perturbed)
            self._weights[layer.name] = perturbed
        return self._weights[layer.name]

    def geometry(self, layer: Conv) -> Geometry:
        """The layout of the layer's partial sums: tiles × weight slices × output columns."""
        slices_ = len(self.weight_slices(layer))
        return Geometry(len(tile_sizes(layer.terms, self.crossbar.rows)), slices_, len(layer.weight))

    def tiled_weights(
        self, layer: Conv, device: torch.device | None = None
    ) -> tuple[list[tuple[slice, torch.Tensor]], float]:
        """Each row tile's cells as a convolution over the input channels its rows touch: (channels, weights
        (Sw·O, C_t, kh, kw) with every weight slice stacked on the outputs, masked to the tile's rows), and
        the largest |partial sum| they can make (the largest input digit times the largest column sum of
        cells); made once per layer, on ``device``. Integer cells are read in float32 while that bound stays
        below 2^24, else in float64; cells that are not integers (a noisy chip's), as the fixed-point digits
        of :func:`cell_digits` stacked on the outputs before the weight slices (D·Sw·O outputs), each an exact
        float32 convolution whose readings :meth:`read` adds up in a fixed order."""
        if layer.name not in self._tiled:
            c = self.crossbar
            in_bits, _ = value_bits(*self.input_window(layer))
            digit_scale = 2.0 ** min(c.dac_bits, in_bits)  # above every input digit's magnitude
            cells = torch.stack([cell for cell, _ in self.weight_slices(layer)])  # (Sw, O, K)
            largest = digit_scale * max(
                float((cells[..., low:high]).abs().sum(dim=-1).max())
                for low, high in itertools.pairwise(self._bounds(layer))
            )
            integral = bool(torch.equal(cells, cells.round()))
            rows = tile_sizes(layer.terms, c.rows)[0]
            digit_bits = math.floor(math.log2(EXACT_FLOAT32 / (rows * digit_scale)))  # a digit's exact width
            if not integral and digit_bits >= 1:
                stacked, significance = cell_digits(cells, digit_bits)  # (D, Sw, O, K)
                self._significance[layer.name] = significance.to(device=device)
                read_cells = (stacked * significance.view(-1, 1, 1, 1)).sum(dim=0)  # exact: the cells as read
                dtype = torch.float32
            else:
                stacked, read_cells = cells.unsqueeze(0), cells
                dtype = torch.float32 if integral and largest < EXACT_FLOAT32 else torch.float64
            kernel = int(np.prod(layer.weight.shape[2:]))  # a channel's kh·kw rows (term order: c, kh, kw)
            tiles, masks, places, cells_of_tile = [], [], [], []
            for low, high in itertools.pairwise(self._bounds(layer)):
                channels = slice(low // kernel, -(-high // kernel))  # of a group's C_in / groups
                mask = torch.zeros(layer.terms, dtype=torch.float64)
                mask[low:high] = 1
                tiles.append((channels, (stacked * mask).reshape(-1, *layer.weight.shape[1:])[:, channels]))
                cells_of_tile.append((read_cells * mask).reshape(-1, *layer.weight.shape[1:])[:, channels])
                masks.append(mask.reshape(1, *layer.weight.shape[1:])[:, channels])
                place = torch.zeros(layer.terms, dtype=torch.float64)
                place[low:high] = torch.arange(high - low, dtype=torch.float64) / (high - low)
                places.append(place.reshape(1, *layer.weight.shape[1:])[:, channels])
            self._tiled[layer.name] = (
                [(grouped_channels(layer, ch, device), w.to(dtype=dtype, device=device)) for ch, w in tiles],
                largest,
            )
            self._cells_of_tile[layer.name] = [cell.to(device=device) for cell in cells_of_tile]
            self._rows_of_tile[layer.name] = [mask.to(device=device) for mask in masks]
            self._place_of_row[layer.name] = [place.to(device=device) for place in places]
        return self._tiled[layer.name]

    def _bounds(self, layer: Conv) -> list[int]:
        """The first term of each row tile, then the layer's term count."""
        return [int(b) for b in np.cumsum([0, *tile_sizes(layer.terms, self.crossbar.rows)])]

    def accumulate(self, layer: Conv, x: torch.Tensor) -> torch.Tensor:
        c = self.crossbar
        if not on_crossbar(layer, c):
            return Ideal().accumulate(layer, x)  # the digital unit: exact integer MACs
        n, outputs = x.shape[0], len(layer.weight)
        low, high = self.input_window(layer)
        if (low, high) != input_range(layer):
            x = x.clamp(low, high)  # the DAC's full scale: inputs beyond it are applied as its ends
        in_bits, in_signed = value_bits(low, high)
        digits, x_shifts = zip(*slices(x, c.dac_bits, in_bits, in_signed), strict=True)
        w_shifts = [shift for _, shift in self.weight_slices(layer)]
        tiles, largest = self.tiled_weights(layer, x.device)
        if self._stream is None or self._stream.images != n:
            self.start_batch(0, n)  # not run by the executor: the images count from 0
        dtype = tiles[0][1].dtype
        # The input slices stacked on the batch; each tile one convolution over the channels its rows touch,
        # with every weight slice stacked on the outputs: (Sx·N, Sw·O, H', W') partial sums per tile.
        padded = zero_pad(layer, torch.cat(digits).to(dtype))
        read_bound, integral = self.adc_bound(layer, largest)
        scale = self._compensation.get(layer.name)  # drift_compensation: the digital side scales the column
        if self.analog_readings and self.crossbar.adc_bits is None:
            read_bound = math.inf  # an ideal ADC does not bound what a read effect adds
        # The readings' sum is exact in float32 while integers stay below 2^24 (every order of summation).
        bound = len(tiles) * read_bound * sum(2.0 ** (xs + ws) for xs in x_shifts for ws in w_shifts)
        limit = 2 ** (c.accumulator_bits - 1)
        # The compensation scales each tile's columns before a saturating accumulator adds them, else (the
        # same sum but for float64's rounding) the tiles' sum once.
        scale_tiles = scale is not None and bound >= limit
        integral = integral and not scale_tiles
        sum_dtype = torch.float32 if integral and bound < EXACT_FLOAT32 else torch.float64
        x_significance = torch.tensor([2.0**xs for xs in x_shifts], dtype=sum_dtype, device=x.device)
        w_significance = torch.tensor([2.0**ws for ws in w_shifts], dtype=sum_dtype, device=x.device)
        # Power-of-two steps, the same for every input slice: the codes are shifted and added over the input
        # slices first and scaled by their column's step once, the same sum exactly (every term an integer
        # times a power of two, below 2^24 in float32), on a tensor S_x times smaller.
        deferred = len(x_shifts) > 1 and integral and self._pow2_steps(layer)
        acc, profiled = None, []
        for tile, (channels, weight) in enumerate(tiles):
            partial = self.read(layer, tile, padded[:, channels], weight)
            if self.profile is not None:
                profiled.append(partial.clone())
            read = self.convert(layer, tile, partial, scaled=not deferred)
            # Shift and add the slices (powers of two: exact), input slices as one matrix-vector product.
            read = read.to(sum_dtype).reshape(len(x_shifts), n, len(w_shifts), outputs, *read.shape[2:])
            if len(x_shifts) > 1:
                read = (x_significance @ read.reshape(len(x_shifts), -1)).reshape(read.shape[1:])
            else:
                read = read[0]
            if deferred:
                step = self.adc_columns(layer, tile, partial)[0]
                read = read.mul_(step.to(sum_dtype).reshape(1, len(w_shifts), outputs, 1, 1))
            if len(w_shifts) > 1:
                column = torch.tensordot(w_significance, read, dims=([0], [1]))  # type: ignore[arg-type]
            else:
                column = read[:, 0]  # (N, O, H', W')
            if scale_tiles:
                column = column * scale
            acc = column if acc is None else acc.add_(column)
            if bound >= limit:  # the digital accumulator adds the tiles one by one, saturating
                acc.clamp_(-limit, limit - 1)
        if self.profile is not None:
            self.profile.add(layer.name, self.geometry(layer), torch.cat(profiled, dim=1))
        if scale is not None and not scale_tiles:
            acc = acc.to(torch.float64).mul_(scale)
        if not integral or scale is not None:
            acc = torch.round(acc)  # fixed point (multiples of 2^-8) to the integer accumulator: half to even
            # back to float32 where the accumulator and its bias stay exact in it: a faster requantization
            if bound * (scale or 1.0) + float(np.abs(layer.bias).max(initial=0)) < EXACT_FLOAT32 - 1:
                acc = acc.to(torch.float32)
        return acc

    def read(self, layer: Conv, tile: int, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """**Read** one row tile: its partial sums (Sx·N, Sw·O, H', W') for the input digits ``x`` (the
        channels its rows touch), then every ``read`` effect (with Σ x² over the tile's rows where one needs
        it: :attr:`~.effects.Effect.needs_input_energy`)."""
        partial = stacked_conv2d(x, weight, layer.stride, layer.groups, len(layer.weight))
        significance = self._significance.get(layer.name)
        if significance is not None:  # noisy cells: their fixed-point digits' exact readings, added in order
            digits = partial.view(len(partial), len(significance), -1, *partial.shape[2:])
            partial = digits[:, 0] * significance[0]
            for digit, weight in enumerate(significance[1:].tolist(), start=1):
                partial.add_(digits[:, digit], alpha=weight)  # alpha: a power of two, the product exact
        if not self.effects["read"]:
            return partial
        in_bits, _ = value_bits(*self.input_window(layer))
        scale = 2.0 ** min(self.crossbar.dac_bits, in_bits)
        rows = self._rows_of_tile[layer.name][tile]
        energy = None
        if any(effect.needs_input_energy for effect in self.effects["read"]):
            # Σ x² over the tile's rows: exact in float32 below 2^24, as every sum of integers here
            exact = x.dtype == torch.float32 and float(rows.sum()) * scale**2 < EXACT_FLOAT32
            dtype = torch.float32 if exact else torch.float64
            energy = input_energy(layer, x.to(dtype).square(), rows.to(dtype), partial.shape[1])
        array = None
        if any(effect.needs_tile for effect in self.effects["read"]):
            cells, place = self._cells_of_tile[layer.name][tile], self._place_of_row[layer.name][tile]
            array = Tile(
                x, scale - 1, cells, place, int(rows.sum()), layer.stride, layer.groups, len(layer.weight)
            )
        site = Site(self.seed, layer.name, tile, input_energy=energy, array=array)
        for effect in self.effects["read"]:
            partial = effect.apply(partial, self.crossbar, self._stream, site)
        return partial

    def convert(self, layer: Conv, tile: int, partial: torch.Tensor, scaled: bool = True) -> torch.Tensor:
        """**Convert** one row tile's partial sums: every ``convert`` effect (the ADCs' own errors, on the
        partial sums at their input), then the ADCs (:meth:`adc`; ``scaled=False``: their codes)."""
        if self.effects["convert"]:
            step, low, high = (
                self.adc_columns(layer, tile, partial) if self.crossbar.adc_bits else (None, None, None)
            )
            site = Site(self.seed, layer.name, tile, adc_step=step, code_min=low, code_max=high)
            for effect in self.effects["convert"]:
                partial = effect.apply(partial, self.crossbar, self._stream, site)
        return self.adc(layer, tile, partial, scaled)

    def _pow2_steps(self, layer: Conv) -> bool:
        """Whether every ADC step of ``layer`` is a power of two (``adc_step=pow2``; a learned step may not
        be): dividing by one is multiplying by its inverse, exactly."""
        if self.crossbar.adc_bits is None:
            return False
        if layer.name not in self._pow2:
            steps = self.adc_steps[layer.name].steps
            self._pow2[layer.name] = bool(np.all(steps == np.exp2(np.round(np.log2(steps)))))
        return self._pow2[layer.name]

    def adc_bound(self, layer: Conv, largest: float) -> tuple[float, bool]:
        """The largest |reading| of the layer's ADCs and whether every reading is an integer. An ideal ADC
        rounds to an integer (which changes only noisy sums): its readings stay within ``largest`` + 1/2."""
        if self.crossbar.adc_bits is None:
            return largest + 0.5, True
        adcs = self.adc_steps[layer.name]
        bound = float(np.max(np.maximum(np.abs(adcs.code_min), np.abs(adcs.code_max)) * adcs.steps))
        return bound, adcs.integral

    def adc(self, layer: Conv, tile: int, partial: torch.Tensor, scaled: bool = True) -> torch.Tensor:
        """A tile's partial sums (Sx·N, Sw·O, H', W') as its ADCs read them, in place where it can: code =
        round(p / step), half to even, clamped to the ADC's window of codes, times the step (``scaled=False``:
        the codes); an ideal ADC rounds to an integer."""
        if self.crossbar.adc_bits is None:
            return partial.round_()
        step, low, high = self.adc_columns(layer, tile, partial)
        code = partial.to(step.dtype)
        if self._pow2_steps(layer):  # times the inverse of a power of two: the same quotient, faster
            code = code.mul_(self._inverse_steps(layer, tile, step)).round_()
        else:
            code = code.div_(step).round_()
        # clamped to each column's window: two broadcast passes are faster than clamp_ with tensor bounds
        torch.maximum(code, low, out=code)
        code = torch.minimum(code, high, out=code)
        return code.mul_(step) if scaled else code

    def _inverse_steps(self, layer: Conv, tile: int, step: torch.Tensor) -> torch.Tensor:
        key = (layer.name, tile)
        if key not in self._inverses:
            self._inverses[key] = torch.reciprocal(step)
        return self._inverses[key]

    def adc_columns(
        self, layer: Conv, tile: int, partial: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tile's ADCs: step, lowest and highest code per column, (1, Sw·O, 1, 1) each, in the type of
        its readings (made once per layer, on the partial sums' device)."""
        if layer.name not in self._adcs:
            adcs = self.adc_steps[layer.name]
            dtype = partial.dtype if adcs.integral else torch.float64  # code · (M / 2^8): exact in float64
            per_tile = partial.shape[1]

            def per_column(values: np.ndarray) -> list[torch.Tensor]:
                column = torch.from_numpy(adcs.per_column(values).astype(np.float64))
                column = column.to(dtype=dtype, device=partial.device).reshape(1, -1, 1, 1)
                return list(column.split(per_tile, dim=1))

            self._adcs[layer.name] = list(
                zip(per_column(adcs.steps), per_column(adcs.code_min), per_column(adcs.code_max), strict=True)
            )
        return self._adcs[layer.name][tile]


def input_energy(layer: Conv, squares: torch.Tensor, rows: torch.Tensor, columns: int) -> torch.Tensor:
    """Σ x² over a row tile's rows (``rows``: ones on them, (1, C_t, kh, kw)) for every reading: (Sx·N, 1, H',
    W'), the same for every column; a grouped layer's per column, (Sx·N, ``columns``, H', W'), each column
    its group's rows."""
    if layer.groups == 1:
        return integer_conv2d(squares, rows, layer.stride)
    per_group = integer_conv2d(squares, rows.repeat(layer.groups, 1, 1, 1), layer.stride, groups=layer.groups)
    outputs = len(layer.weight)
    return per_group.repeat_interleave(outputs // layer.groups, dim=1).repeat(1, columns // outputs, 1, 1)

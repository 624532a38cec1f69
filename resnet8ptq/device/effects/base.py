"""What every non-ideality of the crossbar is: the step it acts in, whether it is random, its arithmetic, and
where it acts (:class:`Site`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar

STEPS = ("program", "perturb", "read", "convert")
CELL_STEPS = ("program", "perturb")
"""Steps whose effects act on the cells (one weight slice's (O, K) levels), once per programmed chip."""


@dataclass(frozen=True)
class Tile:
    """One row tile as a read sees it, for an effect that needs the array itself
    (:attr:`Effect.needs_tile`): the input digits on its rows (Sx·N, C_t, H, W) and their full scale (the
    largest digit), its cells (Sw·O, C_t, kh, kw, zero off its rows), each row's place along the tile (0 at
    its first row, (rows - 1) / rows at its last; (1, C_t, kh, kw), zero off its rows), its row count and the
    layer's stride."""

    inputs: torch.Tensor
    input_scale: float
    cells: torch.Tensor
    place: torch.Tensor
    rows: int
    stride: tuple[int, int]
    groups: int = 1  # a grouped layer's: each column reads its group's rows (block-diagonal)
    outputs: int = 0  # the layer's output channels O (a grouped layer's)

    def read(self, inputs: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """``inputs`` (shaped as :attr:`inputs`) read through ``cells`` (as :attr:`cells`): the partial sums
        (Sx·N, Sw·O, H', W'), in float64."""
        from resnet8ptq.device.executor import stacked_conv2d

        inputs, cells = inputs.to(torch.float64), cells.to(torch.float64)
        return stacked_conv2d(inputs, cells, self.stride, self.groups, self.outputs or len(cells))


@dataclass(frozen=True)
class Site:
    """Where an effect acts: the chip (its ``seed``), the layer and, for ``read`` and ``convert``, the row
    ``tile``; a read effect that asks for it (:attr:`Effect.needs_input_energy`) gets ``input_energy``, Σ x²
    over the tile's rows for every partial sum's input digits, (Sx·N, 1, H', W'); a convert effect gets the
    tile's ADCs: ``adc_step``, ``code_min`` and ``code_max`` per column, (1, Sw·O, 1, 1); a read effect that
    needs the array gets the ``array`` (:class:`Tile`); a ``perturb`` effect gets the levels the cells were
    written to, ``written`` (O, K), before the ``program`` effects."""

    seed: int
    layer: str
    tile: int | None = None
    input_energy: torch.Tensor | None = None
    adc_step: torch.Tensor | None = None
    code_min: torch.Tensor | None = None
    code_max: torch.Tensor | None = None
    array: Tile | None = None
    written: torch.Tensor | None = None

    def chip_generator(self, effect: str) -> torch.Generator:
        """A generator for what ``effect`` draws once per chip at this site (an ADC's offset, say): seeded
        from the chip's seed, the layer, the tile and the effect's name, so that the same chip draws the same
        values in every batch and on every machine."""
        return _seeded(f"{self.seed}/{self.layer}/{self.tile}/{effect}")


class ReadStream:
    """The per-read draws of one batch: each image of the run draws from a generator of its own (seeded from
    the chip's seed and the image's index in the run), in the order its reads come, so that an image gets the
    same draws whatever batch it is in and whatever the batch size."""

    def __init__(self, seed: int, first_image: int, images: int) -> None:
        self.images = images
        self._generators = [_seeded(f"{seed}/read/{first_image + i}") for i in range(images)]

    def randn(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Standard normal draws of ``shape`` (S·N, ...): the S slices of image i are rows i, N + i, ...,
        drawn from image i's generator."""
        slices = shape[0] // self.images
        draws = [torch.randn((slices, *shape[1:]), generator=g, dtype=dtype) for g in self._generators]
        return torch.stack(draws, dim=1).reshape(shape)


def _seeded(key: str) -> torch.Generator:
    """A generator seeded from ``key``'s SHA-256 (the same on every machine)."""
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))


class Effect:
    """A non-ideality of the crossbar: the step it acts in, whether it is random, its arithmetic."""

    step: ClassVar[str]
    draws: ClassVar[bool] = False  # random: drawn from the chip's seed (device.noise_seeds draws)
    needs_input_energy: ClassVar[bool] = False  # read: Site.input_energy is computed for it
    needs_tile: ClassVar[bool] = False  # read: Site.array (the tile's inputs and cells) is given to it

    @classmethod
    def configured(cls, crossbar: Crossbar) -> Effect | None:
        """The effect with the crossbar's settings, or ``None`` when they leave it off."""
        raise NotImplementedError

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator | ReadStream, site: Site
    ) -> torch.Tensor:
        """``values`` after the effect: a weight slice's cell levels (O, K) in float64 (``program``,
        ``perturb``; ``generator``: the chip's ``torch.Generator``), a tile's partial sums (``read``) or the
        partial sums at its ADCs' input, before they round (``convert``), (Sx·N, Sw·O, H', W')
        (``generator``: the batch's :class:`ReadStream`, one generator per image)."""
        raise NotImplementedError

"""Programming noise (aihwkit: ``w_noise`` and the programming noise of its ``PCMLikeNoiseModel``): a cell
never holds exactly the level it was written to. Each cell's level gets Gaussian noise of
σ = ``weight_noise`` × the cell's full range (2^bits_per_cell - 1), drawn once per programmed chip (per
seed), so that every image runs on the same chip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from resnet8ptq.device.effects.base import Effect, Site

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar


@dataclass(frozen=True)
class ProgrammingNoise(Effect):
    """Gaussian programming noise of ``sigma`` (a fraction of a cell's range: ``device.weight_noise``)."""

    sigma: float
    step: ClassVar[str] = "program"
    draws: ClassVar[bool] = True

    @classmethod
    def configured(cls, crossbar: Crossbar) -> ProgrammingNoise | None:
        return cls(crossbar.weight_noise) if crossbar.weight_noise else None

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator, site: Site
    ) -> torch.Tensor:
        """Levels + σ·(2^bits_per_cell - 1)·n, n standard normal: one ``torch.randn`` of the levels' shape in
        float64 from the chip's generator."""
        noise = torch.randn(values.shape, generator=generator, dtype=torch.float64)
        return values + self.sigma * (2**crossbar.bits_per_cell - 1) * noise

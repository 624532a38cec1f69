"""Stuck cells: some cells no longer take the level they are written to and stay at the lowest level
(stuck-off, "stuck-at-0" in the RRAM fault literature) or the highest (stuck-on, "stuck-at-1"), fixed per
programmed chip. Neither aihwkit, CrossSim nor NeuroSim models them (docs/device.md); the fault model is the
usual one of the stuck-at-fault literature: each cell independently stuck with a probability."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from resnet8ptq.device.effects.base import Effect, Site

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar


@dataclass(frozen=True)
class StuckCells(Effect):
    """Each cell of a weight's differential pair (the positive and the negative cell) stuck at level 0 with
    probability ``off`` (``device.stuck_off``) or at the cell's top level 2^bits_per_cell - 1 with
    probability ``on`` (``device.stuck_on``), independently, drawn once per programmed chip (per seed)."""

    off: float
    on: float
    step: ClassVar[str] = "program"
    draws: ClassVar[bool] = True

    @classmethod
    def configured(cls, crossbar: Crossbar) -> StuckCells | None:
        return cls(crossbar.stuck_off, crossbar.stuck_on) if crossbar.stuck_off or crossbar.stuck_on else None

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator, site: Site
    ) -> torch.Tensor:
        """The pair's levels G+ = max(v, 0), G- = max(-v, 0) of each value v; one uniform draw u per cell
        (``torch.rand`` of shape (2, *values.shape), G+ first): stuck-off where u < off, stuck-on where
        off <= u < off + on; the value is G+ - G-."""
        top = 2**crossbar.bits_per_cell - 1
        draws = torch.rand((2, *values.shape), generator=generator, dtype=torch.float64)
        pair = torch.stack([values.clamp(min=0), (-values).clamp(min=0)])
        stuck = torch.where(draws < self.off, 0.0, torch.where(draws < self.off + self.on, float(top), pair))
        return stuck[0] - stuck[1]

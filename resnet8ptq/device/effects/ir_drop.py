"""IR drop (aihwkit: ``forward.ir_drop``, ``forward.ir_drop_g_ratio``; its first-order model,
``applyIrDrop`` in ``src/rpucuda/rpu_forward_backward_pass.cpp``): the wires' resistance lowers the voltage a
row's cell sees, the more the more current the column draws and the farther the row is along the line. In
aihwkit's normalised units (a cell's top level is 1, the DAC's largest input is 1), for a column i of a tile
of n rows read with inputs x:

    a_i = n / ir_drop_g_ratio · Σ_j |w_ij|·|x_j|,   c_i = a_i·(0.05·a_i² - 0.2·a_i + 0.5),
    y_i ← y_i - ir_drop · c_i · Σ_j w_ij·x_j·(1 - (1 - j/n)²),

j the row's place along the tile (0 at its first row). ``ir_drop_g_ratio`` is the wire's conductance from one
cell to the next over a cell's largest conductance (aihwkit's default 1 / 0.35 Ω / 5 µS = 571,428.6). A
first-order approximation: the exact network (CrossSim's parasitic-resistance solver, ``Rp_row``,
``Rp_col``) is not solved, the drop along the input lines is aihwkit's quadratic profile, and it is applied
to each input slice's read on its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from resnet8ptq.device.effects.base import Effect, Site

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar


@dataclass(frozen=True)
class IrDrop(Effect):
    """Partial sums minus aihwkit's first-order IR drop, ``scale`` (``device.ir_drop``) times the drop at
    ``g_ratio`` (``device.ir_drop_g_ratio``)."""

    scale: float
    g_ratio: float
    step: ClassVar[str] = "read"
    needs_tile: ClassVar[bool] = True

    @classmethod
    def configured(cls, crossbar: Crossbar) -> IrDrop | None:
        return cls(crossbar.ir_drop, crossbar.ir_drop_g_ratio) if crossbar.ir_drop else None

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator, site: Site
    ) -> torch.Tensor:
        tile = site.array
        assert tile is not None  # the crossbar gives it: needs_tile
        top = 2**crossbar.bits_per_cell - 1
        current = tile.read(tile.inputs.abs(), tile.cells.abs()) / (top * tile.input_scale)
        a = tile.rows / self.g_ratio * current
        c = a * (a * (0.05 * a - 0.2) + 0.5)
        placed = tile.read(tile.inputs, tile.cells * (1 - (1 - tile.place) ** 2))
        return values.to(torch.float64) - self.scale * c * placed

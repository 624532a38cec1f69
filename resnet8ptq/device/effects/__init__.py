"""The crossbar's non-idealities, one module each, in the steps a chip goes through (docs/device.md):

1. ``program``: the weights written into cells (after slicing: :mod:`.programming_noise`,
   :mod:`.stuck_cells`);
2. ``perturb``: the programmed cells changed over time before they are read (:mod:`.drift`,
   :mod:`.charge_loss`);
3. ``read``: a tile's analog partial sums as the array produces them (:mod:`.ir_drop`, :mod:`.read_noise`);
4. ``convert``: the partial sums at the ADC's input, before it rounds them (:mod:`.adc_errors`).

An effect is a frozen dataclass of its parameters (aihwkit's vocabulary) built from the crossbar's settings by
:meth:`Effect.configured` (``None`` when the settings leave it off: every effect is off on the ideal crossbar,
so :meth:`~resnet8ptq.device.config.Crossbar.ideal` switches it off without an edit), and one method,
:meth:`Effect.apply`. :mod:`resnet8ptq.device.cim` runs the configured effects of each step in the order of
:data:`EFFECTS`. Adding a non-ideality is a module here, its settings on
:class:`~resnet8ptq.device.config.Crossbar` (with ``draws`` in their metadata when it is random), its line in
:data:`EFFECTS` and its section in docs/device.md.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from resnet8ptq.device.effects.adc_errors import AdcErrors
from resnet8ptq.device.effects.base import CELL_STEPS, STEPS, Effect, ReadStream, Site, Tile
from resnet8ptq.device.effects.charge_loss import ChargeLoss
from resnet8ptq.device.effects.drift import Drift
from resnet8ptq.device.effects.ir_drop import IrDrop
from resnet8ptq.device.effects.programming_noise import ProgrammingNoise
from resnet8ptq.device.effects.read_noise import ReadNoise
from resnet8ptq.device.effects.stuck_cells import StuckCells

if TYPE_CHECKING:
    import torch

    from resnet8ptq.device.config import Crossbar

__all__ = [
    "CELL_STEPS",
    "EFFECTS",
    "STEPS",
    "AdcErrors",
    "ChargeLoss",
    "Drift",
    "Effect",
    "IrDrop",
    "ProgrammingNoise",
    "ReadNoise",
    "ReadStream",
    "Site",
    "StuckCells",
    "Tile",
    "configured",
    "on_the_chip",
]

EFFECTS: tuple[type[Effect], ...] = (
    ProgrammingNoise,
    StuckCells,
    Drift,
    ChargeLoss,
    IrDrop,
    ReadNoise,
    AdcErrors,
)
"""Every non-ideality, in the order they act within a step."""


def configured(crossbar: Crossbar, step: str) -> list[Effect]:
    """The effects ``crossbar``'s settings switch on in ``step``, in :data:`EFFECTS` order."""
    if step not in STEPS:
        raise ValueError(f"step {step!r}: expected one of {', '.join(STEPS)}.")
    found = (effect.configured(crossbar) for effect in EFFECTS if effect.step == step)
    return [effect for effect in found if effect is not None]


def on_the_chip(
    written: torch.Tensor,
    program: list[Effect],
    perturb: list[Effect],
    crossbar: Crossbar,
    generator: torch.Generator,
    site: Site,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cells ``written`` (signed levels, (O, K), float64) as a programmed chip holds them: after the
    ``program`` effects, and after the ``perturb`` effects too (which see the ``written`` levels: drift's nu),
    all drawn from ``generator`` in that order."""
    programmed = written
    for effect in program:
        programmed = effect.apply(programmed, crossbar, generator, site)
    held, perturbed_site = programmed, dataclasses.replace(site, written=written)
    for effect in perturb:
        held = effect.apply(held, crossbar, generator, perturbed_site)
    return programmed, held

"""What every non-ideality of the crossbar is: the step it acts in, whether it is random, its arithmetic."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

    from resnet8ptq.device.config import Crossbar

STEPS = ("program", "perturb", "read", "convert")
CELL_STEPS = ("program", "perturb")
"""Steps whose effects act on the cells (one weight slice's (O, K) levels), once per programmed chip."""


class Effect:
    """A non-ideality of the crossbar: the step it acts in, whether it is random, its arithmetic."""

    step: ClassVar[str]
    draws: ClassVar[bool] = False  # random: drawn from the chip's seed (device.noise_seeds draws)

    @classmethod
    def configured(cls, crossbar: Crossbar) -> Effect | None:
        """The effect with the crossbar's settings, or ``None`` when they leave it off."""
        raise NotImplementedError

    def apply(self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator) -> torch.Tensor:
        """``values`` after the effect: a weight slice's cell levels (O, K) in float64 (``program``,
        ``perturb``), a tile's partial sums (``read``) or ADC readings (``convert``), (Sx·N, Sw·O, H', W')."""
        raise NotImplementedError

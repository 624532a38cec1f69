"""Read noise (aihwkit: ``forward.w_noise`` with ``WeightNoiseType.ADDITIVE_CONSTANT``; CrossSim's
``read_noise``): every read sees each cell's level plus fresh Gaussian noise of σ = ``read_noise`` × the
cell's range (2^bits_per_cell - 1), independent from read to read. A partial sum Σ_j w_j·x_j then carries
noise of σ·sqrt(Σ_j x_j²) (aihwkit's output-referred form: ``w_noise · ‖x‖₂ · ξ``), drawn per partial sum:
per image, row tile, input and weight slice, column and output position."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from resnet8ptq.device.effects.base import Effect, ReadStream, Site

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar


@dataclass(frozen=True)
class ReadNoise(Effect):
    """Partial sums + σ·(2^bits_per_cell - 1)·sqrt(Σ x²)·n, n standard normal per partial sum."""

    sigma: float
    step: ClassVar[str] = "read"
    draws: ClassVar[bool] = True
    needs_input_energy: ClassVar[bool] = True

    @classmethod
    def configured(cls, crossbar: Crossbar) -> ReadNoise | None:
        return cls(crossbar.read_noise) if crossbar.read_noise else None

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: ReadStream, site: Site
    ) -> torch.Tensor:
        """A standard normal draw per partial sum (float32, each image's read stream), in the type of the
        partial sums: float32 readings round to 24 significant bits, elementwise and so the same on every
        kernel, far below the noise that makes them non-integers."""
        assert site.input_energy is not None  # the crossbar computes it: needs_input_energy
        noise = generator.randn(values.shape, torch.float32)
        noise = noise.to(device=values.device, dtype=values.dtype)
        scale = site.input_energy.to(values.dtype).sqrt_().mul_(self.sigma * (2**crossbar.bits_per_cell - 1))
        return noise.mul_(scale).add_(values)

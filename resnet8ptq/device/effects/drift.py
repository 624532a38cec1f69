"""Conductance drift (aihwkit's inference noise models; phase-change memory): a programmed cell's
conductance decays as a power of the time since programming, G(t) = G(t0)·(t / t0)^(-nu) with
t = t_inference + t0 (aihwkit: ``t_0`` = 20 s, the first read after programming), nu drawn once per cell and
programmed chip. Two forms of nu:

* ``constant`` (aihwkit's ``StateIndependentNoiseModel``): nu = |N(drift_nu_mean, drift_nu_std)|;
* ``pcm`` (aihwkit's ``PCMLikeNoiseModel.generate_drift_coefficients``, fitted to PCM by Nandakumar et al.,
  ICECS 2019): nu = |N(μ(ĝ), σ(ĝ))| with ĝ = |level| / (2^bits_per_cell - 1),
  μ = clamp(-0.0155·ln ĝ + 0.0244, 0.049, 0.1), σ = clamp(-0.0125·ln ĝ - 0.0059, 0.008, 0.045).

As aihwkit, ``pcm`` draws nu from the level the cell was written to (its target conductance), not the one
programming left (noise, stuck cells); a weight whose sign programming flipped sits on the pair's other cell,
written to 0, and drifts with that cell's nu (aihwkit re-splits the programmed weight over the pair before
drifting it). aihwkit's accumulated 1/f noise at time t is not part of this effect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from resnet8ptq.device.effects.base import Effect, Site

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar

PCM_NU = {"mu": (-0.0155, 0.0244, 0.049, 0.1), "sigma": (-0.0125, -0.0059, 0.008, 0.045)}
"""aihwkit's PCMLikeNoiseModel: (slope of ln ĝ, intercept, lower clamp, upper clamp) of nu's mean and σ."""
SMALLEST_LEVEL = 1e-7  # aihwkit's _ZERO_CLIP: ĝ is clamped from below before its logarithm


@dataclass(frozen=True)
class Drift(Effect):
    """Every cell's level × ((t_inference + t0) / t0)^(-nu), nu per cell (``model``: constant or pcm)."""

    model: str
    t_inference: float
    t0: float
    nu_mean: float
    nu_std: float
    step: ClassVar[str] = "perturb"
    draws: ClassVar[bool] = True

    @classmethod
    def configured(cls, crossbar: Crossbar) -> Drift | None:
        if crossbar.drift == "none":
            return None
        c = crossbar
        return cls(c.drift, c.t_inference, c.drift_t0, c.drift_nu_mean, c.drift_nu_std)

    def nu(
        self,
        values: torch.Tensor,
        crossbar: Crossbar,
        generator: torch.Generator,
        written: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Each cell's drift exponent: |μ + σ·n|, n one ``torch.randn`` of the levels' shape (float64); under
        ``pcm`` μ and σ from the level ``written`` to the cell of the pair that ``values`` (the programmed
        levels) sit on: ``written`` where the signs agree, 0 where programming flipped the sign (``values``
        itself when ``written`` is not given)."""
        normal = torch.randn(values.shape, generator=generator, dtype=torch.float64)
        if self.model == "constant":
            return (self.nu_mean + self.nu_std * normal).abs()
        target = values.abs() if written is None else torch.where(values >= 0, written, -written).clamp(min=0)
        level = (target / (2**crossbar.bits_per_cell - 1)).clamp(min=SMALLEST_LEVEL).log()
        (a, b, low, high), (c, d, s_low, s_high) = PCM_NU["mu"], PCM_NU["sigma"]
        mu, sigma = (a * level + b).clamp(low, high), (c * level + d).clamp(s_low, s_high)
        return (mu + sigma * normal).abs()

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator, site: Site
    ) -> torch.Tensor:
        ratio = (self.t_inference + self.t0) / self.t0
        return values * ratio ** -self.nu(values, crossbar, generator, site.written)

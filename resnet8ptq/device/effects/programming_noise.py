"""Programming noise (aihwkit: ``w_noise`` and the programming noise of its ``PCMLikeNoiseModel``; CrossSim's
``programming_error``): a cell never holds exactly the level it was written to. Each cell's level gets
Gaussian noise drawn once per programmed chip (per seed), so that every image runs on the same chip; its σ,
in levels, by ``weight_noise_model``:

* ``constant``: σ = ``weight_noise`` × the cell's full range (2^bits_per_cell - 1);
* ``proportional`` (CrossSim's ``NormalProportionalDevice``: an error relative to the target, as a
  write-verify loop tunes a flash cell to within a fraction of its target current): σ = ``weight_noise`` ×
  |level|;
* ``pcm`` (aihwkit's ``PCMLikeNoiseModel.apply_programming_noise_to_conductance``, ``prog_coeff`` fitted to
  PCM by Nandakumar et al., ICECS 2019): σ = ``weight_noise`` × (0.26348 + 1.9650·ĝ - 1.1731·ĝ²) / 25 × the
  range, ĝ = |level| / range (aihwkit's σ in µS at g_max = 25 µS; ``weight_noise`` is its
  ``prog_noise_scale``, 1 as published), as aihwkit applies it: on **both** cells of the pair, the empty one
  (target 0, σ = 1.05 % of the range) included, each clamped at 0 (no negative conductance), the weight
  their difference;
* ``pcm_signed``: the same σ on the pair's signed level (below), the empty cell noiseless, nothing clamped
  (this tool's ``pcm`` before issue 62);
* ``sonos`` (CrossSim's ``simulator/devices/custom/SONOS.py`` at t = 0, fitted to 40 nm SONOS by Agrawal
  et al., IEDM 2022): σ = ``weight_noise`` × A·(1 - exp(-I/B)) / Imax × the range, I = ĝ·Imax the drain
  current, A = 19.88665 nA, B = 176.3115 nA, Imax = 0.06 V / 35 kΩ (CrossSim's DNN read voltage for SONOS
  and ``SONOS-TCAS.json``'s Rmin).

Except under ``pcm``, the noise acts on the pair's signed level (sign × digit): the cell of the pair that
holds nothing gets none, and no level is clamped at zero."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from resnet8ptq.device.effects.base import Effect, Site

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar

PCM_PROG_COEFF = (0.26348, 1.9650, -1.1731)  # aihwkit PCMLikeNoiseModel.prog_coeff, µS at g_max = 25 µS
PCM_G_MAX = 25.0
SONOS_A, SONOS_B = 19.88665, 176.3115  # CrossSim SONOS.py, programming error at t = 0 (nA)
SONOS_I_MAX = 0.06 / 35e3 * 1e9  # nA: Vread 0.06 V (inference_net.py) over Rmin 35 kΩ (SONOS-TCAS.json)


@dataclass(frozen=True)
class ProgrammingNoise(Effect):
    """Gaussian programming noise: ``sigma`` (``device.weight_noise``) a fraction of a cell's range, or the
    scale of a device's level-dependent σ (``model``: ``device.weight_noise_model``)."""

    sigma: float
    model: str = "constant"
    step: ClassVar[str] = "program"
    draws: ClassVar[bool] = True

    @classmethod
    def configured(cls, crossbar: Crossbar) -> ProgrammingNoise | None:
        if not crossbar.weight_noise:
            return None
        return cls(crossbar.weight_noise, crossbar.weight_noise_model)

    def relative_sigma(self, level: torch.Tensor) -> torch.Tensor | float:
        """σ as a fraction of the cell's range at the relative level ĝ (0..1) the cell was written to."""
        if self.model in ("pcm", "pcm_signed"):
            c0, c1, c2 = PCM_PROG_COEFF
            return self.sigma * (c0 + c1 * level + c2 * level**2) / PCM_G_MAX
        if self.model == "sonos":
            current = level * SONOS_I_MAX
            return self.sigma * SONOS_A * (1 - torch.exp(-current / SONOS_B)) / SONOS_I_MAX
        if self.model == "proportional":
            return self.sigma * level
        return self.sigma

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator, site: Site
    ) -> torch.Tensor:
        """Levels + σ(ĝ)·(2^bits_per_cell - 1)·n, n standard normal: one ``torch.randn`` of the levels' shape
        in float64 from the chip's generator; under ``pcm`` each cell of the pair (the positive one's draw
        first) gets its own noise and is clamped at 0, the level their difference."""
        full = 2**crossbar.bits_per_cell - 1
        if self.model != "pcm":
            noise = torch.randn(values.shape, generator=generator, dtype=torch.float64)
            return values + self.relative_sigma(values.abs() / full) * full * noise
        programmed = []
        for cell in (values.clamp(min=0), (-values).clamp(min=0)):
            noise = torch.randn(values.shape, generator=generator, dtype=torch.float64)
            programmed.append((cell + self.relative_sigma(cell / full) * full * noise).clamp(min=0))
        return programmed[0] - programmed[1]

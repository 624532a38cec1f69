"""Charge loss of charge-trap (SONOS) cells over the time since programming, as Sandia's CrossSim models the
40 nm SONOS of Agrawal et al., IEDM 2022 (``simulator/devices/custom/SONOS.py``, ``_interpolate_drift``,
``drift_error``), fitted to 128K devices measured 1 to 5 days after programming. With the cell's drain
current I = ĝ·Imax (nA; ĝ = |level| / (2^bits_per_cell - 1), Imax as in :mod:`.programming_noise`) and t the
time in days:

* the mean moves by Σ_k p_k(t)·I^k, a 10th-degree polynomial whose coefficients were fitted at t = 1..5
  days (0 at t = 0) and are interpolated linearly between them (extrapolated past 5 days, where CrossSim
  warns that they are not guaranteed);
* the spread grows: σ_I(t) = A(t)·(1 - exp(-I/B(t))), A and B interpolated the same way (A = 19.88665,
  B = 176.3115 at t = 0: the programming error).

CrossSim draws the whole error at time t from the target level instead of the programming error. Here the
``program`` step has drawn the error at t = 0 (``weight_noise_model=sonos``); this effect moves the mean and
adds the spread's growth, sqrt(σ_I(t)² - σ_I(0)²) (σ_I(t) at the moved current, σ_I(0) at the programmed one),
drawn once per cell and programmed chip. A cell's current stays >= 0; the pair's empty cell (level 0) stays
empty. CrossSim's drift model needs Imax <= 1800 nA; the preset's 1714 nA is within it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from resnet8ptq.device.effects.base import Effect, Site
from resnet8ptq.device.effects.programming_noise import SONOS_I_MAX

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar

DAYS = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
POLYNOMIALS = np.array(  # CrossSim SONOS.py: the mean drift's coefficients p_0 .. p_10 at each day
    [
        [0.0] * 11,
        [1.72684e-01, 5.72552e-02, -6.85715e-04, 3.50271e-06, -9.37682e-09, 1.40575e-11, -1.19803e-14,
         5.41293e-18, -8.85448e-22, -1.66869e-25, 5.95180e-29],
        [2.50712e-01, 6.62195e-02, -6.83218e-04, 2.99442e-06, -6.78255e-09, 7.70482e-12, -3.04983e-15,
         -2.15919e-18, 2.94617e-21, -1.23359e-24, 1.85329e-28],
        [-1.75300e-02, 9.76883e-02, -9.63791e-04, 4.55551e-06, -1.22391e-08, 1.93786e-11, -1.85899e-14,
         1.07659e-17, -3.58211e-21, 5.96785e-25, -3.30410e-29],
        [4.03338e-02, 1.03111e-01, -1.04740e-03, 4.83961e-06, -1.28132e-08, 1.99484e-11, -1.85139e-14,
         1.00008e-17, -2.84944e-21, 3.01008e-25, 1.18747e-29],
        [3.19927e-01, 1.06596e-01, -1.04054e-03, 4.50290e-06, -1.10352e-08, 1.56477e-11, -1.27592e-14,
         5.45513e-18, -7.26841e-22, -2.43893e-25, 7.14608e-29],
    ]
)  # fmt: skip
SPREAD_A = np.array([19.88665, 25.59102, 28.72753, 31.04318, 33.76214, 34.57909])  # nA
SPREAD_B = np.array([176.3115, 186.85544, 193.56834, 198.90332, 204.77023, 207.34309])  # nA
SECONDS_PER_DAY = 86_400.0


def at_day(values: np.ndarray, day: float) -> np.ndarray:
    """``values`` (one row per day of :data:`DAYS`) at ``day``: linear between the measured days,
    extrapolated from the last two past them (scipy's ``interp1d(..., fill_value="extrapolate")``)."""
    i = min(max(int(np.searchsorted(DAYS, day, side="right")) - 1, 0), len(DAYS) - 2)
    weight = (day - DAYS[i]) / (DAYS[i + 1] - DAYS[i])
    return values[i] + weight * (values[i + 1] - values[i])


@dataclass(frozen=True)
class ChargeLoss(Effect):
    """SONOS cells ``t_inference`` seconds after programming (``device.charge_loss=sonos``)."""

    t_inference: float
    step: ClassVar[str] = "perturb"
    draws: ClassVar[bool] = True

    @classmethod
    def configured(cls, crossbar: Crossbar) -> ChargeLoss | None:
        return cls(crossbar.t_inference) if crossbar.charge_loss == "sonos" else None

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: torch.Generator, site: Site
    ) -> torch.Tensor:
        """The mean shift, then one ``torch.randn`` of the levels' shape (float64) from the chip's generator
        times the spread's growth; a no-op at t = 0 (but for the draw)."""
        day = self.t_inference / SECONDS_PER_DAY
        full = 2**crossbar.bits_per_cell - 1
        current = values.abs() / full * SONOS_I_MAX
        normal = torch.randn(values.shape, generator=generator, dtype=torch.float64)
        if day == 0:
            return values
        coefficients = at_day(POLYNOMIALS, day)
        shift = sum(float(p) * current**k for k, p in enumerate(coefficients))
        moved = current + shift
        spread_now = float(at_day(SPREAD_A, day)) * (1 - torch.exp(-moved / float(at_day(SPREAD_B, day))))
        spread_then = SPREAD_A[0] * (1 - torch.exp(-current / SPREAD_B[0]))
        growth = (spread_now**2 - spread_then**2).clamp(min=0).sqrt()
        after = (moved + growth * normal).clamp(min=0)
        return torch.sign(values) * after / SONOS_I_MAX * full

"""An ADC's own errors, acting on the partial sum before the ADC rounds it (CrossSim's circuit ADC
models, ``simulator/circuits/adc/``, produce them from comparator offsets, capacitor mismatch and finite
amplifier gain; aihwkit's ``forward.out_noise`` is the noise at the ADC's input). In units of the ADC's
step (LSB), for each ADC (every column of every row tile, ``adc_granularity`` aside: the errors are the
circuit's, the ranges the calibration's):

* **offset** ~ N(0, ``adc_offset``) LSB and **gain error** ~ N(0, ``adc_gain``) (relative), drawn once per
  ADC and programmed chip;
* **integral non-linearity** (INL): a smooth bow of ``adc_inl`` LSB at mid-window, zero at both ends of its
  window of codes: ``adc_inl``·4·f·(1 - f), f the reading's place in the window (0..1);
* **noise at the input** ~ N(0, ``adc_noise``) LSB, per conversion.

reading = (p/step·(1 + gain) + offset + INL + noise)·step, then the ADC rounds and clamps as always."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from resnet8ptq.device.effects.base import Effect, ReadStream, Site

if TYPE_CHECKING:
    from resnet8ptq.device.config import Crossbar


@dataclass(frozen=True)
class AdcErrors(Effect):
    """Per-ADC offset and gain error, INL and input noise (``device.adc_offset``, ``adc_gain``, ``adc_inl``,
    ``adc_noise``), in LSB of each ADC's step."""

    offset: float
    gain: float
    inl: float
    noise: float
    step: ClassVar[str] = "convert"
    draws: ClassVar[bool] = True

    @classmethod
    def configured(cls, crossbar: Crossbar) -> AdcErrors | None:
        c = crossbar
        errors = (c.adc_offset, c.adc_gain, c.adc_inl, c.adc_noise)
        return cls(*errors) if any(errors) else None

    def apply(
        self, values: torch.Tensor, crossbar: Crossbar, generator: ReadStream, site: Site
    ) -> torch.Tensor:
        """Offsets then gain errors: two ``torch.randn`` of the tile's columns from the site's chip generator
        (:meth:`Site.chip_generator`, the same in every batch); the input noise: one ``torch.randn`` of the
        partial sums' shape from each image's read stream."""
        assert site.adc_step is not None and site.code_min is not None and site.code_max is not None
        step = site.adc_step.to(torch.float64)
        lsb = values.to(torch.float64) / step
        chip = site.chip_generator("adc_errors")
        columns = values.shape[1]
        offset = self.offset * torch.randn(columns, generator=chip, dtype=torch.float64)
        gain = self.gain * torch.randn(columns, generator=chip, dtype=torch.float64)
        lsb = lsb * (1 + gain.to(lsb.device).view(1, -1, 1, 1)) + offset.to(lsb.device).view(1, -1, 1, 1)
        if self.inl:
            low, high = site.code_min.to(torch.float64), site.code_max.to(torch.float64)
            place = ((lsb - low) / (high - low)).clamp(0, 1)
            lsb = lsb + self.inl * 4 * place * (1 - place)
        if self.noise:
            normal = generator.randn(values.shape, torch.float64).to(lsb.device)
            lsb = lsb + self.noise * normal
        return lsb * step

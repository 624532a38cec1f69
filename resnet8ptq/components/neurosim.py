"""NeuroSim's ADC as an ``hwcomponents`` model for ``components.adc_model=neurosim``, an opt-in: the
hwcomponents-neurosim package carries NeuroSim V1.3's code, licensed CC BY-NC 4.0 (non-commercial use only),
so it is never a dependency of this project (``make neurosim`` installs it: scripts/install-neurosim)."""

from __future__ import annotations

from functools import cache
from typing import ClassVar

NEUROSIM_ARRAY = {"rows": 128, "cols": 128, "cols_active_at_once": 16}
"""The array :class:`NeuroSimADC` asks hwcomponents-neurosim about: 128 x 128 cells, 16 ADCs."""


@cache
def neurosim_adc_class() -> type:
    """:class:`NeuroSimADC`, defined on first use (``hwcomponents_neurosim`` is an opt-in: CC BY-NC 4.0)."""
    import hwcomponents_neurosim
    from hwcomponents import ActionCost, ComponentModel, action
    from hwcomponents_neurosim import ADC

    class NeuroSimADC(ComponentModel):
        """One ADC of a NeuroSim V1.3 array (hwcomponents-neurosim's ``ADC``, NeuroSim's multilevel sense
        amplifier, by default a flash ADC): the energy of one conversion, the area and leakage of one of the
        :data:`NEUROSIM_ARRAY`'s ADCs. NeuroSim's figures for a conversion do not depend on the array's
        rows and columns, the cell file, the read pulse or the mean input and cell levels (checked with
        hwcomponents-neurosim 1.0.43 at 22 nm, 5 bits); the ADCs' area and leakage grow with their number, so
        one is the array's over its ADCs. Its latency is ``rate``'s: the hwcomponents interface gives none
        for a conversion."""

        component_name: ClassVar[list[str]] = ["neurosim_adc"]
        priority = 0.5

        def __init__(self, tech_node: float, resolution: int, rate: float) -> None:
            cell = hwcomponents_neurosim.__path__[0]
            array = ADC(
                tech_node=tech_node, cycle_period=1 / rate, cell_config=f"{cell}/cells/placeholder.cell",
                average_input_value=0.5, average_cell_value=0.5, read_pulse_width=1 / rate,
                adc_resolution=resolution, **NEUROSIM_ARRAY,
            )  # fmt: skip
            adcs = NEUROSIM_ARRAY["cols_active_at_once"]
            self.conversion, self.rate = float(array.read().energy), rate
            super().__init__(area=array.area / adcs, leak_power=array.leak_power / adcs)

        @action
        def convert(self) -> ActionCost:
            """One conversion."""
            return ActionCost(energy=self.conversion, latency=1 / self.rate, throughput=self.rate)

    NeuroSimADC.__module__ = __name__
    return NeuroSimADC

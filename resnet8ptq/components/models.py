"""The component models a chip is costed with, each asked once per set of attributes: the Accelergy project's
``hwcomponents`` packages (MIT), used as their docs show, a model class built with its attributes and asked
for an action's :class:`~hwcomponents.ActionCost`, its area and its leakage power.

* ``hwcomponents_adc.ADC``: ADCs fitted to Murmann's ADC survey (Andrulis et al., arXiv 2404.06553);
* ``hwcomponents_library``: components of published chips (ISAAC's ADC, DAC and shift-add, Brahms' DAC,
  NeuRRAM's neuron, Aladdin's adders, multipliers and integer MACs, a wire as a capacitor charged to its
  voltage);
* :class:`ResistiveCell`, written here: no permissively licensed package models a memory cell's read
  (CiMLoop takes it from NeuroSim, CC BY-NC), so the cell is an ``hwcomponents`` model of its own, Ohm's
  law over the read pulse with the cell's figures from :func:`~resnet8ptq.components.cells.cell_figures`.

hwcomponents-library 1.0.58's ``__init__`` imports five modules that import ``hwcomponents_neurosim``, which
it does not declare; without NeuroSim installed the package does not import. Its permissive modules
(:data:`LIBRARY_MODULES`) are then imported with the package's ``__init__`` skipped (:func:`_library`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import ClassVar

from resnet8ptq.components.cells import cell_figures

LIBRARY_MODULES = ("aladdin", "brahms", "isaac", "misc", "neurram")
"""The hwcomponents-library modules these costs use (none imports NeuroSim)."""


@dataclass(frozen=True)
class Part:
    """One component as its model answers: the cost of one action and of one unit."""

    component: str  # what it is on the chip (adc, dac, word_line, ...)
    model: str  # package.Class
    attributes: str  # what the model was asked with
    action: str
    energy: float  # J per action
    latency: float  # s per action
    area: float  # m² per unit
    leak_power: float  # W per unit

    def row(self) -> dict[str, object]:
        """The part as one row of ``device/components.csv`` (SI units)."""
        return dict(vars(self))


@cache
def _library() -> dict[str, object]:
    """hwcomponents-library's permissive modules by name (see the module's docstring for why not via its
    package)."""
    try:
        importlib.import_module("hwcomponents_library")
    except ModuleNotFoundError as err:
        if err.name != "hwcomponents_neurosim":
            raise
        for name in [name for name in sys.modules if name.startswith("hwcomponents_library")]:
            del sys.modules[name]
        for package in ("hwcomponents_library", "hwcomponents_library.library"):  # without their __init__
            spec = importlib.util.find_spec(package)
            sys.modules[package] = importlib.util.module_from_spec(spec)
    return {name: importlib.import_module(f"hwcomponents_library.library.{name}") for name in LIBRARY_MODULES}


def versions(neurosim: bool = False) -> str:
    """The component packages' versions (and hwcomponents-neurosim's, where it is used), for the run's tag."""
    names = ("hwcomponents", "hwcomponents-adc", "hwcomponents-library") + (
        ("hwcomponents-neurosim",) * neurosim
    )
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in names)


def _model_class(path: str) -> type:
    """``package.Class`` of the component models (the library's through :func:`_library`;
    ``resnet8ptq``'s own :class:`ResistiveCell` and NeuroSim's ADC, :mod:`.neurosim`)."""
    package, name = path.rsplit(".", 1)
    if package.startswith("hwcomponents_library."):
        return getattr(_library()[package.rsplit(".", 1)[1]], name)
    if package == __name__:
        return resistive_cell_class()
    if package == "resnet8ptq.components.neurosim":
        from resnet8ptq.components.neurosim import neurosim_adc_class

        return neurosim_adc_class()
    return getattr(importlib.import_module(package), name)


@lru_cache(maxsize=1024)
def part(component: str, model: str, action: str, attributes: tuple, arguments: tuple = ()) -> Part:
    """``component`` as ``model`` (``package.Class``) built with ``attributes`` answers for one ``action``
    called with ``arguments`` (both ``(name, value)`` pairs), cached: a sweep asks each once."""
    instance = _model_class(model)(**dict(attributes))
    cost = getattr(instance, action)(**dict(arguments))
    shown = ", ".join(
        f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}" for name, value in attributes
    )
    return Part(
        component=component,
        model=model,
        attributes=shown + ("; " + ", ".join(f"{n}={v:.4g}" for n, v in arguments) if arguments else ""),
        action=action,
        energy=float(cost.energy),
        latency=float(cost.latency),
        area=float(instance.area),
        leak_power=float(instance.leak_power),
    )


@cache
def resistive_cell_class() -> type:
    """:class:`ResistiveCell`, defined on first use (``hwcomponents`` is imported only when a run is
    costed)."""
    from hwcomponents import ActionCost, ComponentModel, action

    class ResistiveCell(ComponentModel):
        """A memory cell (``cell``: its figures from :func:`~resnet8ptq.components.cells.cell_figures`)
        read with pulse-width inputs: a driven row holds ``read_voltage`` for ``input_level`` of the read
        pulse, and the cell conducts ``1/off + cell_level (1/on - 1/off)``, so a read takes V² G t_pulse
        input_level (the mean input and cell levels of a layer give its mean read). Area: height x width
        feature sizes of the technology node."""

        component_name: ClassVar[list[str]] = ["memory_cell", "resistive_cell"]
        priority = 0.5

        def __init__(self, tech_node: float, cell: str) -> None:
            figures = cell_figures(cell)
            self.on_conductance, self.off_conductance = 1 / figures.on_resistance, 1 / figures.off_resistance
            self.read_voltage, self.read_pulse = figures.read_voltage, figures.read_pulse
            super().__init__(area=figures.height * figures.width * tech_node**2, leak_power=0.0)

        @action
        def read(self, input_level: float = 1.0, cell_level: float = 1.0) -> ActionCost:
            """One cell read: the cell's current over the part of the pulse its row is driven."""
            conductance = self.off_conductance + cell_level * (self.on_conductance - self.off_conductance)
            energy = self.read_voltage**2 * conductance * self.read_pulse * input_level
            return ActionCost(energy=energy, latency=self.read_pulse, throughput=1 / self.read_pulse)

    ResistiveCell.__module__ = __name__
    return ResistiveCell

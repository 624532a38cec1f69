"""The contract of a PTQ algorithm (the `algo` group): what it is called, where it runs among the steps, its
parameters, and the transform of the FP32 ONNX model; and what the steps hand the backend (:class:`Prepared`).

An algorithm is one module in ``resnet8ptq/algorithms/`` defining one :class:`Algorithm` subclass; defining
it registers it (:func:`registered`). Keep heavy imports (onnx, torch) inside its functions: the registry
imports every algorithm module when the config is composed.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from resnet8ptq.spec import QuantSpec, TensorRange

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from resnet8ptq.device.adc import LayerSteps
    from resnet8ptq.device.config import Crossbar


_REGISTRY: dict[str, type[Algorithm]] = {}


@dataclass(frozen=True)
class Context:
    """What an algorithm may use besides the model: the calibration images (NHWC float32 raw 0-255), the
    quantization it prepares the model for, the run's seed (``data.seed``) and, with
    ``algo.device_aware=true``, the crossbar to learn against (what the learning sees of it:
    :meth:`~resnet8ptq.device.config.Crossbar.learned`); and where it leaves the activation ranges it
    learned (``ranges``: ONNX tensor -> (min, max)), which the backends then use instead of calibrating
    those tensors, and the ADC steps it learned (``adc_steps``: layer -> steps), which the device uses with
    ``device.adc_range=learned``."""

    images: np.ndarray
    spec: QuantSpec
    seed: int = 0
    crossbar: Crossbar | None = None
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    adc_steps: dict[str, LayerSteps] = field(default_factory=dict)


class Algorithm(ABC):
    """One PTQ algorithm. Subclasses set :attr:`NAME`, :attr:`STAGE` and, if it has any, :attr:`Parameters`,
    and implement :meth:`apply`."""

    NAME: ClassVar[str]
    """Its name in ``algo.steps``, in option names (``cle_adaround``) and in tags (``algo.<NAME>_...``)."""
    STAGE: ClassVar[int]
    """Steps run in the order of their stages; algorithms of the same stage are alternatives (at most one
    of them per run), e.g. two ways of rounding the weights."""
    DEVICE_AWARE: ClassVar[bool] = False
    """It can learn against the run's crossbar (``algo.device_aware=true``: :attr:`Context.crossbar`)."""
    Parameters: ClassVar[type | None] = None
    """A dataclass of its settings with their defaults (the single place they are written), validated in
    its ``__post_init__``; the `algo` config holds them as ``algo.<NAME>_<field>``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.NAME in _REGISTRY and _REGISTRY[cls.NAME] is not cls:
            raise TypeError(f"Two algorithms named {cls.NAME!r}: {_REGISTRY[cls.NAME]} and {cls}.")
        _REGISTRY[cls.NAME] = cls

    def __init__(self, parameters: Any = None) -> None:
        self.parameters = parameters

    @abstractmethod
    def apply(self, model: onnx.ModelProto, context: Context) -> dict[str, str]:
        """Transform ``model`` in place; return what it did as tags, named without the ``algo.`` prefix."""


def registered() -> dict[str, type[Algorithm]]:
    """The algorithms defined so far, by name, in the order of their stages (then names)."""
    return dict(sorted(_REGISTRY.items(), key=lambda item: (item[1].STAGE, item[0])))


@dataclass(frozen=True)
class Prepared:
    """The FP32 model the backend quantizes, the algorithms' seconds, what they did (run tags), the
    activation ranges they learned (ONNX tensor -> (min, max): the backend stores these, not calibrated
    ones) and the ADC steps learned against a crossbar (layer -> steps: ``device.adc_range=learned``)."""

    onnx_path: Path
    seconds: float = 0.0
    tags: dict[str, str] = field(default_factory=dict)
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    adc_steps: dict[str, LayerSteps] = field(default_factory=dict)

    def learned(self, spec: QuantSpec) -> QuantSpec:
        """``spec`` with the learned ranges (:attr:`QuantSpec.learned_ranges`)."""
        if not self.ranges:
            return spec
        ranges = tuple(TensorRange(name, *bounds) for name, bounds in sorted(self.ranges.items()))
        return dataclasses.replace(spec, learned_ranges=ranges)

"""The `dtype` config group: the integer types of activations and weights (`conf/dtype/*.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

QUANT_DTYPES = ("int8", "uint8")


@dataclass
class DtypeConfig:
    """Activation and weight types of a quantized model (`dtype=u8s8` is activation uint8, weight int8)."""

    activation: str = MISSING
    weight: str = MISSING

    def __post_init__(self) -> None:
        for role, value in (("activation", self.activation), ("weight", self.weight)):
            if value not in QUANT_DTYPES:
                raise ValueError(f"dtype.{role}={value!r}: expected one of {', '.join(QUANT_DTYPES)}.")

    @property
    def pair(self) -> tuple[str, str]:
        """(activation, weight)."""
        return self.activation, self.weight

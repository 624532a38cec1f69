"""The `dtype` config group: signedness and bit widths of activations and weights (`conf/dtype/*.yaml`), and
the one integer-range rule both backends quantize with (ONNX Runtime's, generalised to any width)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import MISSING

QUANT_DTYPES = ("int8", "uint8")
WEIGHT_BITS = range(2, 9)
ACTIVATION_BITS = (4, 5, 6, 7, 8, 16)


@dataclass
class DtypeConfig:
    """Activation and weight types of a quantized model (`dtype=u8s8` is activation uint8, weight int8).

    ``activation``/``weight`` give the signedness (and the 8-bit storage type); ``*_bits`` narrow the
    integer range stored in it (``weight_bits=4``: int8 storage holding -7..7) or, for activations, widen it
    to 16 bits (uint16/int16 storage).
    """

    activation: str = MISSING  # the activations' storage type and signedness: int8 | uint8 (QUANT_DTYPES)
    weight: str = MISSING  # the weights' storage type and signedness: int8 | uint8
    activation_bits: int = 8  # 4..8 narrow the stored range; 16: uint16/int16 storage
    weight_bits: int = 8  # 2..8: e.g. 4 stores -7..7 in int8
    first_last_bits: int | None = None
    """The papers' convention (BRECQ, QDrop, ...): the first conv and the last dense layer, weights and the
    activations they read, at this width (null: like the other layers)."""

    def __post_init__(self) -> None:
        for role, value in (("activation", self.activation), ("weight", self.weight)):
            if value not in QUANT_DTYPES:
                raise ValueError(f"dtype.{role}={value!r}: expected one of {', '.join(QUANT_DTYPES)}.")
        if self.weight_bits not in WEIGHT_BITS:
            raise ValueError(f"dtype.weight_bits={self.weight_bits}: expected 2..8.")
        if self.activation_bits not in ACTIVATION_BITS:
            raise ValueError(f"dtype.activation_bits={self.activation_bits}: expected 4..8 or 16.")
        if self.first_last_bits is not None:
            rest = max(self.weight_bits, self.activation_bits)
            if rest > 8:
                raise ValueError(
                    f"dtype.first_last_bits={self.first_last_bits}: with {rest}-bit activations the first "
                    f"and last layers cannot be kept wider than the rest; set dtype.first_last_bits=null."
                )
            if not rest <= self.first_last_bits <= 8:
                raise ValueError(
                    f"dtype.first_last_bits={self.first_last_bits}: the first and last layers keep at least "
                    f"the width of the rest (dtype.weight_bits={self.weight_bits}, dtype.activation_bits="
                    f"{self.activation_bits}) and at most 8 bits; expected null or {rest}..8."
                )

    @property
    def pair(self) -> tuple[str, str]:
        """(activation, weight) signedness as the 8-bit type names of the config."""
        return self.activation, self.weight

    @property
    def storage(self) -> tuple[str, str]:
        """(activation, weight) storage types: ``int8``/``uint8``, or ``int16``/``uint16`` for 16-bit
        activations."""
        activation = self.activation.replace("8", "16") if self.activation_bits == 16 else self.activation
        return activation, self.weight

    @property
    def label(self) -> str:
        """Short name of the types, e.g. ``uint8-int8``, ``uint16-int8``, ``uint6-int4``, ``uint4-int4-fl8``
        (the first and last layers at 8 bits)."""
        first_last = f"-fl{self.first_last_bits}" if self.first_last_bits is not None else ""
        types = (
            f"{type_name(self.activation, self.activation_bits)}-{type_name(self.weight, self.weight_bits)}"
        )
        return types + first_last

    def weight_symmetric(self, per_channel: bool) -> bool:
        """ORT's weight symmetry in QDQ models: symmetric for signed types (``WeightSymmetric``'s default) and
        for every per-channel weight (QLinear ops need one zero point in all channels), so only per-tensor
        unsigned weights are asymmetric. Both backends follow it."""
        return self.weight == "int8" or per_channel

    def activation_range(self, bits: int | None = None) -> tuple[int, int]:
        """(qmin, qmax) of activations (``bits``: a layer's own width, else ``activation_bits``):
        asymmetric, as ORT's ``ActivationSymmetric`` default."""
        return integer_range(self.activation, bits or self.activation_bits, symmetric=False)

    def weight_range(
        self, symmetric: bool, reduce_range: bool = False, bits: int | None = None
    ) -> tuple[int, int]:
        """(qmin, qmax) of weights (``bits``: a layer's own width, else ``weight_bits``; ``reduce_range``: one
        bit less, as ORT; 8-bit weights only)."""
        return integer_range(self.weight, bits or self.weight_bits, symmetric, reduce_range)


def type_name(signedness: str, bits: int) -> str:
    """``int4``, ``uint16``, ...: the integer type of ``bits`` with the signedness of ``int8``/``uint8``."""
    return f"{'u' if signedness.startswith('u') else ''}int{bits}"


def integer_range(signedness: str, bits: int, symmetric: bool, reduce_range: bool = False) -> tuple[int, int]:
    """ORT's (qmin, qmax) rule for any width: signed symmetric [-(2^(b-1)-1), 2^(b-1)-1], signed asymmetric
    [-2^(b-1), 2^(b-1)-1], unsigned [0, 2^b-1]; ``reduce_range`` as ORT's reduced 8-bit ranges (int8
    [-64, 64], uint8 [0, 127]). Equal to ``onnxruntime.quantization.quant_utils.get_qmin_qmax_for_qType`` at
    8 and 16 bits (tests/unit/test_dtype.py)."""
    if reduce_range:
        if bits != 8:
            raise ValueError(
                "reduce_range (7-bit weights) applies to 8-bit weights: set dtype.weight_bits instead."
            )
        return (-64, 64) if signedness == "int8" else (0, 127)
    if signedness.startswith("u"):
        return 0, 2**bits - 1
    half = 2 ** (bits - 1)
    return (-(half - 1) if symmetric else -half), half - 1


def ort_scale_zero_point(
    rmin: float, rmax: float, qmin: int, qmax: int, symmetric: bool
) -> tuple[float, int]:
    """Scale and zero point exactly as ORT's ``compute_scale_zp`` (the range is extended to include 0)."""
    from onnxruntime.quantization.quant_utils import compute_scale_zp

    zero_point, scale = compute_scale_zp(
        np.array(rmin, np.float32),
        np.array(rmax, np.float32),
        np.array(qmin, np.int32),
        np.array(qmax, np.int32),
        symmetric,
    )
    return float(scale), int(zero_point)


def bits_used(low: int, high: int, signed: bool) -> int:
    """The fewest bits of the given signedness whose range holds the integers ``low..high`` (at least 1)."""
    bits = 1
    while True:
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
        if lo <= low and high <= hi:
            return bits
        bits += 1

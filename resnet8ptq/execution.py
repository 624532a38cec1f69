"""Reference semantics vs what the runtime's kernels do: one rule for every backend.

Every quantized model has a *reference* form (its exact quantize/dequantize semantics, the same on every CPU
up to float rounding) and a *runtime* form (what the library executes when deployed on this CPU). When the
runtime runs integer kernels, its accuracy on the test set is compared with the reference accuracy:

- ``native``: integer kernels ran and matched the reference within the tolerance;
- ``native-mismatch``: integer kernels ran and did not (the gap and its likely cause are recorded);
- ``simulated``: no integer kernels ran; the runtime computes the quantize/dequantize arithmetic in float.
"""

from __future__ import annotations

from dataclasses import dataclass

from resnet8ptq.backends.base import Runtime
from resnet8ptq.hardware import Hardware

NATIVE = "native"
NATIVE_MISMATCH = "native-mismatch"
SIMULATED = "simulated"


@dataclass(frozen=True)
class Verdict:
    """The `execution` tag of a run, why, and the native-minus-reference gap (points; None if simulated)."""

    execution: str
    reason: str
    gap_points: float | None = None


def judge(
    reference_accuracy: float,
    runtime_accuracy: float,
    runtime: Runtime,
    tolerance_points: float,
    hardware: Hardware,
    dtypes: tuple[str, str],
) -> Verdict:
    """The verdict for a quantized model whose reference and runtime forms ran on the same test images.

    ``dtypes``: (activation, weight) types, used to explain a mismatch.
    """
    if not runtime.integer_kernels:
        return Verdict(SIMULATED, runtime.kernels)
    gap = round(100.0 * (runtime_accuracy - reference_accuracy), 6)  # exact for counts out of <= 10^6 images
    measured = (
        f"native {runtime_accuracy:.4f} vs reference {reference_accuracy:.4f} "
        f"({gap:+.2f} points, tolerance {tolerance_points:g})"
    )
    if abs(gap) <= tolerance_points:
        return Verdict(NATIVE, f"{runtime.kernels}; {measured}", gap)
    cause = mismatch_cause(hardware.has_int8_dot_product, dtypes)
    return Verdict(NATIVE_MISMATCH, f"{runtime.kernels}; {measured}: {cause}", gap)


def mismatch_cause(int8_dot_product: bool, dtypes: tuple[str, str]) -> str:
    """The likely cause of integer kernels disagreeing with the reference on a CPU with or without an int8
    dot-product instruction (:attr:`Hardware.has_int8_dot_product`), and the remedy."""
    if dtypes == ("uint8", "int8") and not int8_dot_product:
        return (
            "this CPU has no int8 dot-product instruction (VNNI/AMX), so uint8 x int8 kernels add pairs of "
            "products in saturating 16-bit arithmetic (AVX2 vpmaddubsw) and large activations saturate; "
            "remedy: reduce_range=true (7-bit weights), or dtype=uint8"
        )
    return "the integer kernels round or saturate differently from the reference semantics on this CPU"

"""Reference semantics vs what the runtime's kernels do: one rule for every backend.

Every quantized model has a *reference* form (its exact quantize/dequantize semantics, or for an integer-only
model the library's reference integer kernels, the same on every CPU; a float reference pass moves with the
CPU's float rounding) and a *runtime*
form (what the library executes when deployed on this CPU). When the
runtime runs integer kernels, its accuracy on the test set is compared with the reference accuracy:

- ``native``: integer kernels ran and matched the reference within the tolerance;
- ``native-mismatch``: integer kernels ran and did not (the gap and its likely cause are recorded);
- ``simulated``: no integer kernels ran; the runtime computes the quantize/dequantize arithmetic in float
  (a compiled program is used, for speed, only if it gives the reference's predictions on every test image).

Throughput and latency are the runtime form's, unless a simulated runtime failed that check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from resnet8ptq import hardware
from resnet8ptq.backends.base import QuantizedModel, Runtime
from resnet8ptq.evaluate import Evaluation, Kept, Measured, TestSet, evaluate, measure_latency
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
    runtime_used: bool = True  # False: a simulated runtime disagreed with the reference and was not used


def judge(
    reference_accuracy: float,
    runtime_accuracy: float,
    runtime: Runtime,
    tolerance_points: float,
    hardware: Hardware,
    dtypes: tuple[str, str],
    agreement: float | None = None,
) -> Verdict:
    """The verdict for a quantized model whose reference and runtime forms ran on the same test images.

    ``dtypes``: (activation, weight) types, used to explain a mismatch. ``agreement``: for a simulated
    runtime that is another program than the reference (e.g. compiled), the fraction of test images on which
    both predict the same class (score alike: :meth:`~resnet8ptq.metrics.Metric.agree`); None when the
    runtime is the reference program itself.
    """
    if not runtime.integer_kernels:
        if agreement is None:
            return Verdict(SIMULATED, runtime.kernels)
        if agreement == 1.0:
            return Verdict(SIMULATED, f"{runtime.kernels}; the reference's predictions on every test image")
        reason = (
            f"{runtime.kernels} predicted differently from the reference on {100 * (1 - agreement):.2f}% of "
            f"the test images, so it was not used: the reference program ran"
        )
        return Verdict(SIMULATED, reason, runtime_used=False)
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


@dataclass(frozen=True)
class QuantizedResult:
    """How a quantized model did: its reference semantics, its runtime form on this CPU, and the verdict."""

    reference: Evaluation
    runtime: Evaluation  # the same object as ``reference`` when the runtime runs the reference program
    verdict: Verdict
    latency_ms_b1: float  # of the form whose speed counts (the runtime's, unless it was not used)
    reused: bool = False  # the evaluations came from an earlier run's (:mod:`resnet8ptq.evaluation_cache`)

    @property
    def speed(self) -> Evaluation:
        """The evaluation pass whose throughput is the model's."""
        return self.runtime if self.verdict.runtime_used else self.reference


def evaluate_quantized(
    quantized: QuantizedModel,
    test: TestSet,
    name: str,
    tolerance_points: float,
    kept: Kept | None = None,
) -> QuantizedResult:
    """Evaluate the reference form and, when it is a different program, the runtime form (or read both from
    ``kept``: None keeps nothing); :func:`judge` them."""
    runtime = quantized.runtime
    same_program = runtime.predict is quantized.reference
    dtypes = (quantized.activation_dtype, quantized.weight_dtype)

    def verdict_of(reference: Evaluation, measured: Evaluation) -> Verdict:
        agreement = None
        if not same_program and not runtime.integer_kernels:
            agreement = float(np.mean(reference.metric.agree(measured.predictions, reference.predictions)))
        return judge(
            reference.value,
            measured.value,
            runtime,
            tolerance_points,
            hardware.detect(),
            dtypes,
            agreement,
        )

    def measure() -> Measured:
        reference = evaluate(quantized.reference, test, desc=f"Evaluating {name} (reference)")
        if same_program:
            return Measured((reference,), measure_latency(runtime.predict, test.inputs))
        measured = evaluate(runtime.predict, test, desc=f"Evaluating {name}")
        timed = runtime.predict if verdict_of(reference, measured).runtime_used else quantized.reference
        return Measured((reference, measured), measure_latency(timed, test.inputs))

    forms = {
        "runtime": runtime.kernels,
        "integer_kernels": runtime.integer_kernels,
        "same_program": same_program,
    }
    found = measure() if kept is None else kept(quantized.path, forms, test, measure)
    reference, measured = found.evaluations * 2 if same_program else found.evaluations
    verdict = verdict_of(reference, measured)
    return QuantizedResult(reference, measured, verdict, found.latency_ms_b1, found.reused)

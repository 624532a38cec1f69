"""The rule that turns reference and runtime accuracy into the `execution` tag, on both kinds of CPU."""

from __future__ import annotations

import numpy as np
import pytest

from resnet8ptq.backends.base import Runtime
from resnet8ptq.execution import NATIVE, NATIVE_MISMATCH, SIMULATED, judge, mismatch_cause
from resnet8ptq.hardware import Hardware

AVX2 = Hardware("AMD EPYC", ("avx2", "fma"), 2)
VNNI = Hardware("Intel Xeon", ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_int8"), 2)
U8S8 = ("uint8", "int8")


def _predict(images: np.ndarray) -> np.ndarray:
    return np.zeros((len(images), 10), np.float32)


INTEGER = Runtime(_predict, True, "QLinearConv x9, QGemm x1")
FLOAT = Runtime(_predict, False, "no integer kernel for int8/int8")


def test_no_integer_kernels_is_simulated_whatever_the_accuracy() -> None:
    verdict = judge(0.8658, 0.80, FLOAT, 0.3, AVX2, U8S8)
    assert verdict.execution == SIMULATED and verdict.gap_points is None
    assert verdict.reason == FLOAT.kernels


@pytest.mark.parametrize("machine", [AVX2, VNNI], ids=["avx2", "vnni"])
def test_within_tolerance_is_native(machine: Hardware) -> None:
    verdict = judge(0.8658, 0.8653, INTEGER, 0.3, machine, U8S8)
    assert verdict.execution == NATIVE
    assert verdict.gap_points == pytest.approx(-0.05)
    assert "native 0.8653 vs reference 0.8658" in verdict.reason and INTEGER.kernels in verdict.reason


def test_tolerance_is_inclusive_and_symmetric() -> None:
    assert judge(0.8600, 0.8630, INTEGER, 0.3, AVX2, U8S8).execution == NATIVE
    assert judge(0.8600, 0.8631, INTEGER, 0.3, AVX2, U8S8).execution == NATIVE_MISMATCH
    assert judge(0.8600, 0.8569, INTEGER, 0.3, AVX2, U8S8).execution == NATIVE_MISMATCH


def test_u8s8_mismatch_without_vnni_names_saturation_and_the_remedy() -> None:
    verdict = judge(0.8658, 0.8519, INTEGER, 0.3, AVX2, U8S8)
    assert verdict.execution == NATIVE_MISMATCH
    assert verdict.gap_points == pytest.approx(-1.39)
    assert "vpmaddubsw" in verdict.reason and "reduce_range=true" in verdict.reason


def test_other_mismatches_are_not_blamed_on_saturation() -> None:
    with_vnni = judge(0.8658, 0.8519, INTEGER, 0.3, VNNI, U8S8)
    other_dtype = judge(0.8658, 0.8519, INTEGER, 0.3, AVX2, ("uint8", "uint8"))
    for verdict in (with_vnni, other_dtype):
        assert verdict.execution == NATIVE_MISMATCH and "vpmaddubsw" not in verdict.reason
    assert mismatch_cause(True, U8S8) == mismatch_cause(False, ("int8", "int8"))


def test_a_compiled_simulated_runtime_is_used_only_if_it_predicts_like_the_reference() -> None:
    compiled = Runtime(_predict, False, "the q/dq program compiled by inductor into float kernels")
    same = judge(0.8660, 0.8660, compiled, 0.3, AVX2, ("int8", "int8"), agreement=1.0)
    assert (same.execution, same.runtime_used) == (SIMULATED, True)
    assert "the reference's predictions on every test image" in same.reason
    differs = judge(0.8660, 0.8660, compiled, 0.3, AVX2, ("int8", "int8"), agreement=0.9999)
    assert (differs.execution, differs.runtime_used) == (SIMULATED, False)
    assert "0.01% of the test images, so it was not used" in differs.reason

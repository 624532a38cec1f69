"""Calibration settings that would silently mean something else are refused."""

from __future__ import annotations

import pytest

from resnet8ptq.calibration import CalibConfig


def test_ort_default_entropy_equals_minmax_trap_is_refused() -> None:
    with pytest.raises(ValueError, match="collapse to min-max"):
        CalibConfig("entropy", num_bins=128, num_quantized_bins=128)

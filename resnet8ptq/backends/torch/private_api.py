"""The private torch/torchao APIs this backend needs, in one place, because no public API does their job.

- ``x86_annotation``: X86InductorQuantizer keeps its annotations as the private
  ``_X86InductorQuantizationAnnotation`` (its later passes read that type's extra fields); annotating a
  node so that the recipe treats it like its own annotations needs that class.
- ``inductor_int8_prepacks``: whether inductor lowered each quantized conv/linear to a oneDNN int8 kernel is
  recorded only in dynamo's counters (``torch._dynamo.utils.counters``); the compiled code offers no public
  way to ask which kernels it calls.
- ``freezing``: inductor's int8 lowering needs ``freezing`` while the model is traced and compiled. The public
  ``torch.compile(options={"freezing": True})`` fails on this model (measured with torch 2.14.1:
  ``UnsupportedOperatorException: onednn.qconv_prepack.default``); the config patch around the calls works.

A torch/torchao upgrade that moves either fails here, with this module named in the traceback.
"""

from __future__ import annotations

import contextlib
from typing import Any

from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    QUANT_ANNOTATION_KEY,
    _X86InductorQuantizationAnnotation,
)

__all__ = [
    "QUANT_ANNOTATION_KEY",
    "clear_inductor_counters",
    "freezing",
    "inductor_int8_prepacks",
    "x86_annotation",
]


def freezing() -> contextlib.AbstractContextManager:
    """Inductor's ``freezing`` switched on for the calls (and compiles) inside the block."""
    return inductor_config.patch(freezing=True)


def x86_annotation(input_qspec_map: dict[Any, Any]) -> Any:
    """An annotation of X86InductorQuantizer's own kind, quantizing the given inputs of a node."""
    return _X86InductorQuantizationAnnotation(input_qspec_map=input_qspec_map, _annotated=True)


def clear_inductor_counters() -> None:
    """Reset dynamo's counters before a compile, so :func:`inductor_int8_prepacks` counts that compile."""
    counters.clear()


def inductor_int8_prepacks() -> tuple[int, int]:
    """(conv, linear) layers inductor packed for oneDNN int8 kernels since the last clear."""
    return (
        counters["inductor"]["qconv_weight_prepack_matcher_count"],
        counters["inductor"]["qlinear_weight_prepack_matcher_count"],
    )

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
- ``post_grad_pass``: a graph rewrite that must run after freezing's passes (which fold constant multiplies
  into the preceding convolution's weights) is registered through inductor's custom-pass hook
  (``post_grad_custom_post_pass`` and its ``CustomGraphPass`` interface, which keys the compile cache); both
  live in private modules.

A torch/torchao upgrade that moves either fails here, with this module named in the traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import fx
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    QUANT_ANNOTATION_KEY,
    _X86InductorQuantizationAnnotation,
)

__all__ = [
    "QUANT_ANNOTATION_KEY",
    "clear_inductor_counters",
    "freezing",
    "inductor_int8_prepacks",
    "post_grad_pass",
    "x86_annotation",
]


def freezing() -> contextlib.AbstractContextManager:
    """Inductor's ``freezing`` switched on for the calls (and compiles) inside the block."""
    return inductor_config.patch(freezing=True)


class _PostGradPass(CustomGraphPass):
    """``rewrite`` as an inductor post-grad pass; compiled graphs are cached under the hash of its source."""

    def __init__(self, rewrite: Callable[[fx.Graph], Any], source: Path) -> None:
        self.rewrite, self.source = rewrite, source

    def __call__(self, graph: fx.Graph) -> None:
        self.rewrite(graph)

    def uuid(self) -> bytes:
        return get_hash_for_files((str(self.source),))


def post_grad_pass(rewrite: Callable[[fx.Graph], Any], source: Path) -> contextlib.AbstractContextManager:
    """Inductor runs ``rewrite`` (defined in the file ``source``) on every graph compiled inside the block,
    after its own post-grad passes and before lowering."""
    return inductor_config.patch(post_grad_custom_post_pass=_PostGradPass(rewrite, source))


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

"""The two private TensorFlow Lite / LiteRT APIs this backend uses, and why no public one does the job.

- ``TFLiteConverter._experimental_disable_per_channel``: the converter quantizes conv and fully-connected
  weights per output channel, and its public options (``optimizations``, ``target_spec``,
  ``representative_dataset``, ``inference_*_type``) have no per-tensor choice. This flag is the converter's
  own switch for it (TFLite's quantizer reads it as ``disable_per_channel``); the backend reads the saved
  model back to check that every weight got one scale.
- ``Interpreter._get_ops_details()``: the interpreter's nodes after delegation, the only place that says which
  ops the XNNPACK delegate took (a node ``DELEGATE`` replaces each partition it runs). The public API lists
  tensors and signatures, not nodes.
"""

from __future__ import annotations

from typing import Any


def disable_per_channel(converter: Any) -> None:
    """Make ``converter`` (a ``tf.lite.TFLiteConverter``) quantize weights per tensor."""
    if not hasattr(converter, "_experimental_disable_per_channel"):
        raise RuntimeError(
            "This TensorFlow's TFLiteConverter has no _experimental_disable_per_channel: per-tensor weights "
            "(per_channel=false) cannot be made; use per_channel=true."
        )
    converter._experimental_disable_per_channel = True


def execution_nodes(interpreter: Any) -> list[tuple[str, list[int], list[int]]]:
    """(op name, input tensor indices, output tensor indices) of every node of an allocated
    ``ai_edge_litert`` interpreter, delegate nodes (``DELEGATE``) included."""
    return [
        (node["op_name"], [int(i) for i in node["inputs"]], [int(i) for i in node["outputs"]])
        for node in interpreter._get_ops_details()
    ]

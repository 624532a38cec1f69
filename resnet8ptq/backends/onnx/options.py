"""The session options of every ONNX Runtime session the tool creates."""

from __future__ import annotations

import onnxruntime as ort

from resnet8ptq.hardware import usable_cores


def cpu_options(threads: int | None = None, optimize: bool = True) -> ort.SessionOptions:
    """``threads`` intra-op threads (None: the cores this process may use; ORT's own default counts the
    machine's cores and ignores the process's CPU affinity, so pinned or parallel jobs would oversubscribe
    them), no inter-op threads. ``optimize=False`` turns graph optimisations off: a QDQ model then runs its
    exact quantize/dequantize semantics."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or usable_cores()
    options.inter_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return options

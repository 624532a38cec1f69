"""What the algorithms share: editing an ONNX model's constants in place, and its layers' inputs on the
calibration images."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def set_initializer(init: onnx.TensorProto, values: np.ndarray) -> None:
    """Overwrite an initializer's values, keeping its name and float32 type."""
    init.CopyFrom(numpy_helper.from_array(np.asarray(values, np.float32), init.name))


BATCH = 100


def layer_inputs(
    model: onnx.ModelProto, layers: list[onnx.NodeProto], images: np.ndarray, reduce=None
) -> dict[str, np.ndarray]:
    """The input tensor of each layer in the FP32 model on ``images`` (keyed by tensor name), or, with
    ``reduce(node, batch_input)``, the sum over batches of what it returns (keyed by node name)."""
    import onnxruntime as ort

    from resnet8ptq.backends.onnx.options import cpu_options

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {output.name for output in probe.graph.output}
    for node in layers:
        if node.input[0] not in existing:
            probe.graph.output.append(onnx.ValueInfoProto(name=node.input[0]))
            existing.add(node.input[0])
    session = ort.InferenceSession(
        probe.SerializeToString(), cpu_options(), providers=["CPUExecutionProvider"]
    )
    names = [output.name for output in session.get_outputs()]
    collected: dict[str, list] = {}
    sums: dict[str, np.ndarray] = {}
    for start in range(0, len(images), BATCH):
        batch = np.ascontiguousarray(images[start : start + BATCH], dtype=np.float32)
        outputs = dict(zip(names, session.run(None, {session.get_inputs()[0].name: batch}), strict=True))
        for node in layers:
            if reduce is None:
                collected.setdefault(node.input[0], []).append(outputs[node.input[0]])
            else:
                sums[node.name] = sums.get(node.name, 0) + reduce(
                    node, outputs[node.input[0]].astype(np.float64)
                )
    if reduce is None:
        return {name: np.concatenate(parts) for name, parts in collected.items()}
    return sums

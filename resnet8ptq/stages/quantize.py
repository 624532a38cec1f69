"""Stage ``quantize``: the PTQ algorithms (`algo`), the quantization, the checks of its layers and its
evaluation on the full test set (the reference semantics and the runtime form on this CPU), with its
tables and charts. The device runs of one quantization (a sweep over `device.*`) make it once, in the first
of them, then reuse it (:attr:`resnet8ptq.shared.Shared.quantized`)."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx

from resnet8ptq import records
from resnet8ptq.algorithms import Context, prepare
from resnet8ptq.artifacts import evaluation_files
from resnet8ptq.backends.base import QuantizedModel
from resnet8ptq.cost import configured_cost
from resnet8ptq.evaluation_cache import EvaluationCache
from resnet8ptq.execution import evaluate_quantized
from resnet8ptq.inputs import RunInputs
from resnet8ptq.layers import check_first_last, check_own_widths, expected_raised, raised_in, sharing
from resnet8ptq.model import CanonicalModel
from resnet8ptq.records import Quantization, Quantized, model_record
from resnet8ptq.resolve import Plan
from resnet8ptq.spec import QuantSpec
from resnet8ptq.stages import RunRecord, Stage
from resnet8ptq.stages.fp32 import source_path
from resnet8ptq.tracking.runs import set_tags

log = logging.getLogger(__name__)


class QuantizeStage(Stage):
    name = "quantize"
    order = 20

    def run(self, inputs: RunInputs, record: RunRecord) -> Quantized:
        plan, fp32 = record.plan, record["fp32"]
        made = record.shared.quantized.get(plan.quantization_key) if plan.device.enabled else None
        if made is None:
            made = quantize_and_evaluate(plan, fp32.canonical, inputs, record.output_dir)
            if plan.device.enabled:
                record.shared.quantized.put(plan.quantization_key, made)
        else:
            set_tags(record.run_id, {"device.quantization_run": made.run_name})
            log.info("%s: reusing the quantized model of %s", plan.name, made.run_name)
        reference = made.result.reference
        log.info(
            "%s: %s %.4f (FP32 %.4f); %s: %s", plan.name, reference.metric.title, reference.value,
            fp32.baseline.evaluation.value, made.result.verdict.execution, made.result.verdict.reason,
        )  # fmt: skip
        baseline = fp32.baseline.evaluation
        out = record.output_dir / "evaluation"
        return Quantized(
            made, evaluation_files(reference, out, plan.name, fp32.context.class_names, baseline)
        )

    def log(self, inputs: RunInputs, record: RunRecord, result: Quantized) -> None:
        """Everything a quantized run records (:func:`resnet8ptq.records.log_quantized`), the layer errors
        the ``layers`` stage measured included."""
        plan, fp32 = record.plan, record["fp32"]
        path = result.made.quantized.path
        model = model_record(plan.cfg, plan.backend, path, inputs.test_images, inputs.datasets.quantized)
        records.log_quantized(fp32.context, record.run_id, plan.name, plan.cfg, result, model)


STAGE = QuantizeStage()


def quantize_and_evaluate(
    plan: Plan, canonical: CanonicalModel, inputs: RunInputs, output_dir: Path
) -> Quantization:
    """The PTQ algorithms on the FP32 model (`algo`), the quantization, the check of its layers (raised,
    first and last), and the evaluation of both forms on the full test set."""
    cfg, backend, spec = plan.cfg, plan.backend, plan.spec
    calibration = inputs.calibration_images
    context = Context(calibration, spec, cfg.data.seed, plan.device.crossbar())
    prepared = prepare(plan.algo, canonical.onnx_path, context, output_dir / "algo", Path(cfg.cache_dir))
    source = source_path(backend, canonical, prepared.onnx_path)
    quantized = backend.quantize(source, calibration, prepared.learned(spec), output_dir / "model")
    graph = onnx.load(prepared.onnx_path)
    shared = check_layers(quantized, spec, graph)
    first_last = check_first_last(quantized.layers, graph, spec)
    own = check_own_widths(quantized.layers, graph, spec)
    quantized.metrics |= configured_cost(graph, spec).metrics()  # the widths the checks above confirmed
    tolerance = cfg.native_tolerance_points
    kept = EvaluationCache.of(backend, Path(cfg.cache_dir), inputs.test_set_digest).measured
    result = evaluate_quantized(quantized, inputs.test_set, plan.name, tolerance, kept)
    tags = {"dtype.first_last": first_last} if first_last else {}
    tags |= {"layer_bits": own} if own else {}
    return Quantization(plan.name, prepared, quantized, shared, result, tags=tags)


def check_layers(quantized: QuantizedModel, spec: QuantSpec, graph: onnx.ModelProto) -> dict[str, str]:
    """Fail unless the saved model holds exactly the requested layers (and those that take their
    quantization) at 16 bits; return which layer takes which one's quantization (layers.sharing)."""
    wide = set(raised_in(quantized.layers, spec.dtype.activation_bits))
    expected = expected_raised(spec.raised_layers, graph)
    if wide != expected:
        raise RuntimeError(
            f"The saved model holds {sorted(wide) or 'no layer'} at 16 bits; raised_layers asked for "
            f"{sorted(expected) or 'none'}."
        )
    return sharing(graph)

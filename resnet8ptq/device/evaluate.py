"""A quantized model's score (its metric: top-1 accuracy, AUC) on a device (`device=integer|cim`): its
integer form run on the full test set, once per noise draw, with the ADC ranges set first where the device
has ADCs."""

from __future__ import annotations

import logging
import time
from dataclasses import astuple, dataclass, field

import numpy as np
from tqdm import tqdm

from resnet8ptq.device.actions import LayerActions, device_actions, totals, utilisation
from resnet8ptq.device.adc import LayerSteps, PartialSumProfile
from resnet8ptq.device.adc_ranges import AdcRule, calibrated_steps, fixed_steps
from resnet8ptq.device.cim import CrossbarArithmetic
from resnet8ptq.device.config import CALIBRATED_RANGES, DeviceConfig
from resnet8ptq.device.dac import dac_ranges as calibrated_dac_ranges
from resnet8ptq.device.dac import profiled_inputs
from resnet8ptq.device.executor import Arithmetic, Ideal, execute
from resnet8ptq.device.graph import IntegerModel
from resnet8ptq.device.mapping import crossbar_convs, worst_case_full_scale
from resnet8ptq.evaluate import Evaluated, subset_accuracy
from resnet8ptq.layer_errors import tensor_sqnr_db
from resnet8ptq.metrics import TOP1, Metric
from resnet8ptq.spec import EvaluationImages

log = logging.getLogger(__name__)


@dataclass
class DeviceResult:
    """The score on the device (its metric: top-1 accuracy, AUC): per noise draw, their mean with its spread
    and 95% interval, and what the hardware team needs to compare (the first draw's predictions, the ADC
    steps used)."""

    accuracies: list[float]  # the metric's value per noise draw
    predictions: np.ndarray  # the first draw's per-sample values: predicted class, anomaly score
    labels: np.ndarray
    interval: tuple[float, float]
    subset_accuracy: float  # mean over draws, on MLPerf Tiny's performance subset (NaN: none)
    differing_from_reference: int  # samples whose (first draw's) prediction differs from the reference
    model: IntegerModel | None = None  # the integer model the device ran (bias_correction: corrected)
    bias_corrections: dict[str, np.ndarray] = field(default_factory=dict)  # per layer: taken off the bias
    adc_steps: dict[str, LayerSteps] = field(default_factory=dict)  # per layer: the ADC steps
    dac_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)  # per layer: a calibrated DAC range
    layer_sqnr: dict[str, float] = field(default_factory=dict)  # per layer: the device vs the ideal (dB)
    actions: list[LayerActions] = field(default_factory=list)  # per layer: one inference's actions
    seconds: float = 0.0
    device: DeviceConfig | None = None  # the device evaluated
    metric: Metric = TOP1

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.accuracies))

    @property
    def std(self) -> float:
        return float(np.std(self.accuracies, ddof=1)) if len(self.accuracies) > 1 else 0.0

    def metrics(self) -> dict[str, float]:
        """The run's device metrics (the names are the contract docs/mlflow.md lists)."""
        key, used = self.metric.key, utilisation(self.actions)
        return {
            f"{key}_device": self.accuracy,
            f"{key}_device_std": self.std,
            f"{key}_device_ci_low": self.interval[0],
            f"{key}_device_ci_high": self.interval[1],
            **(
                {"accuracy_device_perf_subset": self.subset_accuracy}
                if np.isfinite(self.subset_accuracy)
                else {}
            ),
            "device_differing_predictions": float(self.differing_from_reference),
            "device_seconds": self.seconds,
            **({"device_sqnr_min_db": min(self.layer_sqnr.values())} if self.layer_sqnr else {}),
            **{f"device_{name}": float(count) for name, count in totals(self.actions).items()},
            **({"device_array_utilisation": used} if np.isfinite(used) else {}),
        }

    @property
    def worst_layer(self) -> str:
        """The layer whose outputs the device changes most (lowest SQNR against the ideal integer device)."""
        name = min(self.layer_sqnr, key=self.layer_sqnr.get)
        return f"{name} ({self.layer_sqnr[name]:.1f} dB)"


def seed_interval(accuracies: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """The t interval of the mean accuracy over noise draws (the draws are the device's variability), within
    0..1: with few, widely spread draws the t interval reaches past what an accuracy can be."""
    from scipy import stats

    n = len(accuracies)
    mean = float(np.mean(accuracies))
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * np.std(accuracies, ddof=1) / np.sqrt(n)
    return max(mean - half, 0.0), min(mean + half, 1.0)


Profiles = dict[tuple, object]
"""Calibration profiles of one model and calibration sample, kept across the device runs of a sweep: the
partial sums per crossbar layout (:class:`PartialSumProfile`), the layers' inputs (:class:`InputProfile`)."""


def dac_ranges(
    model: IntegerModel,
    device: DeviceConfig,
    calibration_images: np.ndarray,
    profiles: Profiles | None = None,
) -> dict[str, tuple[int, int]]:
    """Each layer's DAC range (:mod:`resnet8ptq.device.dac`) from its inputs on the calibration images (the
    ideal integer device), for the layers on the crossbar's arrays (a ``depthwise=digital`` layer has no
    DAC); empty with ``dac_range=full``."""
    if device.kind != "cim" or device.dac_range == "full":
        return {}
    if len(calibration_images) == 0:
        raise ValueError(
            "device.dac_range=percentile sets the DAC ranges from calibration images; none given."
        )
    profile = profiled_inputs(
        model, calibration_images, {} if profiles is None else profiles, device.batch_size
    )
    ranges = calibrated_dac_ranges(model, profile, device.dac_percentile)
    on_arrays = {layer.name for layer in crossbar_convs(model, device.crossbar())}
    return {name: window for name, window in ranges.items() if name in on_arrays}


def adc_steps(
    model: IntegerModel,
    device: DeviceConfig,
    calibration_images: np.ndarray,
    profiles: Profiles | None = None,
    dac: dict[str, tuple[int, int]] | None = None,
    learned: dict[str, LayerSteps] | None = None,
) -> dict[str, LayerSteps]:
    """Each layer's ADC steps (:mod:`resnet8ptq.device.adc_ranges`): from the partial sums of the ideal
    crossbar (the same tiles and slices, exact ADC, no noise) on the calibration images (``max``,
    ``percentile``, ``mse``), from the tile's largest possible sum (``worst_case``) or one unit
    (``granular``). Empty for an ideal ADC. ``profiles`` keeps the profile of each crossbar layout for the
    next device run of the same model and calibration images (a sweep over ADC settings profiles once per
    layout). ``dac``: the layers' DAC ranges (:func:`dac_ranges`), applied in calibration as on the device.
    ``learned``: the steps device-aware learning found (``learned``: :func:`learned_steps`)."""
    crossbar = device.crossbar()
    if crossbar.adc_bits is None:
        return {}
    rule = device.range_rule
    if rule == "learned":
        return learned_steps(model, device, learned or {})
    adc = AdcRule.of(crossbar, rule)
    if rule not in CALIBRATED_RANGES:
        layout = CrossbarArithmetic(crossbar.ideal(), dac_ranges=dac)
        return {
            layer.name: fixed_steps(
                layout.geometry(layer),
                worst_case_full_scale(layer, crossbar, layout.input_window(layer))
                if rule == "worst_case"
                else None,
                adc,
            )
            for layer in crossbar_convs(model, crossbar)
        }
    if len(calibration_images) == 0:
        raise ValueError(f"device.adc_range={rule} sets the ADC ranges from calibration images; none given.")
    profiles = {} if profiles is None else profiles
    layout = astuple(crossbar.ideal())
    if layout not in profiles:
        profiles[layout] = PartialSumProfile()
        ideal = CrossbarArithmetic(crossbar.ideal(), profile=profiles[layout], dac_ranges=dac)
        execute(model, calibration_images, ideal, batch_size=device.images_per_step)
    return calibrated_steps(profiles[layout], adc)


def learned_steps(
    model: IntegerModel, device: DeviceConfig, learned: dict[str, LayerSteps]
) -> dict[str, LayerSteps]:
    """The learned ADC steps (``device.adc_range=learned``) of each conv/dense layer of ``model``: ``learned``
    holds them by the FP32 model's layers, each with the key of the integer weights it was learned with
    (:func:`~resnet8ptq.device.graph.weight_key`), which finds the layer the backend made of it. A layer
    without steps (other weights than those learned) or with steps for other tiles, columns, granularity
    or windows than this crossbar's fails."""
    from resnet8ptq.device.adc import codes

    layout = CrossbarArithmetic(device.crossbar().ideal())
    window = codes(device.adc_bits, device.adc_window)
    by_key = {steps.layer_key: (source, steps) for source, steps in learned.items()}
    found = {}
    for layer in crossbar_convs(model, layout.crossbar):
        if layer.weight_key not in by_key:
            raise ValueError(
                f"device.adc_range=learned: no ADC steps were learned for layer {layer.name}'s weights "
                f"(learned for: {', '.join(learned) or 'no layer'}); the model's algorithm must have "
                "learned against this crossbar (algo.device_aware=true), and the backend kept its weights."
            )
        source, steps = by_key[layer.weight_key]
        geometry = layout.geometry(layer)
        if (steps.geometry, steps.granularity) != (geometry, device.adc_granularity) or not np.all(
            steps.code_max - steps.code_min == window
        ):
            raise ValueError(
                f"device.adc_range=learned: the steps learned for {source} ({steps.geometry}, "
                f"{steps.granularity}) do not fit layer {layer.name} on this crossbar ({geometry}, "
                f"{device.adc_granularity}, windows of {window} codes)."
            )
        found[layer.name] = steps
    return found


SQNR_IMAGES = 200
"""Test images the per-layer SQNR of a device is measured on."""


def layer_sqnr(
    model: IntegerModel, device: Arithmetic, images: np.ndarray, on_device: IntegerModel | None = None
) -> dict[str, float]:
    """Each layer's output on the device against the ideal integer device (its own input included, so the
    errors accumulate as on the chip): SQNR in dB of the centred integers (q - zero point). ``on_device``:
    the model as the device runs it, when it differs from ``model`` (bias correction)."""
    _, ideal = execute(model, images, Ideal(), len(images), len(images))
    _, real = execute(on_device or model, images, device, len(images), len(images))
    result = {}
    for layer in model.layers:
        q = layer.output_quant
        zero = q.zero_point if q is not None else 0
        reference = ideal.outputs[layer.output].double() - zero
        result[layer.name] = tensor_sqnr_db(
            reference.numpy(), (real.outputs[layer.output].double() - zero).numpy()
        )
    return result


def arithmetic(
    device: DeviceConfig,
    seed: int,
    steps: dict[str, LayerSteps],
    dac: dict[str, tuple[int, int]] | None = None,
) -> Arithmetic:
    """The device's arithmetic for one noise draw: the crossbar model for ``cim`` (even when ideal, so that
    its equality with ``integer`` is tested), exact integers for ``integer``."""
    if device.kind == "integer":
        return Ideal()
    return CrossbarArithmetic(device.crossbar(), seed=seed, adc_steps=steps, dac_ranges=dac)


def evaluate_device(
    model: IntegerModel,
    device: DeviceConfig,
    data: EvaluationImages,
    evaluated: Evaluated,
    adc_profiles: Profiles | None = None,
    learned: dict[str, LayerSteps] | None = None,
) -> DeviceResult:
    """Run ``model`` (the integer form of ``evaluated``, whose reference predictions it is compared with) on
    ``device`` over every test image, once per noise draw (seeds 0, 1, ...); the ADC ranges from the
    calibration images' partial sums (``adc_profiles``: :func:`adc_steps`), or ``learned``
    (``device.adc_range=learned``)."""
    start = time.perf_counter()
    name, reference_predictions = evaluated.name, evaluated.reference.predictions
    images, labels, perf_subset, metric = data.test_images, data.test_labels, data.perf_subset, data.metric
    calibration_images = data.calibration_images
    dac = dac_ranges(model, device, calibration_images, adc_profiles)
    steps = adc_steps(model, device, calibration_images, adc_profiles, dac, learned)
    actions = device_actions(model, device, images[:1], calibration_images, adc_profiles, dac)
    runs, corrections = model, {}
    if device.bias_correction:  # DeviceConfig allows it with device=cim only
        from resnet8ptq.device.bias_correction import correct_biases

        def systematic() -> Arithmetic:  # the crossbar without its random effects
            return CrossbarArithmetic(device.crossbar().systematic(), adc_steps=steps, dac_ranges=dac)

        runs, corrections = correct_biases(model, systematic, calibration_images, device.images_per_step)
    accuracies, subset, first = [], [], None
    with tqdm(total=len(images) * device.seeds, desc=f"Device {name}", unit="img", leave=False) as bar:
        for seed in range(device.seeds):
            logits, _ = execute(
                runs, images, arithmetic(device, seed, steps, dac), device.images_per_step, 0, bar.update
            )
            predicted = metric.per_sample(runs.dequantize_output(logits), images)
            first = predicted if first is None else first
            accuracies.append(metric.value(predicted, labels))
            subset.append(subset_accuracy(predicted, labels, perf_subset))
    sqnr = {}
    if device.kind == "cim":  # the ideal integer device is the reference itself
        sample = images[: min(SQNR_IMAGES, device.images_per_step)]
        sqnr = layer_sqnr(model, arithmetic(device, 0, steps, dac), sample, runs)
    interval = seed_interval(accuracies) if len(accuracies) > 1 else metric.interval(first, labels)
    return DeviceResult(
        accuracies=accuracies,
        predictions=first,
        labels=labels,
        interval=interval,
        subset_accuracy=float(np.mean(subset)),
        differing_from_reference=int(np.sum(~metric.agree(first, reference_predictions))),
        model=runs,
        bias_corrections=corrections,
        adc_steps=steps,
        dac_ranges=dac,
        layer_sqnr=sqnr,
        actions=actions,
        seconds=time.perf_counter() - start,
        device=device,
        metric=metric,
    )

"""Every name a run writes to MLflow, defined once with its meaning: metrics, tags and artifact paths.

docs/mlflow.md is the readers' page of the same contract; tests keep the two equal (every name here is in the
page) and keep the stores honest (every name a test's runs wrote is here). A name with a ``<...>`` part
stands for a family (``class_acc/<class>``, ``device.<setting>``: every field of
:class:`~resnet8ptq.device.config.DeviceConfig` but ``batch_size``). MLflow's own tags (``mlflow.*``) and
the params (the resolved configuration, flattened) are not listed: the configuration's schema
(:mod:`resnet8ptq.config`) defines those. A stage added as a module (:mod:`resnet8ptq.stages`) declares the
metrics and tags it logs itself; :func:`defines` counts them.
"""

from __future__ import annotations

import re

METRICS = {
    "accuracy": "fraction 0-1 of the 10,000 test images: the reference semantics",
    "accuracy_ci_low": "the 95% Wilson interval's lower end",
    "accuracy_ci_high": "the 95% Wilson interval's upper end",
    "accuracy_perf_subset": "the same predictions on MLPerf Tiny's 200-image performance subset",
    "accuracy_reference": "the same value as accuracy",
    "accuracy_native": "the runtime form's accuracy where integer kernels ran",
    "kernel_gap_points": "100 x (native - reference), where integer kernels ran",
    "accuracy_delta": "accuracy minus the same backend's FP32 accuracy",
    "class_acc/<class>": "accuracy on one of the 10 classes",
    "auc": "an autoencoder's (metric=auc): area under the ROC curve of its anomaly scores, the reference",
    "auc_ci_low": "the 95% DeLong interval's lower end",
    "auc_ci_high": "the 95% DeLong interval's upper end",
    "auc_reference": "the same value as auc",
    "auc_native": "the runtime form's AUC where integer kernels ran",
    "auc_delta": "auc minus the same backend's FP32 AUC",
    "model_size_bytes": "the saved model file's size",
    "fp32_size_bytes": "the FP32 model file's size (FP32 runs)",
    "size_ratio": "the quantized file's size over the FP32 file's",
    "weights_bytes": "the bytes of the weights the saved model holds (torch, tflite)",
    "throughput_img_s": "images per second of the timed pass",
    "latency_ms_b1": "milliseconds per image at batch size 1",
    "calib_seconds": "time calibrating",
    "quantize_seconds": "time quantizing",
    "eval_seconds": "time evaluating on the test set",
    "algo_seconds": "time of the PTQ algorithms (algo)",
    "layer_analysis_seconds": "time measuring the per-layer SQNR",
    "compile_seconds": "time compiling the program (torch)",
    "conversion_process_seconds": "the TFLite converter's child process, with TensorFlow's import",
    "<op>_ops": "q/dq operators of each kind in the saved program (torch: quantize_per_tensor_ops, ...)",
    "weight_memory_bits": "conv/gemm weights x their widths (biases left out)",
    "bops": "bit operations per image: each conv/gemm's multiply-accumulates x weight x input width",
    "sqnr_activation_min_db": "the lowest per-layer activation SQNR against the FP32 model",
    "sqnr_weight_min_db": "the lowest per-layer weight SQNR against the FP32 model",
    "accuracy_device": "accuracy on the device, the mean over noise draws",
    "accuracy_device_std": "its standard deviation over the draws",
    "accuracy_device_ci_low": "its 95% interval's lower end (Wilson; with noise the t interval)",
    "accuracy_device_ci_high": "its 95% interval's upper end",
    "accuracy_device_perf_subset": "accuracy on the device on MLPerf Tiny's performance subset",
    "auc_device": "metric=auc: the AUC on the device, the mean over noise draws",
    "auc_device_std": "its standard deviation over the draws",
    "auc_device_ci_low": "its 95% interval's lower end (DeLong; with noise the t interval)",
    "auc_device_ci_high": "its 95% interval's upper end",
    "device_differing_predictions": "test images whose device prediction (class; metric=auc: anomaly score, "
    "relative 1e-4) differs from the reference form's",
    "device_seconds": "time of the device evaluation",
    "device_sqnr_min_db": "cim: the lowest per-layer SQNR against the integer device",
    "device_macs": "device runs: multiply-accumulates of one inference (device/actions.py)",
    "device_row_activations": "cim: array rows driven per inference (rows x input slices x column groups)",
    "device_dac_conversions": "cim: DAC conversions per inference (one per driven row)",
    "device_cell_reads": "cim: cells read per inference (every cell on a driven row)",
    "device_adc_conversions": "cim: ADC conversions per inference (tiles x input x weight slices x columns)",
    "device_shift_adds": "cim: shift-adds combining a column's slices, per inference",
    "device_accumulator_adds": "cim: the digital accumulator's adds of the tiles' columns, per inference",
    "device_requantizations": "device runs: requantized outputs per inference (conv/dense, add, pooling)",
    "device_residual_adds": "device runs: residual additions per inference",
    "device_pooling_adds": "device runs: the average pool's additions per inference",
    "device_arrays": "cim: crossbar arrays the model takes (row tiles x column groups, summed over layers)",
    "device_cells": "cim: memory cells the weights take (a differential pair per weight slice)",
    "device_array_cells": "cim: the cells of the arrays the model takes, used or not (rows x columns each)",
    "device_array_utilisation": "cim: the share of the arrays' cells the weights take (device_cells / "
    "device_array_cells; a block-diagonal depthwise layer's is low)",
    "device_energy_uj": "device runs: energy of one inference on the chip, µJ (components/costs.py)",
    "device_energy_uj_<component>": "device runs: its part in one component (cells, word_lines, bit_lines, "
    "dac, adc, shift_add, mac, accumulator, requantizer, leakage), µJ",
    "device_latency_us": "device runs: latency of one inference, µs (layers in sequence, arrays in parallel)",
    "device_area_mm2": "device runs: the chip's area, mm² (cells, ADCs, DACs, digital units; no memories)",
    "device_area_mm2_<part>": "device runs: its part in cells, adc, dac or digital, mm²",
    "device_tops_per_w": "device runs: tera-operations (2 per MAC) per joule of one inference",
    "device_tops_per_mm2": "device runs: tera-operations per second per mm² of the chip",
    "accuracy_mcu": "TFLite Micro's accuracy on the test images it ran (all, or the first mcu.images)",
    "accuracy_mcu_perf_subset": "TFLite Micro's accuracy on the performance subset (all images run)",
    "accuracy_mcu_reference": "mcu.images set: the reference kernels' accuracy on the same images",
    "auc_mcu": "metric=auc: TFLite Micro's AUC",
    "auc_mcu_reference": "metric=auc, mcu.images set: the reference kernels' AUC on the same inputs",
    "mcu_images": "the test images TFLite Micro ran (mcu.images; all by default)",
    "mcu_differing_predictions": "test images whose TFLM class differs from LiteRT's reference kernels'",
    "mcu_differing_outputs": "test images with any output value differing from the reference kernels'",
    "mcu_arena_bytes": "the tensor arena: TFLM's recording allocator's total",
    "mcu_arena_smallest_bytes": "the smallest arena that runs, by bisection",
    "mcu_arena_head_bytes": "the arena's planned tensors",
    "mcu_tensors_peak_bytes": "the most bytes of tensors alive at one op",
    "mcu_flash_bytes": "the flatbuffer's size",
    "mcu_boards_fit": "how many of the configured boards it fits",
    "mcu_seconds": "time of the microcontroller path",
    "npu_cycles": "Vela's estimate: NPU cycles per inference",
    "npu_inference_ms": "Vela's estimate: milliseconds per inference",
    "npu_sram_bytes": "Vela's estimate: SRAM used",
    "npu_flash_bytes": "Vela's estimate: flash used",
    "npu_macs": "Vela's estimate: multiply-accumulates",
    "npu_cpu_ops": "operators Vela leaves on the CPU",
}

TAGS = {
    "backend": "the toolchain: onnx, torch or tflite",
    "quantized": "true for a quantized run, false for an FP32 baseline",
    "calib": "the calibration method",
    "calib.reused": "onnx: true when the activation ranges came from an earlier run's calibration",
    "eval.reused": "true when the evaluation (predictions, seconds, speed) came from an earlier run's",
    "algo": "the PTQ algorithms applied, joined by +, or none",
    "algo.device_aware": "true when the algorithms learned against the run's crossbar (algo.device_aware)",
    "algo.device_noise": "true when that learning drew noisy chips, its cells' effects (algo.device_noise)",
    "algo.<result>": "what an algorithm did (cle_pairs, adaround_flipped, brecq_blocks, ..., reused)",
    "per_channel": "per-channel weights: true or false",
    "reduce_range": "reduce_range: true or false",
    "config_hash": "the hash of what decides the result (resume finds a run by it)",
    "git_commit": "the project's commit, -dirty when changed",
    "dtype.activation": "the activations' storage type, read back from the saved model",
    "dtype.weight": "the weights' storage type, read back",
    "dtype.activation_bits": "the activations' width, read back",
    "dtype.weight_bits": "the weights' width, read back",
    "dtype.first_last": "the first and last layers' width and names, read back (dtype.first_last_bits)",
    "layer_bits": "layer=bits of the layers at their own width, read back (layer_bits)",
    "weight_granularity": "per-channel or per-tensor weights, read back (torch, tflite)",
    "quantizer": "the library's quantizer that made the model (torch, tflite)",
    "execution": "native, native-mismatch or simulated",
    "execution_reason": "which kernels ran, the two accuracies, the likely cause of a mismatch",
    "hardware.<field>": "the machine: cpu, isa, cores, kernel_path",
    "version.<library>": "each library's version",
    "model": "the network (`model` group: resnet8, dscnn, vww, kws, ad, custom)",
    "data": "the data set (`data` group: cifar10, npz)",
    "metric": "how the model's outputs are scored (`model.metric`: top1, auc)",
    "classes": "the model's classes in label order, a JSON list (`model.classes`, else the data's names)",
    "data.verified": "how the data was verified (CIFAR-10: md5 and layout; an .npz: its sha256)",
    "model.sha256": "the sha256 of the model file the run started from",
    "digest.model": "the saved model's content without its metadata (16 hex of SHA-256; see digests.py)",
    "digest.calibration_ranges": "the calibration ranges as computed, every tensor's min and max exactly",
    "digest.predictions": "the reference form's 10,000 predicted labels",
    "digest.integer_model": "device runs: every layer's integer parameters as the device read them",
    "digest.device_predictions": "device runs: the device's 10,000 predicted labels (the first noise draw)",
    "model.source": "a published model's URL",
    "model_uri": "the logged MLflow Model (models:/<model_id>)",
    "reference": "the name of a published model's run (mlperf)",
    "sqnr_worst_layer": "the layer of lowest SQNR, its kind and its SQNR",
    "host": "the machine the run ran on",
    "pid": "the process that ran it",
    "error": "why the run failed",
    "overrides": "the job's command-line overrides",
    "sweep": "true on a sweep's parent run",
    "sweep_kind": "run (a single run) or sweep (-m)",
    "sweep_dir": "the parent run's output directory",
    "registered_model": "the model the sweep registered (mlflow.register_as)",
    "skipped.<config_hash>": "parent: a configuration a resumed sweep found finished",
    "reused.<config_hash>": "parent: the earlier run a resumed sweep reuses",
    "unsupported.<overrides>": "parent: a configuration the backend refused, with why",
    "device.<setting>": "the device's kind and, for cim, every crossbar setting",
    "device.chip": "the chip preset the device's settings came from (device/chip=pcm: conf/device/chip/)",
    "device.cost_model": (
        "device runs: the component models (packages, versions), technology node and, on a crossbar, its "
        "cell (its technology and any figure borrowed from another cell), ADC and DAC models"
    ),
    "device.cost_skipped": "device runs not costed: why no component model covers the design",
    "device.source": "the integer form's reader: tflite, onnx-qdq, torch-pt2e",
    "device.quantization_run": "the run whose quantization a device run reuses",
    "device.worst_layer": "cim: the layer the device changes most (SQNR against the integer device)",
    "mcu.runtime": "the tflite-micro version",
    "mcu.kernels": "the builtin ops the model needs",
    "mcu.vs_reference": "TFLM against LiteRT's reference kernels, in words",
    "mcu.divergence": "the first op whose output differs, when any does",
    "mcu.fits": "the boards it fits, comma-separated, or none",
    "mcu.board.<name>": "one board: fits or not, with RAM and flash",
    "npu.accelerator": "Vela's accelerator",
    "npu.system_config": "Vela's system configuration",
    "npu.clock_mhz": "the NPU clock Vela assumed",
    "npu.estimate": "Vela's estimate in words",
    "mixed_precision.raised": "the layers the saved model holds at 16 bits, read back",
    "mixed_precision.step": "the step of a mixed-precision search",
    "mixed_precision.target_points": "the accuracy-drop target of the search",
    "mixed_precision.base_hash": "the config_hash of the search's step 0",
    "mixed_precision.budget": "a budgeted mix's budget (bops<=..., weight_bits<=...)",
    "mixed_precision.predicted_noise": "the solver's predicted noise of the chosen widths",
    "mixed_precision.candidates": "how many layers the budgeted search chose widths for",
    "mixed_precision.<config_hash>": "parent: a mixed-precision search's target and outcome",
    "search.objectives": "parent: an Optuna search's objectives",
    "search.directions": "parent: their directions",
    "search.sampler": "parent: the sampler",
    "search.n_trials": "parent: the number of trials",
    "search.space": "parent: the search space",
    "search.trial.<NNNN>": "parent: the run trial NNNN was, or refused: why",
}

ARTIFACTS = {
    "model/<file>": "the model file (quantized, or FP32 on a baseline)",
    "config/resolved_config.yaml": "the resolved configuration",
    "evaluation/predictions.csv": "every test image's label and predicted class (metric=auc: anomaly score)",
    "evaluation/confusion_matrix.csv": "the confusion matrix",
    "evaluation/confusion_matrix.png": "the confusion matrix as a chart",
    "evaluation/class_accuracy.csv": "per-class accuracy",
    "evaluation/class_accuracy.png": "per-class accuracy against FP32",
    "evaluation/roc_curve.png": "metric=auc: the ROC curve of the anomaly scores against FP32's",
    "calibration/calibration_ranges.csv": "every activation's calibrated range",
    "analysis/layer_sqnr.csv": "per-layer SQNR",
    "analysis/layer_sqnr.png": "per-layer SQNR as a chart",
    "analysis/layer_precision.csv": "every quantized layer's storage type and bits, read back",
    "analysis/sensitivity.csv": "a budgeted search's noise of every candidate layer at every width",
    "device/predictions.csv": "per test image: label, the reference's and the device's prediction",
    "device/accuracy_by_draw.csv": "the accuracy of each noise draw",
    "device/adc_steps.csv": "every ADC: step, window of codes, range",
    "device/dac_ranges.csv": "every layer's DAC range and input cycles (dac_range=percentile)",
    "device/layer_sqnr.csv": "per-layer SQNR of the device against the integer device",
    "device/actions.csv": "per layer: one inference's actions on the device and its components' statistics",
    "device/costs.csv": "per layer: one inference's energy by component (µJ) and latency (µs)",
    "device/components.csv": "every component model asked: attributes, action, energy, latency, area, leak",
    "device/integer_model.json": "the integer form's layers and arithmetic in words",
    "device/integer_model.npz": "the integer form's arrays",
    "device/layers.csv": "one readable line per layer",
    "device/golden.npz": "golden vectors of the ideal integer device",
    "device/crossbar.json": "cim: settings, conventions, effects, tiles and slices, calibration sample",
    "mcu/arena_report.txt": "TFLM's allocator's report",
    "mcu/arena_tensors.csv": "the arena's tensors with their lifetimes",
    "mcu/predictions.csv": "label, reference and TFLM prediction of every test image it ran",
    "report/report.md": "parent: the comparison report",
    "report/report.html": "parent: the report as HTML",
    "report/report_<chart>.png": "parent: the report's charts",
    "error.txt": "a failed run's traceback",
}

_KINDS = {"metric": METRICS, "tag": TAGS, "artifact": ARTIFACTS}


def pattern(name: str) -> re.Pattern[str]:
    """A schema name as a regular expression: each ``<...>`` part stands for one or more characters (no ``/``
    in an artifact's file part)."""
    parts = re.split(r"<[^>]+>", name)
    return re.compile("[^/]+".join(re.escape(part) for part in parts) + r"\Z")


_PATTERNS = {kind: [pattern(name) for name in names] for kind, names in _KINDS.items()}


def defines(kind: str, name: str) -> bool:
    """Whether the schema defines ``name`` as a ``kind`` (metric, tag, artifact): exactly or in a family, or
    a stage added as a module declares it (:func:`resnet8ptq.stages.declared`)."""
    names = _KINDS[kind]
    return name in names or any(regex.match(name) for regex in _PATTERNS[kind]) or name in stage_names(kind)


def stage_names(kind: str) -> dict[str, str]:
    """The ``kind`` names (metric, tag) that the stages added as modules declare, with their meanings."""
    if kind == "artifact":
        return {}
    from resnet8ptq.stages import declared

    return declared(kind)


def undefined(kind: str, names: set[str]) -> list[str]:
    """The ``names`` the schema does not define as a ``kind``, sorted."""
    return sorted(name for name in names if not defines(kind, name))

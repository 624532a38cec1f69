"""The `device` config group (`conf/device/*.yaml`): where a quantized model's accuracy is measured besides
the desktop runtimes. ``none`` (default: nothing is computed), ``integer`` (the ideal integer executor) or
``cim`` (a compute-in-memory crossbar, :mod:`resnet8ptq.device.cim`; aihwkit's names in docs/device.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

KINDS = ("none", "integer", "cim")
# ADC range rules (device/adc_ranges.py)
RANGES = ("max", "percentile", "mse", "worst_case", "granular", "learned")
RANGE_ALIASES = {"calibrated": "max"}
"""Earlier names of a range rule: the same rule, so that earlier runs' settings stay readable."""
CALIBRATED_RANGES = ("max", "percentile", "mse")
"""Rules that read the calibration sample's partial sums."""
GRANULARITIES = ("layer", "tile", "column")
STEPS = ("pow2", "free")
WINDOWS = ("symmetric", "asymmetric")
DAC_RANGES = ("full", "percentile")  # the DAC's full scale (device/dac.py)
DRIFTS = ("none", "constant", "pcm")  # the drift exponent's model (device/effects/drift.py)
CHARGE_LOSSES = ("none", "sonos")  # charge-trap cells' retention (device/effects/charge_loss.py)
NOISE_MODELS = ("constant", "proportional", "pcm", "pcm_signed", "sonos")  # effects/programming_noise.py
ADC_ERRORS = ("adc_offset", "adc_gain", "adc_inl", "adc_noise")
DEPTHWISE = ("crossbar", "digital")  # where a grouped (depthwise) convolution is computed (device/cim.py)
DIGITAL_DEPTHWISE_LABEL = "dwdigital"  # the run name's part for depthwise=digital (DeviceConfig.label)
DIGITAL_SETTINGS = ("requantizer_bits",)  # crossbar settings the integer device has too
IR_DROP_G_RATIO = 1 / 0.35 / 5e-6  # aihwkit's default: 0.35 Ω of wire per cell, 5 µS a cell's top conductance


LAYOUT = ("rows", "dac_bits", "dac_range", "dac_percentile", "bits_per_cell", "cells_per_weight", "depthwise")
"""The settings that decide a layer's partial sums (tiles, the inputs' range and slices, weight slices, which
layers are on crossbars): what the ADC calibration depends on."""
DRAWN = {"draws": True}
"""Metadata of a setting that switches on a random effect: a device with any of them away from its default is
evaluated over ``noise_seeds`` draws."""
RANGE_LABELS = {
    "max": "max", "percentile": "p{p:g}", "mse": "mse", "worst_case": "wc", "granular": "gran",
    "learned": "learned",
}  # fmt: skip
"""How a run's name shows an ADC range rule other than the default (``cim-r128-adc4-max-layer-sym``)."""

LEARNED_SETTINGS = (
    "rows", "adc_bits", "adc_granularity", "adc_window", "adc_step", "dac_bits", "dac_range",
    "bits_per_cell", "cells_per_weight",
)  # fmt: skip
"""The crossbar settings device-aware learning sees (``algo.device_aware``: its partial sums and ADCs): the
algorithm cache's key and the shared quantization's key include them."""
CELL_EFFECT_SETTINGS = (
    "bits_per_cell", "weight_noise", "weight_noise_model", "stuck_off", "stuck_on", "drift", "t_inference",
    "drift_t0", "drift_nu_mean", "drift_nu_std", "charge_loss", "drift_compensation",
)  # fmt: skip
"""The settings of the effects on the cells (``program`` and ``perturb``: programming noise, stuck cells,
drift, charge loss, and drift's compensation), which learning on noisy chips (``algo.device_noise``) draws
too."""


def learned_settings(noisy: bool) -> tuple[str, ...]:
    """The crossbar settings a device-aware learning depends on: :data:`LEARNED_SETTINGS`, and on noisy chips
    (``algo.device_noise``) the cell effects' (:data:`CELL_EFFECT_SETTINGS`)."""
    extra = tuple(name for name in CELL_EFFECT_SETTINGS if name not in LEARNED_SETTINGS) if noisy else ()
    return LEARNED_SETTINGS + extra


@dataclass
class Crossbar:
    """A crossbar's parameters (:mod:`resnet8ptq.device.cim` models them; aihwkit's names: docs/device.md).
    Every default is the ideal device."""

    rows: int | None = None  # crossbar rows per tile (aihwkit: mapping.max_input_size); null: one tile
    # an array's columns (aihwkit: mapping.max_output_size): the arrays a layer takes, not its readings
    columns: int | None = None  # null: one array holds a row tile's every column
    adc_bits: int | None = None  # ADC resolution per partial sum (aihwkit: forward.out_res); null: ideal
    # the ADC range: max | percentile | mse | worst_case | granular (adc.py); learned (algo.device_aware)
    adc_range: str = "mse"
    adc_percentile: float = 99.99  # adc_range=percentile: of |partial sum| (CrossSim's default)
    adc_granularity: str = "column"  # one ADC range per layer | tile | column
    adc_step: str = "pow2"  # the ADC step: pow2 (the digital side shifts) | free (a fixed-point multiplier)
    adc_window: str = "asymmetric"  # ADC codes: symmetric (±(2^(b-1) - 1)) | asymmetric (2^b over the range)
    dac_bits: int = 8  # input bits per cycle (aihwkit: forward.inp_res); 8: the whole input at once
    dac_range: str = "full"  # the DAC's full scale: full (the quantized input) | percentile (clipped: dac.py)
    dac_percentile: float = 99.99  # dac_range=percentile: of each layer's inputs on the calibration sample
    bits_per_cell: int = 8  # levels of one memory cell, in bits
    cells_per_weight: int = 1  # cells a weight's magnitude is sliced over
    # programming noise σ, a fraction of a cell's range (aihwkit: w_noise; effects/programming_noise.py)
    weight_noise: float = field(default=0.0, metadata=DRAWN)
    # its sigma over the level: constant | proportional | pcm (aihwkit's: on both cells of the pair, each
    # clamped at 0) | pcm_signed (pcm's sigma on the signed level) | sonos (CrossSim); programming_noise.py
    weight_noise_model: str = "constant"
    # fractions of cells stuck at the lowest / the highest level, per chip (effects/stuck_cells.py)
    stuck_off: float = field(default=0.0, metadata=DRAWN)
    stuck_on: float = field(default=0.0, metadata=DRAWN)
    # conductance drift: none | constant | pcm (aihwkit's noise models' nu; effects/drift.py)
    drift: str = field(default="none", metadata=DRAWN)
    t_inference: float = 0.0  # seconds since programming (aihwkit: t_inference)
    drift_t0: float = 20.0  # the first read after programming, seconds (aihwkit: t_0)
    drift_nu_mean: float = 0.1  # drift=constant: nu's mean (aihwkit StateIndependentNoiseModel's name)
    drift_nu_std: float = 0.05  # drift=constant: nu's spread (aihwkit: drift_nu_std)
    # charge loss of charge-trap cells over t_inference: none | sonos (CrossSim's fit; effects/charge_loss.py)
    charge_loss: str = field(default="none", metadata=DRAWN)
    drift_compensation: bool = False  # one digital scale per layer (aihwkit: GlobalDriftCompensation)
    ir_drop: float = 0.0  # aihwkit's first-order IR drop, its scale (aihwkit: ir_drop; effects/ir_drop.py)
    ir_drop_g_ratio: float = IR_DROP_G_RATIO  # wire over a cell's top conductance (aihwkit's name)
    # read noise σ per read, a fraction of a cell's range (aihwkit: w_noise, ADDITIVE_CONSTANT; read_noise.py)
    read_noise: float = field(default=0.0, metadata=DRAWN)
    # the ADCs' own errors, in LSB (effects/adc_errors.py): offset and gain σ per ADC, INL, input noise
    adc_offset: float = field(default=0.0, metadata=DRAWN)
    adc_gain: float = field(default=0.0, metadata=DRAWN)
    adc_inl: float = 0.0
    adc_noise: float = field(default=0.0, metadata=DRAWN)
    accumulator_bits: int = 32  # the digital accumulator adding the tiles (saturating)
    requantizer_bits: int = (
        32  # the requantizer's fixed-point multiplier (TFLite/gemmlowp: 32; requantizer.py)
    )
    # grouped (depthwise) convs: crossbar (each group's own rows and columns) | digital (integer MACs)
    depthwise: str = "crossbar"

    def ideal(self) -> Crossbar:
        """The same tiles and slices (:data:`LAYOUT`), every other setting at its ideal default (exact ADC, no
        noise): the crossbar the ADC ranges are calibrated on. A new non-ideality, ideal by default, is off
        here without an edit; calibrations of crossbars with the same layout are the same."""
        return Crossbar(**{name: getattr(self, name) for name in LAYOUT})

    def systematic(self) -> Crossbar:
        """The same crossbar without its random effects (every :data:`DRAWN` setting at its default): what
        every chip of it shares (tiles, slices, DAC, ADC and its ranges, IR drop, ADC INL)."""
        drawn = {item.name: item.default for item in fields(Crossbar) if item.metadata.get("draws")}
        return Crossbar(**{item.name: getattr(self, item.name) for item in fields(Crossbar)} | drawn)

    def draws_cells(self) -> bool:
        """Some random effect on the cells is on (a :data:`DRAWN` setting of :data:`CELL_EFFECT_SETTINGS`
        away from its default): each chip's cells differ."""
        return any(
            item.metadata.get("draws") and getattr(self, item.name) != item.default
            for item in fields(Crossbar)
            if item.name in CELL_EFFECT_SETTINGS
        )

    def learned(self, noisy: bool) -> Crossbar:
        """What device-aware learning sees of this crossbar (:func:`learned_settings`: with ``noisy``, the
        cells' effects too); every other setting at its ideal default (no read noise, IR drop or ADC
        errors)."""
        return Crossbar(**{name: getattr(self, name) for name in learned_settings(noisy)})


CROSSBAR_DEFAULTS = {item.name: item.default for item in fields(Crossbar)}
"""Every crossbar setting's default: the ideal device."""


@dataclass
class DeviceConfig(Crossbar):
    """The device a quantized model is evaluated on: its kind, the crossbar's settings (a :class:`Crossbar`;
    only ``cim`` may change them, so ``device=cim`` alone equals ``device=integer``) and how it is
    evaluated."""

    kind: str = "none"  # none | integer | cim: the `device` group's choice
    noise_seeds: int = 5  # noise draws a noisy device is evaluated over (mean, std, 95% interval)
    batch_size: int = 500  # images per step of the executor (memory, not results)
    bias_correction: bool = False  # take the crossbar's mean accumulator error out of each layer's bias
    # (measured on the calibration images without random effects: resnet8ptq/device/bias_correction.py)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"device={self.kind!r}: expected one of {', '.join(KINDS)}.")
        free = ("kind", "batch_size") + DIGITAL_SETTINGS * (self.kind == "integer")
        changed = [f.name for f in fields(self) if f.name not in free and _changed(self, f)]
        if self.kind != "cim" and changed:
            options = ", ".join(f"device.{name}={getattr(self, name)}" for name in changed)
            raise ValueError(
                f"{options} with device={self.kind}: crossbar settings need device=cim "
                f"({'the ideal integer executor has none' if self.kind == 'integer' else 'no device is on'})."
            )
        checks = [
            (self.rows is None or self.rows >= 1, f"device.rows={self.rows}: expected >= 1 rows, or null"),
            (
                self.columns is None or self.columns >= 2 * self.cells_per_weight,
                f"device.columns={self.columns}: expected >= {2 * self.cells_per_weight} (a weight's "
                f"differential pair of {self.cells_per_weight} cell(s) each), or null",
            ),
            (
                self.adc_bits is None or 2 <= self.adc_bits <= 24,
                f"device.adc_bits={self.adc_bits}: expected 2..24 bits (a signed ADC), or null (ideal)",
            ),
            (
                self.adc_range in RANGES + tuple(RANGE_ALIASES),
                f"device.adc_range={self.adc_range!r}: expected one of {', '.join(RANGES)}",
            ),
            *_percentile_checks(self, "adc", self.range_rule, 0),
            (
                self.adc_granularity in GRANULARITIES,
                f"device.adc_granularity={self.adc_granularity!r}: expected one of "
                f"{', '.join(GRANULARITIES)}",
            ),
            (
                self.adc_step in STEPS,
                f"device.adc_step={self.adc_step!r}: expected one of {', '.join(STEPS)}",
            ),
            (
                self.adc_window in WINDOWS,
                f"device.adc_window={self.adc_window!r}: expected one of {', '.join(WINDOWS)}",
            ),
            (1 <= self.dac_bits <= 16, f"device.dac_bits={self.dac_bits}: expected 1..16 bits per cycle"),
            (
                self.dac_range in DAC_RANGES,
                f"device.dac_range={self.dac_range!r}: expected one of {', '.join(DAC_RANGES)}",
            ),
            *_percentile_checks(self, "dac", self.dac_range, 50),
            (1 <= self.bits_per_cell <= 16, f"device.bits_per_cell={self.bits_per_cell}: expected 1..16"),
            (self.cells_per_weight >= 1, f"device.cells_per_weight={self.cells_per_weight}: expected >= 1"),
            (
                math.isfinite(self.weight_noise) and self.weight_noise >= 0,
                f"device.weight_noise={self.weight_noise}: expected a σ >= 0 (a fraction of a cell's range)",
            ),
            (
                self.weight_noise_model in NOISE_MODELS,
                f"device.weight_noise_model={self.weight_noise_model!r}: expected one of "
                f"{', '.join(NOISE_MODELS)}",
            ),
            (
                self.weight_noise_model == "constant" or self.weight_noise > 0,
                f"device.weight_noise_model={self.weight_noise_model} with device.weight_noise=0: no "
                "programming noise to shape; set device.weight_noise (1: the model as published)",
            ),
            *_fraction_checks(self),
            (self.drift in DRIFTS, f"device.drift={self.drift!r}: expected one of {', '.join(DRIFTS)}"),
            (
                self.charge_loss in CHARGE_LOSSES,
                f"device.charge_loss={self.charge_loss!r}: expected one of {', '.join(CHARGE_LOSSES)}",
            ),
            *_drift_checks(self),
            *(
                (
                    self.adc_bits is not None or not getattr(self, name),
                    f"device.{name}={getattr(self, name)}: an ideal ADC (device.adc_bits=null) has no "
                    "errors; set device.adc_bits",
                )
                for name in ADC_ERRORS
            ),
            (
                8 <= self.accumulator_bits <= 64,
                f"device.accumulator_bits={self.accumulator_bits}: expected 8..64 bits",
            ),
            (
                8 <= self.requantizer_bits <= 32,
                f"device.requantizer_bits={self.requantizer_bits}: expected 8..32 bits",
            ),
            (
                self.depthwise in DEPTHWISE,
                f"device.depthwise={self.depthwise!r}: expected one of {', '.join(DEPTHWISE)}",
            ),
            (self.noise_seeds >= 1, f"device.noise_seeds={self.noise_seeds}: expected >= 1"),
            (self.batch_size >= 1, f"device.batch_size={self.batch_size}: expected >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message + ".")

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    @property
    def range_rule(self) -> str:
        """``adc_range`` with an earlier name resolved (``calibrated`` is ``max``)."""
        return RANGE_ALIASES.get(self.adc_range, self.adc_range)

    @property
    def images_per_step(self) -> int:
        """``batch_size`` divided by the slices a crossbar multiplies at once (bit-serial inputs of an 8-bit
        activation × weight cells), so that memory stays about the same."""
        if self.kind != "cim":
            return self.batch_size
        return max(1, self.batch_size // (math.ceil(8 / self.dac_bits) * self.cells_per_weight))

    @property
    def noisy(self) -> bool:
        """A random effect is on (a setting with :data:`DRAWN` metadata away from its default)."""
        return self.kind == "cim" and any(f.metadata.get("draws") and _changed(self, f) for f in fields(self))

    @property
    def seeds(self) -> int:
        """Noise draws to evaluate: ``noise_seeds`` when the device is noisy, else one."""
        return self.noise_seeds if self.noisy else 1

    @property
    def label(self) -> str:
        """The device part of a run's name: ``int``, or ``cim`` with the settings that differ from ideal
        (``cim-r64-adc4``, ``cim-c2x4-n0.02``)."""
        requantizer = [f"rq{self.requantizer_bits}"] if self.requantizer_bits != 32 else []
        if self.kind != "cim":
            return "-".join(["int", *requantizer])
        parts = ["cim"]
        parts += [f"r{self.rows}"] if self.rows is not None else []
        parts += [f"col{self.columns}"] if self.columns is not None else []
        parts += [f"adc{self.adc_bits}"] if self.adc_bits is not None else []
        if self.adc_bits is not None:
            defaults = CROSSBAR_DEFAULTS
            rule = RANGE_LABELS[self.range_rule].format(p=self.adc_percentile)
            parts += [rule] if self.range_rule != defaults["adc_range"] else []
            parts += [self.adc_granularity] if self.adc_granularity != defaults["adc_granularity"] else []
            parts += ["free"] if self.adc_step != defaults["adc_step"] else []
            parts += ["sym"] if self.adc_window != defaults["adc_window"] else []
        parts += [f"dac{self.dac_bits}"] if self.dac_bits != 8 else []
        parts += [f"inp{self.dac_percentile:g}"] if self.dac_range == "percentile" else []
        parts += (
            [f"c{self.bits_per_cell}x{self.cells_per_weight}"]
            if (self.bits_per_cell, self.cells_per_weight) != (8, 1)
            else []
        )
        model = "" if self.weight_noise_model == "constant" else self.weight_noise_model
        parts += [f"n{model}{self.weight_noise:g}"] if self.weight_noise else []
        parts += [f"stuck{self.stuck_off:g}-{self.stuck_on:g}"] if self.stuck_off or self.stuck_on else []
        parts += [self.drift] if self.drift != "none" else []
        parts += [f"closs-{self.charge_loss}"] if self.charge_loss != "none" else []
        if self.drift != "none" or self.charge_loss != "none":
            parts += [f"t{self.t_inference:g}"] + (["gdc"] if self.drift_compensation else [])
        parts += [f"ir{self.ir_drop:g}"] if self.ir_drop else []
        parts += [f"rn{self.read_noise:g}"] if self.read_noise else []
        short = {"adc_offset": "ofs", "adc_gain": "gain", "adc_inl": "inl", "adc_noise": "adcn"}
        parts += [f"{short[name]}{getattr(self, name):g}" for name in ADC_ERRORS if getattr(self, name)]
        parts += [f"acc{self.accumulator_bits}"] if self.accumulator_bits != 32 else []
        parts += requantizer
        parts += [DIGITAL_DEPTHWISE_LABEL] if self.depthwise != CROSSBAR_DEFAULTS["depthwise"] else []
        parts += ["bc"] if self.bias_correction else []
        return "-".join(parts)

    def crossbar(self) -> Crossbar:
        """The crossbar these settings describe (``integer``: the ideal one)."""
        return Crossbar(**{item.name: getattr(self, item.name) for item in fields(Crossbar)})

    def check_weights(self, signedness: str, weight_bits: int) -> None:
        """Fail unless the cells can hold the magnitude of every weight the `dtype` allows: signed
        (symmetric) weights need ``weight_bits - 1`` magnitude bits, unsigned ones (w - zp up to
        2^bits - 1) ``weight_bits``."""
        needed = weight_bits if signedness.startswith("u") else weight_bits - 1
        capacity = self.bits_per_cell * self.cells_per_weight
        if self.kind == "cim" and capacity < needed:
            raise ValueError(
                f"device.bits_per_cell={self.bits_per_cell} x "
                f"device.cells_per_weight={self.cells_per_weight} hold {capacity} magnitude bits; "
                f"{weight_bits}-bit {signedness} weights need {needed}."
            )

    def tags(self) -> dict[str, str]:
        """The run's ``device.*`` tags: the kind and, for a crossbar, every setting."""
        tags = {"device.kind": self.kind}
        if self.kind == "integer":
            tags |= {f"device.{name}": str(getattr(self, name)) for name in DIGITAL_SETTINGS}
        if self.kind == "cim":
            tags |= {
                f"device.{f.name}": str(getattr(self, f.name)).lower()
                for f in fields(self)
                if f.name not in ("kind", "batch_size")
            }
        return tags


def _percentile_checks(config: DeviceConfig, side: str, rule: str, above: float) -> list[tuple[bool, str]]:
    """``device.<side>_percentile``: a percentile in (``above``, 100], given only with the percentile rule of
    ``device.<side>_range`` (``rule``: the rule in use)."""
    value = getattr(config, f"{side}_percentile")
    return [
        (
            math.isfinite(value) and above < value <= 100,
            f"device.{side}_percentile={value}: expected a percentile in ({above:g}, 100]",
        ),
        (
            value == getattr(Crossbar, f"{side}_percentile") or rule == "percentile",
            f"device.{side}_percentile={value} with device.{side}_range={getattr(config, f'{side}_range')}: "
            f"the percentile applies to device.{side}_range=percentile only",
        ),
    ]


def _changed(config: DeviceConfig, field: object) -> bool:
    return getattr(config, field.name) != field.default


def _fraction_checks(device: DeviceConfig) -> list[tuple[bool, str]]:
    """σs and fractions: finite and >= 0; the stuck fractions at most 1 together."""
    sigmas = ("read_noise", "adc_offset", "adc_gain", "adc_noise")
    checks = [
        (
            math.isfinite(getattr(device, name)) and getattr(device, name) >= 0,
            f"device.{name}={getattr(device, name)}: expected a σ >= 0",
        )
        for name in sigmas
    ]
    stuck = device.stuck_off, device.stuck_on
    checks.append(
        (
            all(math.isfinite(p) and p >= 0 for p in stuck) and sum(stuck) <= 1,
            f"device.stuck_off={device.stuck_off}, device.stuck_on={device.stuck_on}: expected fractions "
            ">= 0 of at most 1 together",
        )
    )
    checks.append((math.isfinite(device.adc_inl), f"device.adc_inl={device.adc_inl}: expected a number"))
    checks.append(
        (
            math.isfinite(device.ir_drop)
            and device.ir_drop >= 0
            and device.ir_drop_g_ratio > 0
            and (device.ir_drop > 0 or device.ir_drop_g_ratio == IR_DROP_G_RATIO),
            f"device.ir_drop={device.ir_drop}, device.ir_drop_g_ratio={device.ir_drop_g_ratio}: expected a "
            "scale >= 0 and a ratio > 0 (the ratio only with an IR drop)",
        )
    )
    return checks


def _drift_checks(device: DeviceConfig) -> list[tuple[bool, str]]:
    """Time and nu's settings only with a drift that reads them, each in its range."""
    defaults = CROSSBAR_DEFAULTS
    off = device.drift == "none" and device.charge_loss == "none"
    nu = [name for name in ("drift_nu_mean", "drift_nu_std") if getattr(device, name) != defaults[name]]
    return [
        (
            math.isfinite(device.t_inference) and device.t_inference >= 0,
            f"device.t_inference={device.t_inference}: expected seconds >= 0",
        ),
        (
            math.isfinite(device.drift_t0) and device.drift_t0 > 0,
            f"device.drift_t0={device.drift_t0}: expected seconds > 0",
        ),
        (
            0 <= device.drift_nu_mean <= 1 and 0 <= device.drift_nu_std <= 1,
            f"device.drift_nu_mean={device.drift_nu_mean}, device.drift_nu_std={device.drift_nu_std}: "
            "expected drift exponents in 0..1 (PCM's are about 0.05-0.1; above 1 a conductance would fall "
            "faster than 1/t)",
        ),
        (
            not off or (device.t_inference == 0 and not device.drift_compensation),
            f"device.t_inference={device.t_inference:g}, device.drift_compensation="
            f"{device.drift_compensation} with device.drift=none and device.charge_loss=none: nothing "
            "changes over time; set device.drift=constant|pcm or device.charge_loss=sonos",
        ),
        (
            device.drift == "constant" or not nu,
            f"{', '.join(f'device.{n}={getattr(device, n)}' for n in nu)} with device.drift={device.drift}: "
            "nu's mean and spread are drift=constant's (pcm draws nu from each cell's level)",
        ),
    ]

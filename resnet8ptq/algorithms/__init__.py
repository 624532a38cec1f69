"""The `algo` config group: post-training algorithms applied to the canonical FP32 ONNX model before a backend
quantizes it, so every backend that starts from that model inherits them.

Each algorithm is one module here with one :class:`~resnet8ptq.algorithms.base.Algorithm` subclass, found
the way backends are: every module of this package except ``base`` and ``_``-prefixed helpers is imported
(:func:`algorithms`). From the modules come
- the order of the steps (their ``STAGE``) and the tags they set;
- the schema :class:`AlgoConfig`: ``steps`` plus each algorithm's parameters as ``<name>_<field>``;
- the group's options (:func:`options`): every combination of at most one algorithm per stage, named by its
  steps joined with ``_`` (``none``, ``cle``, ``cle_adaround``, ...), stored in Hydra's ConfigStore, and the
  search space's ``algo`` choice (``${algo_choice:}`` in ``conf/hydra/sweeper/search.yaml``).
Adding an algorithm is one module; docs/development.md walks through it. The algorithms are written here,
not taken from NNCF, AIMET or Quark: docs/algorithms.md says why.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import pkgutil
import time
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from resnet8ptq.algorithms.base import Algorithm, Context, Prepared, registered
from resnet8ptq.device.config import Crossbar, learned_settings


@cache
def algorithms() -> dict[str, type[Algorithm]]:
    """Every algorithm of the package, by name, in the order of their stages."""
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base" and not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return registered()


def steps_in_order() -> tuple[str, ...]:
    """The algorithms' names in the order their steps run."""
    return tuple(algorithms())


def options() -> dict[str, list[str]]:
    """The `algo` group's options: name -> steps, one for every combination of at most one algorithm per
    stage (``none`` first)."""
    stages = itertools.groupby(algorithms().values(), key=lambda algorithm: algorithm.STAGE)
    choices = [[None, *(algorithm.NAME for algorithm in members)] for _, members in stages]
    combinations = [[name for name in combination if name] for combination in itertools.product(*choices)]
    order = steps_in_order()
    combinations.sort(key=lambda steps: (len(steps), [order.index(name) for name in steps]))
    return {"_".join(steps) or "none": steps for steps in combinations}


@dataclass
class _AlgoSettings:
    """``steps``: the algorithms to apply, at most one per stage, in the order of their stages (empty:
    none); ``reuse``: whether an earlier run's output may be reused; the parameters of every algorithm
    follow as ``<name>_<field>`` (:class:`AlgoConfig`)."""

    steps: list[str] = field(default_factory=list)
    device_aware: bool = False
    """Learn against the run's crossbar (`device=cim`; :mod:`._crossbar`): the weights' rounding, the
    activations' and the ADCs' steps through its row tiles and ADCs. A step that can (``DEVICE_AWARE``:
    ``brecq``, ``qdrop``) must be among the steps."""
    device_noise: bool = False
    """With ``device_aware``: learn on noisy chips, every iteration a new one, its cells drawn with the
    crossbar's cell effects (programming noise, stuck cells, drift or charge loss at ``device.t_inference``
    with its compensation; :mod:`._crossbar`), so that the rounding and the steps hold on a programmed
    chip."""
    reuse: bool = True
    """Take the steps' output from ``cache_dir`` when a run with the same inputs computed it
    (:mod:`._cache`): a sweep over backends learns once. False: compute it again (and store it)."""

    def __post_init__(self) -> None:
        known = algorithms()
        unknown = [step for step in self.steps if step not in known]
        if unknown:
            raise ValueError(f"algo.steps: unknown {unknown}; expected some of {', '.join(known)}.")
        stages = [known[step].STAGE for step in self.steps]
        if stages != sorted(set(stages)):
            raise ValueError(
                f"algo.steps={list(self.steps)}: at most one algorithm per stage, in the order "
                f"{', '.join(known)} (the options: {', '.join(options())})."
            )
        for name in known:
            self.parameters(name)  # each algorithm validates its own
        if self.device_aware and not any(known[step].DEVICE_AWARE for step in self.steps):
            able = [name for name, algorithm in known.items() if algorithm.DEVICE_AWARE]
            raise ValueError(
                f"algo.device_aware=true with algo.steps={list(self.steps)}: none of them learns against "
                f"a device; use one of {', '.join(able)} (e.g. algo=brecq)."
            )
        if self.device_noise and not self.device_aware:
            raise ValueError(
                "algo.device_noise=true learns on noisy chips, which only device-aware learning does; set "
                "algo.device_aware=true too."
            )

    def parameters(self, name: str) -> Any:
        """Algorithm ``name``'s parameters as its own dataclass (None if it has none)."""
        schema = algorithms()[name].Parameters
        if schema is None:
            return None
        values = {item.name: getattr(self, f"{name}_{item.name}") for item in dataclasses.fields(schema)}
        return schema(**values)


def _schema() -> type:
    """``AlgoConfig``: :class:`_AlgoSettings` with every algorithm's parameters as typed fields."""
    fields = []
    for name, algorithm in algorithms().items():
        if algorithm.Parameters is None:
            continue
        hints = typing.get_type_hints(algorithm.Parameters)
        for item in dataclasses.fields(algorithm.Parameters):
            default = (
                field(default_factory=item.default_factory)
                if item.default_factory is not dataclasses.MISSING
                else field(default=item.default)
            )
            fields.append((f"{name}_{item.name}", hints[item.name], default))
    schema = dataclasses.make_dataclass("AlgoConfig", fields, bases=(_AlgoSettings,))
    schema.__module__ = __name__  # make_dataclass's `module` argument is Python 3.12+
    return schema


AlgoConfig = _schema()
"""The `algo` group's schema: ``steps`` and each algorithm's parameters (e.g. ``adaround_iterations``)."""


def parameter_defaults() -> dict[str, Any]:
    """Every algorithm parameter's default, as ``algo.<name>_<field>``."""
    defaults = AlgoConfig()
    return {
        f"algo.{item.name}": getattr(defaults, item.name)
        for item in dataclasses.fields(AlgoConfig)
        if item.name not in {settings.name for settings in dataclasses.fields(_AlgoSettings)}
    }


for _name, _steps in options().items():
    ConfigStore.instance().store(group="algo", name=_name, node=AlgoConfig(steps=_steps))

CHOICE_RESOLVER = "algo_choice"
"""``${algo_choice:}``: the options as a sweep choice, ``choice(none,cle,...)``: the search space's `algo`."""
if not OmegaConf.has_resolver(CHOICE_RESOLVER):
    OmegaConf.register_new_resolver(CHOICE_RESOLVER, lambda: f"choice({','.join(options())})")


def prepare(
    algo: AlgoConfig, onnx_path: Path, context: Context, workdir: Path, cache_dir: Path | None = None
) -> Prepared:
    """Apply ``algo``'s steps, in order, to the model at ``onnx_path`` with ``context`` (the calibration
    images, the quantization, the seed and the run's crossbar), saved as ``workdir/model_fp32_algo.onnx``;
    the model itself when there are none. With ``cache_dir`` (and ``algo.reuse``), an earlier run's output
    for the same inputs is taken from there instead, with the seconds it took then and the tag
    ``algo.reused=true``; a new output is stored there. A job that needs the output another process is
    computing waits for it (a file lock per key). ``context.crossbar``: the device ``algo.device_aware``
    learns against (its settings that the learning sees are part of the key); the steps get a new context
    with what the learning sees of it, and fill that one's ranges and ADC steps."""
    if not algo.steps:
        return Prepared(onnx_path)
    from resnet8ptq.algorithms import _cache

    crossbar = context.crossbar
    learned_on = crossbar.learned(algo.device_noise) if algo.device_aware and crossbar else None
    steps_context = Context(context.images, context.spec, context.seed, learned_on)
    if cache_dir is None:
        return _apply(algo, onnx_path, steps_context, workdir)
    if not algo.reuse:
        prepared = _apply(algo, onnx_path, steps_context, workdir)
        return dataclasses.replace(prepared, tags=prepared.tags | {REUSED_TAG: "false"})
    steps = {name: algo.parameters(name) for name in algo.steps}
    device = learning_settings(learned_on, algo.device_noise) if learned_on is not None else None
    entry_key = _cache.key(onnx_path, context.images, context.spec, steps, context.seed, device)
    with _cache.computing(cache_dir, entry_key):  # a parallel job with the same key waits, then reuses
        found = _cache.load(cache_dir, entry_key, workdir)
        if found is not None:
            return dataclasses.replace(found, tags=found.tags | {REUSED_TAG: "true"})
        prepared = _apply(algo, onnx_path, steps_context, workdir)
        _cache.store(cache_dir, entry_key, prepared)
    return dataclasses.replace(prepared, tags=prepared.tags | {REUSED_TAG: "false"})


REUSED_TAG = "algo.reused"
"""``true`` when a run took its algorithms' output from an earlier run's (`algo.reuse`)."""


def learning_settings(crossbar: Crossbar, noisy: bool) -> dict[str, object]:
    """The crossbar settings device-aware learning sees (:mod:`._crossbar`; ``noisy``: on noisy chips): a run
    that changes any of them learns again."""
    return {name: getattr(crossbar, name) for name in learned_settings(noisy)}


def _apply(algo: AlgoConfig, onnx_path: Path, context: Context, workdir: Path) -> Prepared:
    """The steps run, in order, on a copy of the model at ``onnx_path`` (against ``context.crossbar``, if
    any)."""
    import onnx

    from resnet8ptq.model import save_onnx

    start = time.perf_counter()
    model = onnx.load(onnx_path)
    tags = {}
    for name in algo.steps:
        algorithm = algorithms()[name](algo.parameters(name))
        tags |= {f"algo.{key}": value for key, value in algorithm.apply(model, context).items()}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "model_fp32_algo.onnx"
    save_onnx(model, path)
    return Prepared(path, time.perf_counter() - start, tags, context.ranges, context.adc_steps)

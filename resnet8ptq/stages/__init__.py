"""A run's stages: what `pipeline.run` does after resolving the configuration, one module each.

A stage is a :class:`Stage` subclass in a module of this package, bound to the module's ``STAGE``; the
stages run in ``order`` (ties by name). Each says when it runs (:meth:`Stage.enabled`), what it computes
from the run's inputs and the results of the stages before it (:meth:`Stage.run`), and how its result is
logged (:meth:`Stage.log`); its result goes into the run's :class:`RunRecord`, and every stage's result is
logged once, in order, when all have run. The built-in stages (:data:`BUILT_IN`) log names that
:mod:`resnet8ptq.tracking.schema` defines; a stage added as a module declares its own (``metrics``,
``tags``: name -> meaning) and returns a :class:`StageResult`, which the default :meth:`Stage.log` writes;
the schema, the report and the explorer pick its names up from the declaration. A new evaluation target
(an energy estimate, a second device kind) is one module here and no edit elsewhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from resnet8ptq.inputs import RunInputs
    from resnet8ptq.resolve import Plan
    from resnet8ptq.shared import Shared

BUILT_IN = ("fp32", "published", "quantize", "layers", "device", "costs", "mcu")
"""The stages of this package's own modules, in the order they run; their names are in the schema."""


@dataclass(frozen=True)
class StageResult:
    """What a stage added as a module logs: metrics, tags and files (artifact folder, path)."""

    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    files: tuple[tuple[str, Path], ...] = ()

    def log(self, run_id: str) -> None:
        """Log the metrics, tags and files on run ``run_id``."""
        from resnet8ptq.tracking.runs import log_artifacts, log_metrics, set_tags

        log_metrics(run_id, dict(self.metrics))
        set_tags(run_id, dict(self.tags))
        log_artifacts(run_id, list(self.files))


@dataclass
class RunRecord:
    """One run as its stages fill it: the resolved configuration, the run's id and output directory, what
    the runs of the process share, and each stage's result by the stage's name (absent: it did not run)."""

    plan: Plan
    run_id: str
    output_dir: Path
    shared: Shared
    results: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, stage: str) -> Any:
        """The result of the stage named ``stage``; ``KeyError`` naming the stages that ran if it did not."""
        if stage not in self.results:
            raise KeyError(f"stage {stage!r} has not run in this run (ran: {', '.join(self.results)})")
        return self.results[stage]


class Stage:
    """One step of a run. Subclasses set ``name`` and ``order`` and override :meth:`run`; ``metrics`` and
    ``tags`` declare what a stage outside :data:`BUILT_IN` logs (name -> one-line meaning)."""

    name: ClassVar[str]
    order: ClassVar[int]
    metrics: ClassVar[Mapping[str, str]] = {}
    tags: ClassVar[Mapping[str, str]] = {}

    def enabled(self, plan: Plan) -> bool:
        """Whether the run with this ``plan`` has this stage (default: every run)."""
        return True

    def run(self, inputs: RunInputs, record: RunRecord) -> Any:
        """The stage's result, from the run's ``inputs`` and the results in ``record`` so far."""
        raise NotImplementedError

    def log(self, inputs: RunInputs, record: RunRecord, result: Any) -> None:
        """Log ``result`` on the run (default: a :class:`StageResult`'s metrics, tags and files)."""
        if result is not None:
            result.log(record.run_id)


def _found(modules: list[str]) -> tuple[Stage, ...]:
    """The stages (each module's ``STAGE``) of these modules of this package, in ``order``, ties by name."""
    stages = []
    for name in modules:
        stage = getattr(importlib.import_module(f"{__name__}.{name}"), "STAGE", None)
        if stage is not None:
            if not isinstance(stage, Stage):
                raise TypeError(f"{__name__}.{name}.STAGE is not a Stage: {stage!r}")
            stages.append(stage)
    names = [stage.name for stage in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"two stages share a name: {sorted(names)}")
    return tuple(sorted(stages, key=lambda stage: (stage.order, stage.name)))


@cache
def registered() -> tuple[Stage, ...]:
    """Every stage of this package's modules (their ``STAGE``), in ``order``, ties by name."""
    return _found([module.name for module in pkgutil.iter_modules(__path__)])


@cache
def added() -> tuple[Stage, ...]:
    """The stages outside :data:`BUILT_IN` (only their modules are imported: they declare their names)."""
    return _found([m.name for m in pkgutil.iter_modules(__path__) if m.name not in BUILT_IN])


def declared(kind: str) -> dict[str, str]:
    """The ``kind`` (metric, tag) names the added stages declare, with their meanings."""
    return {name: meaning for stage in added() for name, meaning in getattr(stage, f"{kind}s").items()}

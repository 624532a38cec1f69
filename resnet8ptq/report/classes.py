"""Each run's classes, for any network: their names in label order (the run's ``classes`` tag) and its
per-class accuracy columns (metrics ``class_acc/<name>``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from resnet8ptq.data import CLASS_NAMES

CLASS_METRIC = "class_acc/"
CLASSES_TAG = "classes"  # the model's classes in label order, a JSON list (stages/fp32.py logs it)


def run_classes(tags: Mapping[str, str], metrics: Iterable[str], network: str) -> tuple[str, ...]:
    """A run's classes in label order: its ``classes`` tag; before the tag, CIFAR-10's for ResNet8 and the
    names of its ``class_acc/*`` metrics (sorted: their label order was not recorded) for another network."""
    if CLASSES_TAG in tags:
        return tuple(json.loads(tags[CLASSES_TAG]))
    if network == "resnet8":
        return CLASS_NAMES
    return tuple(sorted(name[len(CLASS_METRIC) :] for name in metrics if name.startswith(CLASS_METRIC)))


def class_columns(classes: Iterable[str]) -> list[str]:
    """The table's per-class accuracy columns of ``classes``."""
    return [f"{CLASS_METRIC}{name}" for name in classes]

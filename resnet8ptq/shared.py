"""What the runs of one process share: an explicit object, made by the process (``app.task``'s
:data:`PROCESS`) or by a test, and passed down to every run (:func:`resnet8ptq.pipeline.run`).

Each entry is kept under everything that decides it, so a run's result never depends on which runs came
before it in the process, only its time does:

* ``backend``: one instance per backend settings (the resolved YAML) and thread count; its FP32 baseline is
  shared with it;
* ``dataset``: CIFAR-10 by (root, download, cache directory), read and MD5-verified once;
* ``test_set``, ``run_inputs``: by the dataset object (identity) and, for the MLflow datasets, the
  calibration sample (images per class, seed);
* ``baseline``: a backend's FP32 model evaluated on the test set, by (backend instance, FP32 file, cache
  directory, dataset object);
* :attr:`Shared.quantized`: the two most recent quantizations, by the config_hash of their settings without
  ``device`` (a sweep over device settings quantizes once).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from resnet8ptq.records import Quantization

T = TypeVar("T")


class Recent:
    """The few most recent quantizations, by the config_hash of their settings without `device`."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._items: dict[str, Quantization] = {}

    def get(self, key: str) -> Quantization | None:
        return self._items.get(key)

    def put(self, key: str, made: Quantization) -> None:
        self._items.pop(key, None)
        self._items[key] = made
        while len(self._items) > self.size:
            self._items.pop(next(iter(self._items)))


class Shared:
    """The process's shared objects (the module docstring lists them and their keys)."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, tuple[Hashable, ...]], Any] = {}
        self.quantized = Recent()

    def get(self, kind: str, key: tuple[Hashable, ...], make: Callable[[], T]) -> T:
        """The ``kind`` object kept under ``key``, made (once) by ``make``."""
        if (kind, key) not in self._kept:
            self._kept[(kind, key)] = make()
        return self._kept[(kind, key)]

    def kept(self, kind: str) -> int:
        """How many ``kind`` objects are kept."""
        return sum(1 for kept_kind, _ in self._kept if kept_kind == kind)


PROCESS = Shared()
"""This process's: the jobs of a multirun in Hydra's default launcher share it (``app.task``)."""

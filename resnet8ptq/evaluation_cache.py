"""Evaluations on disk (``cache_dir/eval/<key>/``): runs that evaluate the same model on the same test set on
the same machine (a sweep over device settings run again, the FP32 baseline of every sweep, a configuration
logged to another store) read the predictions and timings an earlier run measured instead of running the
10,000 images again. On the 2-core AVX2-only AMD EPYC, one thread, an ONNX Runtime int8 run spends 10 s in
its reference pass and 6 s in its native pass, its FP32 baseline 5 s, LiteRT's reference kernels 60 s.

The key (:func:`resnet8ptq.disk_cache.key`) is what an evaluation depends on: the model's content
(:func:`resnet8ptq.digests.model_digest`), which of its forms ran and with which kernels (the reference,
the runtime form, whether they are one program), the backend, its ``native`` setting and threads, the test
set (the content digest the run logs with its MLflow dataset, and the arrays' shapes and types), the
backend's library versions, this package's source, and the machine as a run
records it (CPU, ISA, cores, kernel-path variables): a timing measured on another CPU is never reused. An
entry holds each form's outputs exactly (``.npy``), its timed pass's seconds and the single-image
latency; the predictions, the metric's value and everything derived are recomputed from them, and the
verdict from the run's own ``native_tolerance_points``. A run that reads an entry logs the seconds and
speed measured then and the tag ``eval.reused=true``. Delete ``cache_dir/eval`` to evaluate again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from resnet8ptq import disk_cache
from resnet8ptq.evaluate import Measured, TestSet, scored

if TYPE_CHECKING:
    from resnet8ptq.backends.base import Backend

CACHE_SUBDIR = "eval"
RECORD_FILE = "record.json"
REUSED_TAG = "eval.reused"
"""``true`` when a run's evaluation (predictions, seconds, speed) came from an earlier run's."""


@dataclass(frozen=True)
class EvaluationCache:
    """Where one backend's evaluations are kept and what they depend on besides the model and its forms
    (``settings``)."""

    root: Path
    settings: Mapping[str, object]

    @classmethod
    def of(cls, backend: Backend, cache_dir: Path, test_set: str) -> EvaluationCache:
        """The cache of ``backend``'s evaluations under ``cache_dir`` on the test set whose content digest is
        ``test_set`` (:attr:`resnet8ptq.inputs.RunInputs.test_set_digest`: computed once per process, where
        hashing the 123 MB of model input again for each evaluation took 0.2 s)."""
        from resnet8ptq.hardware import detect

        settings = {
            "test_set": test_set,
            "backend": backend.NAME,
            "native": backend.native,
            "threads": backend.threads,
            "versions": backend.versions(),
            "machine": detect().tags(),
        }
        return cls(Path(cache_dir) / CACHE_SUBDIR, settings)

    def key(self, model_path: Path, forms: Mapping[str, object], test: TestSet) -> str:
        """The entry of the model at ``model_path`` with these ``forms`` on the ``test`` set: the test set
        whose digest the cache was made with (its arrays' shapes and types go into the key too)."""
        from resnet8ptq.digests import model_digest

        parts = {
            **self.settings,
            "model": model_digest(model_path),
            "forms": dict(forms),
            "arrays": [[list(a.shape), str(a.dtype)] for a in (test.inputs, np.asarray(test.labels))],
        }
        return disk_cache.key(parts, ("numpy",))

    def measured(
        self,
        model_path: Path,
        forms: Mapping[str, object],
        test: TestSet,
        measure: Callable[[], Measured],
    ) -> Measured:
        """``measure()``, or what an earlier run's ``measure()`` of the same key stored. A job that needs an
        entry another process is measuring waits for it (a file lock per key): the two would contend for
        the same cores anyway."""
        entry_key = self.key(model_path, forms, test)
        with disk_cache.computing(self.root, entry_key):
            found = _load(self.root / entry_key, test)
            if found is not None:
                return found
            result = measure()
            disk_cache.store(self.root, entry_key, lambda directory: _write(directory, result))
        return result


def _write(directory: Path, measured: Measured) -> None:
    for index, evaluation in enumerate(measured.evaluations):
        np.save(directory / f"probabilities_{index}.npy", evaluation.probabilities)
    record = {
        "eval_seconds": [evaluation.eval_seconds for evaluation in measured.evaluations],
        "latency_ms_b1": measured.latency_ms_b1,
    }
    (directory / RECORD_FILE).write_text(json.dumps(record))


def _load(entry: Path, test: TestSet) -> Measured | None:
    """A stored entry, or None when there is none, only part of one, or one that cannot be read (a damaged
    file: it is measured again and replaced)."""
    if not (entry / RECORD_FILE).is_file():
        return None
    try:
        record = json.loads((entry / RECORD_FILE).read_text())
        seconds, latency = [float(value) for value in record["eval_seconds"]], float(record["latency_ms_b1"])
        probabilities = [np.load(entry / f"probabilities_{index}.npy") for index in range(len(seconds))]
    except (OSError, ValueError, KeyError, TypeError):  # JSONDecodeError is a ValueError
        return None
    if not seconds or any(p.ndim < 2 or len(p) != len(test.labels) for p in probabilities):
        return None
    evaluations = tuple(scored(p, test, s) for p, s in zip(probabilities, seconds, strict=True))
    return Measured(evaluations, latency, reused=True)

"""The one way the tool starts helper processes (the chart drawer, TFLite Micro's workers): multiprocessing's
spawn context, made usable inside a joblib launcher job."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import SpawnContext

STANDARD_METHODS = (None, "fork", "spawn", "forkserver")


def spawn_context() -> SpawnContext:
    """The spawn context. In a joblib (loky) worker the process's default start method is "loky", which a
    spawned child copies and cannot resolve ("cannot find context for 'loky'": its pool breaks), so the
    default is set to "spawn" first; the worker's own pool lives in its parent and is not affected."""
    if multiprocessing.get_start_method(allow_none=True) not in STANDARD_METHODS:
        multiprocessing.set_start_method("spawn", force=True)
    return multiprocessing.get_context("spawn")

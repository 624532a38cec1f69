"""Helper processes (the chart drawer, TFLite Micro's workers): multiprocessing's spawn context, except
inside a joblib launcher job, which does their work in its own process instead."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import SpawnContext

STANDARD_METHODS = (None, "fork", "spawn", "forkserver")


def spawn_context() -> SpawnContext | None:
    """The spawn context, or None inside a joblib (loky) worker. There the process's default start method is
    "loky", which a spawned child copies and cannot resolve ("cannot find context for 'loky'": its pool
    breaks); setting the default back to "spawn" let the children start but hung the loky workers after a few
    jobs (seen in a 50-run sweep), so the caller does the work in its own process."""
    if multiprocessing.get_start_method(allow_none=True) not in STANDARD_METHODS:
        return None
    return multiprocessing.get_context("spawn")

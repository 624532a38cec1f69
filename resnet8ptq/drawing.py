"""A process of its own that draws the runs' charts while the runs go on.

A run's charts are pure functions of small arrays (a 10x10 confusion matrix, ten accuracies, a few dozen
SQNRs), but matplotlib takes about 0.35 s of one core per run to lay out and rasterise their ~150 labels,
while the run logs its model with the other core idle. So one worker process (``concurrent.futures``, spawned:
the run's process has torch's and ORT's thread pools, which a fork would copy mid-flight) draws them: a run
hands its charts over as soon as it has their data (:func:`draw`) and collects the files when it logs them
(:meth:`Drawing.path`), never later, so that no chart is drawn while the next run's passes are timed. The
worker starts with a process's first run (:func:`start`), importing matplotlib while the run sets up, and a
run waits for it to be up before it times anything (:func:`wait_started`).

Without the worker (a report written on its own, a worker that died, hung or could not start) a chart is drawn
in the calling process when its file is collected: the figures never depend on the worker, and only then is
matplotlib imported there. A worker that has not drawn a chart after CHART_TIMEOUT_S is taken as hung and
killed (a killed worker breaks the pool, so every later chart is drawn in the calling process too).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from resnet8ptq.spawning import spawn_context

log = logging.getLogger(__name__)

_worker: ProcessPoolExecutor | None = None
_started: Future[int] | None = None  # the warm-up: its result is the worker's pid

CHART_TIMEOUT_S = 120.0
"""How long a run waits for one chart from the worker (a chart takes about 0.1 s)."""


@dataclass(frozen=True)
class Drawing:
    """A chart being drawn by the worker: ``chart(*args)``, which writes a PNG and returns its path."""

    chart: Callable[..., Path]
    args: tuple
    future: Future[Path] | None

    def path(self) -> Path:
        """The chart's file, once drawn (in this process if the worker could not draw it)."""
        if self.future is not None:
            try:
                return self.future.result(timeout=CHART_TIMEOUT_S)
            except BrokenProcessPool:
                log.warning("The chart-drawing process stopped; drawing %s here", self.chart.__name__)
            except TimeoutError:
                log.warning(
                    "The chart-drawing process did not draw %s in %.0f s; stopping it and drawing here",
                    self.chart.__name__,
                    CHART_TIMEOUT_S,
                )
                _kill_worker()
        return self.chart(*self.args)


def start() -> None:
    """Start the drawing process, if it is not running yet (it imports matplotlib and loads its fonts)."""
    global _worker, _started
    if _worker is not None:
        return
    context = spawn_context()
    if context is None:  # a joblib launcher job: the charts are drawn in this process
        return
    worker = ProcessPoolExecutor(max_workers=1, mp_context=context)
    try:
        _started = worker.submit(_warm_up)  # spawns the process
    except OSError as err:  # e.g. a process limit: the charts are drawn here instead
        log.warning("Cannot start the chart-drawing process (%s); charts are drawn in this process", err)
        worker.shutdown(wait=False)
        return
    _worker = worker
    atexit.register(stop)


def wait_started() -> None:
    """Return once the drawing process is up, so that its start-up is over before anything is timed."""
    if _started is not None:
        try:
            _started.result()
        except BrokenProcessPool:
            log.warning("The chart-drawing process did not start; charts are drawn in this process")
        except Exception as err:  # its warm-up failed: the run goes on (a chart failing so will say so)
            log.warning("The chart-drawing process could not load matplotlib's fonts: %s", err)


def draw(chart: Callable[..., Path], *args: object) -> Drawing:
    """Have ``chart(*args)`` drawn by the drawing process if it runs (:func:`start`), else in this process
    when its file is collected (a report written on its own need not start a process for three charts)."""
    future = None
    if _worker is not None:
        with contextlib.suppress(BrokenProcessPool):
            future = _worker.submit(chart, *args)
    return Drawing(chart, args, future)


def _kill_worker() -> None:
    """Kill the worker process (it hangs): its pool breaks, so nothing waits for it, at exit either."""
    if _started is not None and _started.done() and _started.exception() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(_started.result(), signal.SIGKILL)


def stop() -> None:
    """Stop the drawing process (charts handed over are drawn first)."""
    global _worker, _started
    if _worker is not None:
        _worker.shutdown(wait=True)
    _worker = _started = None


def _warm_up() -> int:
    """matplotlib's fonts, and the report's chart module with pandas (its charts take DataFrames): imported
    now, while the run sets up, they would otherwise be imported while the sweep waits for its report.
    Returns the worker's pid."""
    import resnet8ptq.report.figures  # noqa: F401
    from resnet8ptq.plots import warm_up

    warm_up()
    return os.getpid()

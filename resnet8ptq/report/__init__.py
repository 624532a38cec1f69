"""Comparison report of a sweep's runs (or a whole experiment's), read back from MLflow.

:mod:`.writer` (:func:`~.writer.write_report`, :func:`~.writer.write_experiment_report`) writes report.md, a
self-contained report.html and the PNGs they show, and logs them to the sweep's parent run;
`python -m resnet8ptq.report` is the command line (:mod:`.cli`); the sweep callback writes the report at the
end of every invocation. Modules: :mod:`.runs` (MLflow -> table), :mod:`.analysis` (picks, fronts),
:mod:`.figures`, :mod:`.sections` (Markdown; :mod:`.published`, :mod:`.significance`, :mod:`.widths` for
their sections), :mod:`.render` (HTML).

This file imports nothing: the chart-drawing process imports :mod:`.figures` to draw the report's charts, and
with it this package, and must not pay for MLflow, SQLAlchemy and SciPy (about 1.2 s) to do so.
"""

"""Accuracy-aware search: what a search optimises (:mod:`.objectives`, the `search` settings and the Optuna
sweeper's trials), the conditional part of its space (:mod:`.space`), and mixed precision to a target accuracy
drop (:mod:`.target`, the `target` settings)."""

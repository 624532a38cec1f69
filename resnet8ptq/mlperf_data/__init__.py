"""MLPerf Tiny's data sets, prepared from a user's copy as MLPerf Tiny's own training scripts prepare them,
into the ``.npz`` layout that ``data=npz`` reads (:mod:`resnet8ptq.datasets`).

``python -m resnet8ptq.datasets prepare vww --source vw_coco2014_96`` writes ``vww.npz``; then
``python run.py model=vww data=npz``. One module per data set (:mod:`.vww`, :mod:`.kws`, :mod:`.ad`), each a
:class:`Preparer`: it checks the source before any work (:class:`~resnet8ptq.errors.DataError`: what is
missing, where), then reads and transforms it. The file is written whole or not at all.

The data sets are not downloaded by the tool: they are large (Speech Commands v2 2.3 GB, the Visual Wake
Words set and ToyADMOS several GB) and each comes with its own terms; each :class:`Preparer` says where its
data set comes from.
"""

from __future__ import annotations

from pathlib import Path

from resnet8ptq.errors import DataError
from resnet8ptq.mlperf_data.base import Options, Preparer, write_npz

__all__ = ["Options", "prepare", "preparers"]


def preparers() -> dict[str, Preparer]:
    """Every data set this package prepares, by the `model` group's name of its network."""
    from resnet8ptq.mlperf_data import ad, kws, vww

    return {"vww": vww.PREPARER, "kws": kws.PREPARER, "ad": ad.PREPARER}


def prepare(name: str, source: Path, out: Path, options: Options) -> Path:
    """Check ``source`` as data set ``name``'s layout, prepare it and write ``out`` (atomically)."""
    known = preparers()
    if name not in known:
        raise DataError(f"no MLPerf Tiny data set {name!r}: one of {', '.join(known)}")
    if not source.is_dir():
        raise DataError(f"{name}: --source {source} is not a folder; it should be {known[name].source}")
    if options.calibration < 1:
        raise DataError(f"{name}: --calibration must be at least 1, not {options.calibration}")
    known[name].check(source, options)
    write_npz(known[name].prepare(source, options), out)
    return out

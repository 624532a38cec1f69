"""The data a run calibrates and evaluates on (the `data` group, conf/data/): CIFAR-10 (:mod:`resnet8ptq.data`
reads and verifies its files) or a user's own arrays in one ``.npz`` file, each as a :class:`Dataset` of model
inputs and labels. A data set is one function here and one YAML file in conf/data/.

The ``.npz`` layout (:data:`NPZ_KEYS`): ``calibration_inputs`` (N, ...) and ``test_inputs`` (M, ...), what the
model takes, any real dtype (read as float32); ``test_labels`` (M,) integers; optionally ``class_names`` (K,)
strings and ``test_groups`` (M,) integers: the test inputs of one group are one scored sample (an audio
clip's frames, scored by their mean reconstruction error as MLPerf Tiny's anomaly detection scores a
clip). ``python -m resnet8ptq.datasets generate`` writes one of a model's input shape, of generated inputs
(for a structural run where the real data is not at hand: its accuracy means nothing).
"""

from __future__ import annotations

import argparse
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from resnet8ptq.data import (
    BINARY_DIR,
    CLASS_NAMES,
    MD5_CACHE,
    PYTHON_DIR,
    Cifar10,
    calibration_indices,
    load_cifar10,
    to_model_input,
)
from resnet8ptq.errors import DataError
from resnet8ptq.fetch import sha256_of
from resnet8ptq.metrics import Metric, metric

NPZ_KEYS = ("calibration_inputs", "test_inputs", "test_labels")
"""The arrays a data set's ``.npz`` must hold; ``class_names`` may be there too."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """A data set as the model takes it: float32 inputs, int64 labels (read-only), where it came from
    and how it was checked, its classes' names (empty: not named by the data), MLPerf Tiny's performance
    subset of its test split (empty where MLPerf defines none for it) and what its calibration sample is."""

    name: str
    test_inputs: np.ndarray
    test_labels: np.ndarray
    calibration_inputs: np.ndarray
    calibration_labels: np.ndarray | None
    source: Path
    verified: str
    class_names: tuple[str, ...] = ()
    perf_subset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    calibration_sample: dict[str, Any] = field(default_factory=dict)
    test_groups: np.ndarray | None = None  # per test input, the scored sample it belongs to (None: itself)

    @property
    def calibration_name(self) -> str:
        """The calibration sample's name as a logged data set."""
        return self.calibration_sample.get("name", f"{self.name}-calibration")


def cifar10(data: Cifar10, per_class: int, seed: int, perf_subset: np.ndarray) -> Dataset:
    """CIFAR-10's full test split and the stratified calibration sample of its training split (``per_class``
    images of each class, drawn with ``seed``), as the model takes them (NHWC float32, raw 0-255 pixels)."""
    indices = calibration_indices(data.train_labels, per_class, seed)
    sample = {
        "name": f"cifar10-train-calibration-{per_class}x10-seed{seed}",
        "split": "CIFAR-10 training batches data_batch_1..5, concatenated in file order (50,000 images)",
        "per_class": per_class,
        "seed": seed,
        "indices": indices.tolist(),
        "images": "NHWC raw 0-255 pixels as the model takes them (no normalisation)",
    }
    return Dataset(
        "cifar10",
        to_model_input(data.test_images),
        data.test_labels,
        to_model_input(data.train_images[indices]),
        read_only(data.train_labels[indices].copy()),
        data.root / (BINARY_DIR if data.layout == "binary" else PYTHON_DIR),
        f"md5 ({data.layout} layout)",
        CLASS_NAMES,
        perf_subset,
        sample,
    )


def load_cifar10_dataset(
    root: str,
    download: bool,
    cache_dir: str,
    per_class: int,
    seed: int,
    perf_subset: Callable[[], np.ndarray],
) -> Dataset:
    """CIFAR-10 found (or downloaded) under ``root`` and verified (:func:`resnet8ptq.data.load_cifar10`)."""
    data = load_cifar10(Path(root), download=download, md5_cache=Path(cache_dir) / MD5_CACHE)
    return cifar10(data, per_class, seed, perf_subset())


def load_npz(path: str | Path) -> Dataset:
    """A user's arrays (the module's layout), checked before any is used: the keys, the inputs' shapes
    against each other, the labels' count, dtype and sign; :class:`DataError` names what is wrong."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise DataError(f"data.path={path} does not exist; give an .npz file with {', '.join(NPZ_KEYS)}.")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            found = {key: arrays[key] for key in arrays.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise DataError(f"{path} is not a readable .npz file ({err}).") from err
    missing = [key for key in NPZ_KEYS if key not in found]
    if missing:
        raise DataError(
            f"{path} lacks {', '.join(missing)} (it holds {', '.join(sorted(found)) or 'nothing'}); "
            f"a data set's .npz holds {', '.join(NPZ_KEYS)} and optionally class_names."
        )
    calibration = model_inputs(path, "calibration_inputs", found["calibration_inputs"])
    test = model_inputs(path, "test_inputs", found["test_inputs"])
    if calibration.shape[1:] != test.shape[1:]:
        raise DataError(
            f"{path}: calibration_inputs are {calibration.shape[1:]} per sample, test_inputs "
            f"{test.shape[1:]}; both must be what the model takes."
        )
    labels = found["test_labels"]
    if labels.shape != (len(test),) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"{path}: test_labels are {labels.dtype} {labels.shape}; expected integers of shape "
            f"({len(test)},), one per test input."
        )
    if labels.size and labels.min() < 0:
        raise DataError(f"{path}: test_labels hold {labels.min()}; labels are class indices from 0.")
    names = found.get("class_names")
    class_names = () if names is None else tuple(str(name) for name in np.asarray(names).ravel())
    groups = found.get("test_groups")
    if groups is not None:
        groups = read_only(checked_groups(path, np.asarray(groups), labels))
    sample = {"name": f"{path.stem}-calibration", "file": str(path), "key": "calibration_inputs"}
    return Dataset(
        "npz",
        test,
        read_only(labels.astype(np.int64)),
        calibration,
        None,
        path,
        f"sha256 {sha256_of(path)}",
        class_names,
        calibration_sample=sample,
        test_groups=groups,
    )


def checked_groups(path: Path, groups: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``test_groups`` as int64, refused unless there is one integer per test input and every group's inputs
    share one label (a group is one scored sample: an audio clip's frames)."""
    if groups.shape != labels.shape or not np.issubdtype(groups.dtype, np.integer):
        raise DataError(
            f"{path}: test_groups are {groups.dtype} {groups.shape}; expected integers of shape "
            f"{labels.shape}, one per test input."
        )
    names, index = np.unique(groups, return_inverse=True)
    low, high = np.full(len(names), np.iinfo(np.int64).max), np.full(len(names), -1)
    np.minimum.at(low, index, labels)
    np.maximum.at(high, index, labels)
    mixed = names[low != high]
    if mixed.size:
        raise DataError(
            f"{path}: test_groups {', '.join(map(str, mixed[:5]))} hold inputs of different labels; a group "
            "is one scored sample (an audio clip's frames) with one label."
        )
    return groups.astype(np.int64)


def model_inputs(path: Path, key: str, array: np.ndarray) -> np.ndarray:
    """``array`` as float32 model inputs, refused unless it holds real numbers of at least one sample."""
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise DataError(f"{path}: {key} is {array.dtype}; expected real numbers (float or integer).")
    if array.ndim < 2 or len(array) == 0:
        raise DataError(f"{path}: {key} has shape {array.shape}; expected (N, ...) with N >= 1 samples.")
    return np.ascontiguousarray(array, np.float32)


def read_only(array: np.ndarray) -> np.ndarray:
    """``array``, made read-only (the data sets are shared by the runs of a process)."""
    array.setflags(write=False)
    return array


def check_fits(
    dataset: Dataset,
    input_shape: tuple[int | None, ...],
    output_shape: tuple[int, ...],
    metric: Metric,
    model: str,
) -> None:
    """Refuse, naming both, data whose inputs the model cannot take (``input_shape``: the model's per-sample
    shape, None where free) or whose labels its ``metric`` cannot score against outputs of
    ``output_shape``."""
    shape = dataset.test_inputs.shape[1:]
    fits = len(shape) == len(input_shape) and all(
        d in (None, s) for d, s in zip(input_shape, shape, strict=True)
    )
    if not fits:
        wanted = ", ".join(["N", *("?" if d is None else str(d) for d in input_shape)])
        raise DataError(
            f"{model}: the model takes inputs of shape ({wanted}); data={dataset.name} ({dataset.source}) "
            f"gives (N, {', '.join(map(str, shape))}). Choose the model's data (data=npz data.path=FILE; "
            "`python -m resnet8ptq.datasets generate` writes arrays of a model's shape)."
        )
    refused = metric.check(tuple(shape), output_shape, dataset.test_labels, model)
    if refused:
        raise DataError(f"{refused} (data={dataset.name}, {dataset.source}).")
    classes = metric.classes(output_shape)
    if dataset.class_names and len(dataset.class_names) != classes:
        raise DataError(
            f"{model}: its labels have {classes} classes; data={dataset.name} names "
            f"{len(dataset.class_names)} ({', '.join(dataset.class_names)})."
        )


def class_names(configured: list[str] | tuple[str, ...], dataset: Dataset, classes: int, model: str) -> tuple:
    """The classes' names: the model's (``model.classes``), else the data's, else ``0`` .. ``K-1``; refused
    unless there are as many as the labels' ``classes`` (a classifier's outputs)."""
    names = tuple(configured) or dataset.class_names or tuple(str(k) for k in range(classes))
    if len(names) != classes:
        raise DataError(
            f"{model}: its labels have {classes} classes; model.classes names {len(names)} "
            f"({', '.join(names)}). Set model.classes to its {classes} classes in label order, or [] ."
        )
    return names


def generate(out: Path, shape: tuple[int, ...], classes: int, test: int, calibration: int, seed: int) -> Path:
    """Write a data set's ``.npz`` of generated inputs (uniform in [0, 1), float32) of per-sample ``shape``,
    ``test`` test inputs with seeded labels in 0..``classes``-1 and ``calibration`` calibration inputs: for a
    structural run of a model whose data is not at hand (what it measures is agreement, not accuracy)."""
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        out,
        calibration_inputs=rng.random((calibration, *shape), dtype=np.float32),
        test_inputs=rng.random((test, *shape), dtype=np.float32),
        test_labels=rng.integers(0, classes, test).astype(np.int64),
    )
    return out


def model_shape(model: str, overrides: list[str]) -> tuple[tuple[int, ...], int]:
    """The per-sample input shape and the number of classes of the `model` group's choice ``model`` (with
    Hydra ``overrides``, e.g. ``model.path=...``), read from its canonical ONNX model (converted, and cached,
    as a run would)."""
    from hydra import compose, initialize_config_dir

    from resnet8ptq.model import model_io
    from resnet8ptq.resolve import fp32_model

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model}", *overrides])
    shape, outputs = model_io(fp32_model(cfg.model, Path(cfg.cache_dir)))
    if None in shape:
        raise DataError(f"model={model} takes inputs of a free shape {shape}; give --shape.")
    return tuple(shape), metric(cfg.model.metric).classes(outputs)


def main(argv: list[str] | None = None) -> None:
    """``python -m resnet8ptq.datasets generate --model vww`` (writes vww.npz) or ``--shape 96,96,3
    --classes 2 OUT.npz``; ``prepare vww --source DIR`` (MLPerf Tiny's own data set:
    :mod:`resnet8ptq.mlperf_data`)."""
    from resnet8ptq.mlperf_data import Options, prepare, preparers

    parser = argparse.ArgumentParser(prog="python -m resnet8ptq.datasets", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("generate", help="write an .npz of generated inputs of a model's shape")
    make.add_argument("out", type=Path, nargs="?", help="the .npz file to write (default: <model>.npz)")
    make.add_argument("--model", help="a `model` group choice (vww, kws, ...): its shape and classes")
    make.add_argument("--shape", help="one input's shape, e.g. 96,96,3 (VWW), 49,10,1 (KWS)")
    make.add_argument("--classes", type=int, help="the model's number of classes")
    make.add_argument("--test", type=int, default=500, help="test inputs (default 500)")
    make.add_argument("--calibration", type=int, default=200, help="calibration inputs (default 200)")
    make.add_argument("--seed", type=int, default=0)
    what = "a setting of the model, e.g. model.path=my_net.h5 (with --model custom)"
    make.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help=what)
    ready = commands.add_parser(
        "prepare", help="prepare an MLPerf Tiny data set from your copy, as MLPerf does"
    )
    ready.add_argument("name", choices=sorted(preparers()), help="the network whose data set it is")
    ready.add_argument("--source", type=Path, required=True, help="your copy's folder (see the docs)")
    ready.add_argument("--calibration-source", type=Path, help="kws: Speech Commands' main archive's folder")
    ready.add_argument("--out", type=Path, help="the .npz file to write (default: <name>.npz)")
    ready.add_argument("--calibration", type=int, default=200, help="calibration inputs (default 200)")
    ready.add_argument("--seed", type=int, default=0, help="the calibration sample's seed")
    ready.add_argument("--machine-id", help="ad: one machine ID's test clips (01, id_01); default: all")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        options = Options(args.calibration, args.seed, args.calibration_source, args.machine_id)
        written = prepare(args.name, args.source, args.out or Path(f"{args.name}.npz"), options)
        print(f"wrote {written}: model={args.name} data=npz data.path={written}")
        return
    if args.model is not None:
        shape, classes = model_shape(args.model, args.override)
        out = args.out or Path(f"{args.model}.npz")
    elif args.shape and args.classes and args.out:
        shape, classes, out = tuple(int(d) for d in args.shape.split(",")), args.classes, args.out
    else:
        parser.error("give --model NAME, or OUT with --shape and --classes")
    written = generate(out, shape, classes, args.test, args.calibration, args.seed)
    print(f"wrote {written}: model={args.model or 'custom'} data=npz data.path={written}")


if __name__ == "__main__":
    main()

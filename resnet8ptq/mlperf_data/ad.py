"""Anomaly detection's log-mel frames as MLPerf Tiny's ``common.py`` (``file_to_vector_array``, with
``baseline.yaml``'s settings) computes them, on ToyADMOS's ToyCar as its ``01_test.py`` lists the files.

* Each clip (``librosa.load``, its own sample rate): ``librosa.feature.melspectrogram`` with ``n_fft`` 1024,
  hop 512, 128 mel bands, power 2; ``10 * log10(mel + eps)``; frames 50-249 kept; every 5 consecutive frames
  concatenated into one 640-value vector: 196 vectors per 10-s clip, one group (``test_groups``), scored by
  their mean reconstruction error. The STFT pads the clip's ends by reflection, as librosa 0.6 (MLPerf's
  pin) did by default (librosa 0.10 made it zeros): frames 50-249 of a 10-s clip do not reach the padding,
  but the last ones of a clip shorter than 8 s do.
* Test clips: for each machine ID in sorted order (``--machine-id`` keeps one), ``test/normal_<id>*.wav``
  (label 0) then ``test/anomaly_<id>*.wav`` (label 1), names sorted. MLPerf states one AUC per machine ID
  and their mean; the tool's ``auc`` is over the clips prepared together: prepare one ID for MLPerf's figure
  for that ID.
* Calibration inputs: ``--calibration`` vectors (default 200), drawn with ``--seed`` from as many clips of
  ``train/`` (normal sounds, what the autoencoder learnt).

librosa, as MLPerf uses it: the optional dependency ``resnet8ptq[mlperf-data]`` (in ``make setup``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from resnet8ptq.errors import DataError
from resnet8ptq.mlperf_data.base import Options, Prepared, Preparer, seeded_sample, sorted_files, wav_format

N_MELS, FRAMES, N_FFT, HOP, POWER = 128, 5, 1024, 512, 2.0
KEPT = slice(50, 250)  # MLPerf's "take central part only"
CLASSES = ("normal", "anomaly")
MACHINE_ID = re.compile(r"id_[0-9][0-9]")


def machine_ids(source: Path) -> list[str]:
    """The machine IDs (``id_01``, ...) the test clips' names carry, sorted."""
    return sorted(
        {
            found
            for file in sorted_files(source / "test", (".wav",))
            for found in MACHINE_ID.findall(file.name)
        }
    )


def wanted_ids(source: Path, options: Options) -> list[str]:
    """Every machine ID, or the one ``--machine-id`` names (``01`` or ``id_01``)."""
    present = machine_ids(source)
    if options.machine_id is None:
        return present
    wanted = options.machine_id if options.machine_id.startswith("id_") else f"id_{options.machine_id}"
    if wanted not in present:
        raise DataError(
            f"ad: no test clip of machine {wanted} in {source / 'test'}; its IDs: {', '.join(present)}"
        )
    return [wanted]


def test_files(source: Path, ids: list[str]) -> list[tuple[Path, int]]:
    """The test clips with their labels, machine by machine: normal ones, then anomalous ones."""
    test = source / "test"
    return [
        (file, label)
        for machine in ids
        for label, kind in enumerate(CLASSES)
        for file in sorted(test.glob(f"{kind}_{machine}*.wav"))
    ]


def vectors_in(samples: int) -> int:
    """How many 640-value vectors a clip of ``samples`` gives (centred STFT frames every HOP samples; MLPerf
    skips a clip that gives none)."""
    frames = 1 + samples // HOP
    return len(range(frames)[KEPT]) - FRAMES + 1


def check(source: Path, options: Options) -> None:
    """Refuse without librosa, or a folder without ToyCar's ``train/`` and ``test/``, with no normal or no
    anomalous test clip, or a clip that is not mono or too short for one vector."""
    try:
        import librosa  # noqa: F401
    except ImportError as error:
        raise DataError(
            "ad: MLPerf's log-mel front end is librosa's, which is not installed: pip install "
            "'resnet8ptq[mlperf-data]' (make setup installs it)"
        ) from error
    missing = [name for name in ("train", "test") if not (source / name).is_dir()]
    if missing:
        raise DataError(
            f"ad: {source} has no {' or '.join(missing)}/ folder (ToyCar's layout: train/, test/)"
        )
    if not machine_ids(source):
        raise DataError(f"ad: {source / 'test'} has no clip named <normal|anomaly>_id_NN_*.wav")
    test = test_files(source, wanted_ids(source, options))
    for label, kind in enumerate(CLASSES):
        if not any(file_label == label for _, file_label in test):
            raise DataError(f"ad: {source / 'test'} has no {kind} clip: an AUC needs both")
    training = sorted_files(source / "train", (".wav",))
    if not training:
        raise DataError(f"ad: {source / 'train'} has no .wav clip to calibrate on")
    for path in [file for file, _ in test] + seeded_sample(training, options.calibration, options.seed):
        found = wav_format(path, "ad")
        if found.channels != 1 or vectors_in(found.samples) < 1:
            raise DataError(
                f"ad: {path} is {found}; a clip must be mono, of at least 27,648 samples (55 STFT frames)"
            )


def clip_vectors(path: Path) -> np.ndarray:
    """One clip's (vectors, 640) float32 log-mel frames, as MLPerf's ``file_to_vector_array``."""
    import librosa

    signal, rate = librosa.load(path, sr=None, mono=False)
    mel = librosa.feature.melspectrogram(
        y=signal, sr=rate, n_fft=N_FFT, hop_length=HOP, n_mels=N_MELS, power=POWER, pad_mode="reflect"
    )
    log_mel = (20.0 / POWER * np.log10(mel + sys.float_info.epsilon))[:, KEPT]
    windows = np.lib.stride_tricks.sliding_window_view(log_mel.T, FRAMES, axis=0)  # (vectors, mels, frames)
    return windows.transpose(0, 2, 1).reshape(len(windows), N_MELS * FRAMES).astype(np.float32)


def prepare(source: Path, options: Options) -> Prepared:
    """The test clips' vectors with labels and groups, and calibration vectors from ``train/``."""
    test = test_files(source, wanted_ids(source, options))
    per_clip = [clip_vectors(path) for path, _ in tqdm(test, desc="ad test", unit="clip")]
    training = seeded_sample(sorted_files(source / "train", (".wav",)), options.calibration, options.seed)
    pool = np.concatenate([clip_vectors(path) for path in tqdm(training, desc="ad calibration", unit="clip")])
    return Prepared(
        calibration_inputs=pool[seeded_sample(list(range(len(pool))), options.calibration, options.seed)],
        test_inputs=np.concatenate(per_clip),
        test_labels=np.concatenate(
            [np.full(len(v), label) for v, (_, label) in zip(per_clip, test, strict=True)]
        ),
        class_names=CLASSES,
        test_groups=np.concatenate([np.full(len(v), clip) for clip, v in enumerate(per_clip)]),
    )


PREPARER = Preparer(
    check=check,
    prepare=prepare,
    source="ToyCar/ (train/, test/) of DCASE 2020 task 2's development data (dev_data_ToyCar.zip, "
    "zenodo.org/record/3678171), as MLPerf Tiny's get_dataset.sh downloads it",
)

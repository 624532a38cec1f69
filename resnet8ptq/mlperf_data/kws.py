"""Keyword spotting's MFCC front end as MLPerf Tiny's ``get_dataset.py`` computes it (``feature_type=mfcc``,
``kws_util.py``'s defaults), on Speech Commands v2's test set as TensorFlow Datasets' ``speech_commands``
labels it.

* Each 16 kHz 16-bit clip is divided by its own largest sample (``wav / reduce_max(wav)``, as MLPerf does:
  not by 2^15), zero-padded to 16,000 samples, then: ``tf.signal.stft`` with 480-sample (30 ms) Hann frames
  every 320 samples (20 ms), FFT length 512; magnitudes; a 40-bin mel matrix over 20-4,000 Hz; ``log(mel +
  1e-6)``; ``tf.signal.mfccs_from_log_mel_spectrograms``, its first 10 coefficients: (49, 10, 1) per clip.
  MLPerf's time shift of the test set (pad 2 samples each side, slice from sample 2) leaves the clip as it
  was, and its background noise is for training only: neither is applied.
* Labels, in MLPerf's order: the ten words ``down`` ... ``yes`` (0-9), ``_silence_`` 10, ``_unknown_`` 11.
* Calibration inputs: ``--calibration`` clips (default 200) drawn with ``--seed`` from the main archive's
  ``validation_list.txt`` (MLPerf calibrates on clips of the validation split, ``quant_cal_idxs.txt``).
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
from tqdm import tqdm

from resnet8ptq.errors import DataError
from resnet8ptq.mlperf_data.base import (
    Options,
    Prepared,
    Preparer,
    labelled,
    seeded_sample,
    sorted_files,
    wav_format,
)

WORDS = ("down", "go", "left", "no", "off", "on", "right", "stop", "up", "yes")
FOLDERS = (*WORDS, "_silence_", "_unknown_")  # label = position
CLASSES = (*WORDS, "silence", "unknown")
SAMPLE_RATE = 16_000
CLIP_SAMPLES = 16_000
WINDOW, STRIDE, FFT = 480, 320, 512
MEL_BINS, LOWER_HZ, UPPER_HZ = 40, 20.0, 4000.0
COEFFICIENTS = 10
BATCH = 256


def test_files(source: Path) -> list[tuple[Path, int]]:
    """The test set's clips with their labels, folder by folder in label order, names sorted."""
    return [
        (file, label) for label, name in enumerate(FOLDERS) for file in sorted_files(source / name, (".wav",))
    ]


def calibration_sample(options: Options) -> list[Path]:
    """``options.calibration`` of the clips the main archive's ``validation_list.txt`` names, seeded."""
    assert options.calibration_source is not None  # check() refuses its absence
    source = options.calibration_source
    listed = [source / name for name in (source / "validation_list.txt").read_text().split()]
    return seeded_sample(listed, options.calibration, options.seed)


def check_clip(path: Path) -> None:
    """Refuse a clip that is not 16 kHz mono 16-bit PCM of at most one second."""
    found = wav_format(path, "kws")
    if (found.channels, found.bits, found.rate) != (1, 16, SAMPLE_RATE) or found.samples > CLIP_SAMPLES:
        raise DataError(
            f"kws: {path} is {found}; Speech Commands' clips are 1 channel, 16-bit, {SAMPLE_RATE} Hz, "
            f"at most {CLIP_SAMPLES} samples"
        )


def check(source: Path, options: Options) -> None:
    """Refuse a folder that is not the test set's 12 class folders, clips that are not Speech Commands'
    format, or a missing calibration source."""
    missing = [name for name in FOLDERS if not (source / name).is_dir()]
    if missing:
        hint = (
            " (the main archive has no _silence_/_unknown_: give the test set's)"
            if "_unknown_" in missing
            else ""
        )
        raise DataError(f"kws: {source} has no folder {', '.join(missing)}{hint}")
    if options.calibration_source is None:
        raise DataError(
            "kws: give --calibration-source: the main archive, whose validation_list.txt it samples"
        )
    if not (options.calibration_source / "validation_list.txt").is_file():
        raise DataError(f"kws: {options.calibration_source} has no validation_list.txt (the main archive's)")
    for path in [file for file, _ in test_files(source)] + calibration_sample(options):
        check_clip(path)


def waveform(path: Path) -> np.ndarray:
    """A clip as MLPerf's front end takes it: float32 divided by its largest sample, zero-padded to 1 s."""
    with wave.open(str(path), "rb") as clip:
        samples = np.frombuffer(clip.readframes(clip.getnframes()), "<i2").astype(np.float32)
    peak = samples.max(initial=0.0)
    if peak <= 0:
        raise DataError(
            f"kws: {path} has no positive sample: MLPerf's front end divides a clip by its largest"
        )
    return np.pad(samples / peak, (0, CLIP_SAMPLES - samples.size))


def mfcc(waveforms: np.ndarray) -> np.ndarray:
    """(N, 16000) normalised clips -> (N, 49, 10, 1) MFCCs, with MLPerf's ``tf.signal`` calls."""
    import tensorflow as tf

    stfts = tf.signal.stft(waveforms, frame_length=WINDOW, frame_step=STRIDE, window_fn=tf.signal.hann_window)
    spectrograms = tf.abs(stfts)
    mel_matrix = tf.signal.linear_to_mel_weight_matrix(
        MEL_BINS, FFT // 2 + 1, SAMPLE_RATE, LOWER_HZ, UPPER_HZ
    )
    log_mel = tf.math.log(tf.tensordot(spectrograms, mel_matrix, 1) + 1e-6)
    coefficients = tf.signal.mfccs_from_log_mel_spectrograms(log_mel)[..., :COEFFICIENTS]
    return coefficients.numpy()[..., np.newaxis]


def features(paths: list[Path], what: str) -> np.ndarray:
    """MFCCs of the clips at ``paths``, in batches, with a progress bar."""
    batches = []
    for begin in tqdm(range(0, len(paths), BATCH), desc=f"kws {what}", unit="batch"):
        batches.append(mfcc(np.stack([waveform(path) for path in paths[begin : begin + BATCH]])))
    return np.concatenate(batches)


def prepare(source: Path, options: Options) -> Prepared:
    """The test set's MFCCs and labels, and a calibration sample of the validation split's."""
    return labelled(features, test_files(source), calibration_sample(options), CLASSES)


PREPARER = Preparer(
    check=check,
    prepare=prepare,
    source="the folder of Speech Commands v2's test set (speech_commands_test_set_v0.02.tar.gz, from "
    "download.tensorflow.org/data/: down/ ... yes/, _silence_/, _unknown_/); --calibration-source the main "
    "archive's folder (speech_commands_v0.02.tar.gz), for its validation_list.txt",
)

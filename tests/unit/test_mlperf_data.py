"""MLPerf Tiny's data sets prepared from a user's copy (resnet8ptq/mlperf_data/): small folders in each data
set's layout, written here, prepared and checked against independent references (Keras' own directory
iterator for VWW, a NumPy/SciPy MFCC for KWS, MLPerf's frame loop over librosa for AD); bad folders refused
before anything is written."""

from __future__ import annotations

import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from resnet8ptq.datasets import load_npz, main
from resnet8ptq.errors import DataError
from resnet8ptq.mlperf_data import Options, prepare
from resnet8ptq.mlperf_data.kws import FOLDERS


def write_wav(path: Path, samples: np.ndarray, rate: int = 16_000, channels: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as clip:
        clip.setnchannels(channels)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(samples.astype("<i2").tobytes())
    return path


def tone(seconds: float, hz: float, seed: int, rate: int = 16_000) -> np.ndarray:
    """A tone in noise, int16."""
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.size)
    return (8000 * np.sin(2 * np.pi * hz * t) + 500 * noise).astype(np.int16)


# --- Visual Wake Words --------------------------------------------------------------------------------------


def vww_folder(root: Path) -> Path:
    """23 images: person/ 12 (one grayscale, one 120 x 100 JPEG), non_person/ 11."""
    from PIL import Image

    rng = np.random.default_rng(1)
    for name, count in (("person", 12), ("non_person", 11)):
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(
                root / name / f"{i:03d}.png"
            )
    Image.fromarray(rng.integers(0, 256, (96, 96), dtype=np.uint8)).save(root / "person" / "000.png")
    Image.fromarray(rng.integers(0, 256, (100, 120, 3), dtype=np.uint8)).save(root / "person" / "001.jpg")
    return root


def test_vww_test_set_is_keras_validation_subset_as_mlperf_reads_it(tmp_path: Path) -> None:
    from keras.src.legacy.preprocessing.image import ImageDataGenerator

    source = vww_folder(tmp_path / "vw_coco2014_96")
    out = prepare("vww", source, tmp_path / "vww.npz", Options(calibration=5, seed=3))
    data = load_npz(out)
    keras = ImageDataGenerator(rescale=1.0 / 255, validation_split=0.1).flow_from_directory(
        source, target_size=(96, 96), batch_size=100, shuffle=False, subset="validation", class_mode="sparse"
    )
    images, labels = next(keras)
    assert keras.class_indices == {"non_person": 0, "person": 1}
    np.testing.assert_array_equal(data.test_inputs, images)  # bit for bit: the same pixels, the same scaling
    np.testing.assert_array_equal(data.test_labels, labels.astype(np.int64))
    assert data.class_names == ("non_person", "person") and len(data.test_labels) == 2  # int(0.1 * 11), (12)
    training = ImageDataGenerator(rescale=1.0 / 255, validation_split=0.1).flow_from_directory(
        source, target_size=(96, 96), batch_size=100, shuffle=False, subset="training"
    )
    pool = next(training)[0]
    assert data.calibration_inputs.shape == (5, 96, 96, 3)
    for image in data.calibration_inputs:  # each drawn from the training subset, none from the test subset
        assert np.any(np.all(pool == image, axis=(1, 2, 3))) and not np.any(
            np.all(images == image, axis=(1, 2, 3))
        )


def test_vww_refuses_a_folder_that_is_not_its_layout(tmp_path: Path) -> None:
    (tmp_path / "person").mkdir()
    with pytest.raises(DataError, match="non_person"):
        prepare("vww", tmp_path, tmp_path / "vww.npz", Options())
    (tmp_path / "non_person").mkdir()
    with pytest.raises(DataError, match="fewer than 10 images"):
        prepare("vww", tmp_path, tmp_path / "vww.npz", Options())
    assert not list(tmp_path.glob("*.npz"))


# --- Keyword spotting ---------------------------------------------------------------------------------------


def reference_mfcc(samples: np.ndarray) -> np.ndarray:
    """MLPerf's MFCC front end in NumPy and SciPy, from its definition (not the tool's tf.signal calls):
    normalise by the largest sample, pad to 1 s, 480-sample periodic-Hann frames every 320, |rfft(512)|,
    TensorFlow's HTK mel filters (40 bins, 20-4000 Hz), log(+1e-6), DCT-II scaled by 1/sqrt(2 * 40)."""
    from scipy.fft import dct

    x = np.pad(samples / samples.max(), (0, 16_000 - samples.size))
    starts = np.arange(0, 16_000 - 480 + 1, 320)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(480) / 480)
    spectrum = np.abs(np.fft.rfft(np.stack([x[s : s + 480] for s in starts]) * window, n=512))
    mel = lambda hz: 1127.0 * np.log1p(np.asarray(hz) / 700.0)  # noqa: E731
    edges = np.linspace(mel(20.0), mel(4000.0), 42)
    bins = mel(np.linspace(0, 8000, 257))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    weights = np.maximum(0, np.minimum((bins - lower) / (centre - lower), (upper - bins) / (upper - centre)))
    weights[:, 0] = 0  # TensorFlow drops the DC bin
    log_mel = np.log(spectrum @ weights.T + 1e-6)
    return (dct(log_mel, type=2, axis=-1) / np.sqrt(80))[:, :10, None]


def kws_folders(root: Path) -> tuple[Path, Path]:
    """A test set of 12 class folders (two clips each, one shorter than 1 s) and a main archive of 4 clips."""
    test, main_archive = root / "test", root / "main"
    for label, name in enumerate(FOLDERS):
        write_wav(test / name / "a.wav", tone(1.0, 200 + 150 * label, seed=label))
        write_wav(test / name / "b.wav", tone(0.75, 300 + 100 * label, seed=50 + label))
    listed = [f"yes/{i}.wav" for i in range(4)]
    for i, name in enumerate(listed):
        write_wav(main_archive / name, tone(1.0, 500 + 50 * i, seed=100 + i))
    (main_archive / "validation_list.txt").write_text("\n".join(listed) + "\n")
    return test, main_archive


def test_kws_mfccs_follow_mlperf_front_end_and_label_order(tmp_path: Path) -> None:
    test, main_archive = kws_folders(tmp_path)
    out = prepare("kws", test, tmp_path / "kws.npz", Options(calibration=3, calibration_source=main_archive))
    data = load_npz(out)
    assert data.test_inputs.shape == (24, 49, 10, 1) and data.calibration_inputs.shape == (3, 49, 10, 1)
    np.testing.assert_array_equal(data.test_labels, np.repeat(np.arange(12), 2))
    assert data.class_names[-2:] == ("silence", "unknown")
    for index, clip in ((0, tone(1.0, 200, seed=0)), (23, tone(0.75, 300 + 1100, seed=61))):
        reference = reference_mfcc(clip.astype(np.float64))
        np.testing.assert_allclose(data.test_inputs[index], reference, atol=2e-3 * np.abs(reference).max())


def test_kws_refuses_the_wrong_folder_or_clips_before_writing(tmp_path: Path) -> None:
    test, main_archive = kws_folders(tmp_path)
    out = tmp_path / "kws.npz"
    with pytest.raises(DataError, match=r"_silence_.*give the test set's"):
        prepare("kws", main_archive, out, Options(calibration_source=main_archive))
    with pytest.raises(DataError, match="--calibration-source"):
        prepare("kws", test, out, Options())
    write_wav(test / "go" / "c.wav", np.zeros(16_000 * 2, np.int16), channels=2)
    with pytest.raises(DataError, match=r"c\.wav is 2 channel"):
        prepare("kws", test, out, Options(calibration_source=main_archive))
    (test / "go" / "c.wav").unlink()
    write_wav(test / "go" / "c.wav", np.zeros(17_000, np.int16))
    with pytest.raises(DataError, match="at most 16000 samples"):
        prepare("kws", test, out, Options(calibration_source=main_archive))
    assert not list(tmp_path.glob("*.npz"))


# --- Anomaly detection --------------------------------------------------------------------------------------


def toycar(root: Path) -> Path:
    """ToyCar's layout: test clips of machines 01 and 02 (3 s, one 10 s), 3 training clips."""
    specs = [("normal_id_01_000", 3.0), ("normal_id_01_001", 10.0), ("anomaly_id_01_000", 3.0)]
    specs += [("anomaly_id_02_000", 3.0), ("normal_id_02_000", 3.0)]
    for i, (name, seconds) in enumerate(specs):
        write_wav(root / "test" / f"{name}.wav", tone(seconds, 400 + 100 * i, seed=i))
    for i in range(3):
        write_wav(root / "train" / f"normal_id_01_{i:03d}.wav", tone(3.0, 450, seed=20 + i))
    return root


def mlperf_vectors(path: Path, pad_mode: str = "reflect") -> np.ndarray:
    """MLPerf's ``file_to_vector_array`` (common.py, baseline.yaml's settings), its loop as written there;
    the STFT padded by reflection, librosa 0.6's default (MLPerf's pin; librosa 0.10 made it zeros)."""
    import librosa

    y, sr = librosa.load(path, sr=None, mono=False)
    mel = librosa.feature.melspectrogram(
        y=y, sr=sr, n_fft=1024, hop_length=512, n_mels=128, power=2.0, pad_mode=pad_mode
    )
    log_mel = (20.0 / 2.0 * np.log10(mel + sys.float_info.epsilon))[:, 50:250]
    size = len(log_mel[0, :]) - 5 + 1
    vectors = np.zeros((size, 640))
    for t in range(5):
        vectors[:, 128 * t : 128 * (t + 1)] = log_mel[:, t : t + size].T
    return vectors


def test_ad_vectors_labels_and_clips_as_mlperf_scores_them(tmp_path: Path) -> None:
    source = toycar(tmp_path / "ToyCar")
    data = load_npz(prepare("ad", source, tmp_path / "ad.npz", Options(calibration=50)))
    order = [
        "normal_id_01_000",
        "normal_id_01_001",
        "anomaly_id_01_000",
        "normal_id_02_000",
        "anomaly_id_02_000",
    ]
    per_clip = [mlperf_vectors(source / "test" / f"{name}.wav") for name in order]
    assert [len(v) for v in per_clip] == [40, 196, 40, 40, 40]  # 3-s clips: 94 frames, 44 kept; 10 s: 196
    # frames 50-249 of a 10-s clip (313 frames) do not reach the padding; a 3-s clip's last ones do
    ten_seconds = source / "test" / "normal_id_01_001.wav"
    np.testing.assert_array_equal(mlperf_vectors(ten_seconds, "constant"), per_clip[1])
    assert not np.allclose(mlperf_vectors(source / "test" / "normal_id_01_000.wav", "constant"), per_clip[0])
    np.testing.assert_allclose(data.test_inputs, np.concatenate(per_clip), rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(data.test_groups, np.repeat(np.arange(5), [len(v) for v in per_clip]))
    np.testing.assert_array_equal(data.test_labels, np.repeat([0, 0, 1, 0, 1], [len(v) for v in per_clip]))
    assert data.calibration_inputs.shape == (50, 640) and data.class_names == ("normal", "anomaly")
    training = np.concatenate([mlperf_vectors(p) for p in sorted((source / "train").glob("*.wav"))])
    assert all(np.abs(training - vector).max(axis=1).min() < 1e-3 for vector in data.calibration_inputs)

    one = load_npz(prepare("ad", source, tmp_path / "ad02.npz", Options(calibration=10, machine_id="02")))
    np.testing.assert_array_equal(one.test_labels, np.repeat([0, 1], 40))
    np.testing.assert_allclose(one.test_inputs, np.concatenate(per_clip[3:]), rtol=1e-5, atol=1e-3)


def test_ad_refuses_a_missing_machine_a_short_clip_or_one_kind_only(tmp_path: Path) -> None:
    source = toycar(tmp_path / "ToyCar")
    out = tmp_path / "ad.npz"
    with pytest.raises(DataError, match=r"id_03.*id_01, id_02"):
        prepare("ad", source, out, Options(machine_id="id_03"))
    write_wav(source / "test" / "normal_id_03_000.wav", tone(1.5, 400, seed=9))
    with pytest.raises(DataError, match="no anomaly clip"):
        prepare("ad", source, out, Options(machine_id="03"))
    with pytest.raises(DataError, match=r"normal_id_03_000\.wav is 1 channel.*27,648 samples"):
        prepare("ad", source, out, Options())
    assert not out.exists() and not list(tmp_path.glob("*.npz"))


def test_ad_without_librosa_says_what_to_install(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "librosa", None)  # an import of it fails
    with pytest.raises(DataError, match=r"resnet8ptq\[mlperf-data\]"):
        prepare("ad", toycar(tmp_path / "ToyCar"), tmp_path / "ad.npz", Options())
    assert not (tmp_path / "ad.npz").exists()


def test_prepare_from_the_command_line_names_the_run_to_make(tmp_path: Path, capsys) -> None:
    source = toycar(tmp_path / "ToyCar")
    out = tmp_path / "prepared" / "ad.npz"
    main(
        [
            "prepare",
            "ad",
            "--source",
            str(source),
            "--out",
            str(out),
            "--calibration",
            "20",
            "--machine-id",
            "01",
        ]
    )
    assert f"model=ad data=npz data.path={out}" in capsys.readouterr().out
    assert load_npz(out).calibration_inputs.shape == (20, 640)
    assert [p.name for p in out.parent.iterdir()] == ["ad.npz"]  # no temporary file left beside it
    with pytest.raises(DataError, match="is not a folder"):
        main(["prepare", "vww", "--source", str(tmp_path / "absent")])

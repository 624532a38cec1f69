"""The microcontroller path's pieces that need no model: board fits and their verdicts, the `mcu` settings'
validation, the arena's planned tensors on a small synthetic graph, capturing what C code prints to file
descriptor 2, the divergence summary, and `mcu.images`' cut."""

from __future__ import annotations

import ctypes
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

from resnet8ptq.backends.tflite.flatbuffer import Tensor, TFLiteModel
from resnet8ptq.errors import ConfigError, DataError
from resnet8ptq.evaluate import Evaluated
from resnet8ptq.mcu.config import KIB, Board, McuConfig, mcu_settings
from resnet8ptq.mcu.divergence import Divergence
from resnet8ptq.mcu.evaluate import board_fits, evaluate_mcu
from resnet8ptq.mcu.memory import peak_live_bytes, planned_tensors
from resnet8ptq.mcu.tflm import captured_stderr
from resnet8ptq.metrics import TOP1, ReconstructionAuc
from resnet8ptq.report.mcu import on_mcu_cell

SMALL = Board("Cortex-M0+", 48, 32, 256)
LARGE = Board("Cortex-M4F", 120, 640, 2048)


def settings(**boards: Board) -> McuConfig:
    return McuConfig(boards=boards, runtime_ram_kib=16, runtime_flash_kib=128)


def test_a_board_fits_when_arena_and_model_with_their_allowances_fit() -> None:
    arena, flash = 56 * KIB, 96 * KIB
    small, large = board_fits(arena, flash, settings(small=SMALL, large=LARGE))
    assert (small.ram_bytes, small.flash_bytes) == (72 * KIB, 224 * KIB)  # + 16 KiB RAM, + 128 KiB flash
    assert not small.fits and large.fits
    assert small.verdict() == "no: RAM 72.0 KiB > 32 KiB"
    assert large.verdict() == "fits: RAM 72.0 of 640 KiB, flash 224.0 of 2048 KiB"
    # Exactly full fits; one byte more does not. Flash alone can fail too.
    (exact,) = board_fits(32 * KIB - 16 * KIB, 128 * KIB, settings(b=SMALL))
    assert exact.fits
    (over,) = board_fits(32 * KIB - 16 * KIB + 1, 128 * KIB, settings(b=SMALL))
    assert not over.fits
    (flash_only,) = board_fits(0, 200 * KIB, settings(b=SMALL))
    assert flash_only.verdict() == "no: flash 328.0 KiB > 256 KiB"


def compose(boards: dict) -> McuConfig:
    schema = OmegaConf.structured(McuConfig)
    return mcu_settings(OmegaConf.merge(schema, {"boards": boards}))


def test_settings_name_a_board_without_its_figures() -> None:
    assert compose({"pico": {"core": "M0+", "clock_mhz": 133, "ram_kib": 264, "flash_kib": 2048}}).boards[
        "pico"
    ] == Board("M0+", 133, 264, 2048)
    with pytest.raises(ConfigError, match=r"mcu.boards.mine has no ram_kib: a board needs"):
        compose({"mine": {"core": "M33", "clock_mhz": 100, "flash_kib": 512}})
    with pytest.raises(ConfigError, match=r"mcu.boards.mine.ram_kib=-1.0: expected a positive number"):
        compose({"mine": {"core": "M33", "clock_mhz": 100, "ram_kib": -1, "flash_kib": 512}})
    with pytest.raises(ConfigError, match=r"mcu.npu=ethos-u99: expected one of Vela's"):
        mcu_settings(OmegaConf.merge(OmegaConf.structured(McuConfig), {"npu": "ethos-u99"}))
    with pytest.raises(ConfigError, match=r"mcu.runtime_ram_kib=-4"):
        mcu_settings(OmegaConf.merge(OmegaConf.structured(McuConfig), {"runtime_ram_kib": -4}))


def tensor(index: int, shape: tuple[int, ...], dtype: str = "int8") -> Tensor:
    return Tensor(index, f"t{index}", dtype, shape, np.ones(1), np.zeros(1), 0, None)


def test_planned_tensors_and_their_peak_follow_the_lifetimes() -> None:
    """input 0 -> conv -> 1 -> conv -> 2; add(1, 2) -> 3 (a residual: 1 lives until the add); 4: a weight."""
    tensors = [
        tensor(0, (1, 8, 8, 3)),
        tensor(1, (1, 8, 8, 16)),
        tensor(2, (1, 8, 8, 16)),
        tensor(3, (1, 8, 8, 16), "int16"),
        tensor(4, (16, 3, 3, 3)),
    ]
    ops = [("CONV_2D", [0, 4], [1]), ("CONV_2D", [1, 4], [2]), ("ADD", [1, 2], [3])]
    planned = planned_tensors(TFLiteModel(ops, tensors, [0]))
    assert [(p.name, p.bytes, p.first_op, p.last_op) for p in planned] == [
        ("t3", 2048, 2, 2),
        ("t1", 1024, 0, 2),
        ("t2", 1024, 1, 2),
        ("t0", 192, 0, 0),
    ]
    assert peak_live_bytes(planned) == 1024 + 1024 + 2048  # at the add: t1, t2 and its output


def test_what_c_code_prints_to_descriptor_2_is_captured() -> None:
    libc = ctypes.CDLL(None)
    line = b"[RecordingMicroAllocator] Arena allocation total 123 bytes\n"
    with captured_stderr() as printed:
        libc.write(2, line, len(line))
    assert printed == [line.decode()]


def test_divergence_summary_names_the_first_differing_op() -> None:
    divergence = Divergence(
        20, Counter({"14 FULLY_CONNECTED": 20}), {"14 FULLY_CONNECTED": 1, "15 SOFTMAX": 7}
    )
    assert divergence.summary() == (
        "first differs at op 14 FULLY_CONNECTED (20 of 20 images, by <= 1 LSB); "
        "later: 15 SOFTMAX (<= 7 LSB); every op before is bit-identical"
    )


def test_images_setting_is_a_positive_count_or_all() -> None:
    schema = OmegaConf.structured(McuConfig)
    assert mcu_settings(schema).images is None  # every test image by default
    assert mcu_settings(OmegaConf.merge(schema, {"images": 200})).images == 200
    with pytest.raises(ConfigError, match=r"mcu.images=0: expected a count of test images >= 1, or null"):
        mcu_settings(OmegaConf.merge(schema, {"images": 0}))


def test_a_cut_an_autoencoders_auc_cannot_score_is_refused_before_tflm_runs(tmp_path) -> None:
    """The first 4 of 8 inputs are one clip, all normal: no AUC on them. Refused by name before the model file
    (absent here) is read."""
    groups, labels = np.repeat(np.arange(4), 2), np.array([0, 0, 0, 0, 1, 1, 0, 0])
    inputs = np.zeros((8, 4), np.float32)
    data = SimpleNamespace(
        test_images=inputs,
        test_labels=labels,
        perf_subset=np.zeros(0, np.int64),
        metric=ReconstructionAuc(groups),
    )
    reference = SimpleNamespace(probabilities=inputs, predictions=np.zeros(8))
    model = Evaluated("ad", tmp_path / "absent.tflite", reference)
    with pytest.raises(DataError, match=r"mcu.images=4: ad: metric=auc needs test labels 0 .* and 1"):
        evaluate_mcu(model, McuConfig(images=4), data, tmp_path)


def test_a_cut_keeps_its_groups_and_the_report_names_it() -> None:
    auc = ReconstructionAuc(np.repeat(np.arange(3), 2))
    assert auc.first(3).groups.tolist() == [0, 0, 1] and auc.groups.tolist() == [0, 0, 1, 1, 2, 2]
    assert TOP1.first(3) is TOP1
    row = SimpleNamespace(accuracy_mcu=0.869, accuracy_mcu_reference=0.871, mcu_images=1000)
    assert on_mcu_cell(row) == "86.90 (first 1000: reference 87.10)"
    assert on_mcu_cell(SimpleNamespace(accuracy_mcu=0.8707, accuracy_mcu_reference=np.nan)) == "87.07"

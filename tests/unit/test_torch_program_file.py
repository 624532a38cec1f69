"""Saving a torch program: the file's bytes depend only on the program and the file's name, never on the
process that wrote it (two runs of one configuration give the same model file); nothing partial is left."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

torch = pytest.importorskip("torch")

from resnet8ptq.backends.torch.convert import save_program  # noqa: E402


class _AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def _program() -> torch.export.ExportedProgram:
    return torch.export.export(_AddOne(), (torch.zeros(2),))


def test_saved_bytes_do_not_depend_on_the_writer(tmp_path, monkeypatch) -> None:
    """torch names the archive's top folder after the file it writes: a temporary file of another name
    (one with the pid in it) made each process's model file different."""
    digests = []
    for pid, folder in [(111, "a"), (222, "b")]:
        monkeypatch.setattr("os.getpid", lambda pid=pid: pid)
        path = tmp_path / folder / "model_quantized.pt2"
        save_program(_program(), path)
        assert sorted(p.name for p in path.parent.iterdir()) == ["model_quantized.pt2"]  # nothing partial
        assert {name.split("/")[0] for name in zipfile.ZipFile(path).namelist()} == {"model_quantized"}
        digests.append(hashlib.sha256(path.read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_saving_over_an_existing_file_replaces_it(tmp_path) -> None:
    path = tmp_path / "model_fp32.pt2"
    path.write_bytes(b"half a file")
    loaded = save_program(_program(), path)
    assert torch.equal(loaded.module()(torch.ones(2)), torch.full((2,), 2.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_fp32.pt2"]

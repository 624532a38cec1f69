"""resnet8ptq/memory.py: glibc's malloc keeps what a batch frees; a user's own malloc settings win."""

from __future__ import annotations

import ctypes
import platform

import pytest

from resnet8ptq import memory

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc >= 2.33): ten size_t fields."""

    FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks")
    _fields_ = [(name, ctypes.c_size_t) for name in (*FIELDS, "fordblks", "keepcost")]


@pytest.mark.parametrize(
    "variable", [("MALLOC_TOP_PAD_", "0"), ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000")]
)
def test_a_users_malloc_setting_is_left_alone(monkeypatch: pytest.MonkeyPatch, variable: tuple[str, str]):
    monkeypatch.setenv(*variable)
    assert memory.keep_freed_memory.__wrapped__() is False


@glibc
def test_freed_memory_stays_in_the_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 MB of heap blocks freed at the top of the heap: glibc's defaults give them back to the kernel
    (trim); kept, the heap stays that large for the next batch."""
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc older than 2.33 (no mallinfo2)")
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    libc.mallinfo2.restype = MallInfo2
    assert memory.keep_freed_memory.__wrapped__() is True
    block, count = 64 * 1024, 4096  # below glibc's mmap threshold: from the heap
    before = libc.mallinfo2().arena
    blocks = [libc.malloc(block) for _ in range(count)]
    grown = libc.mallinfo2().arena - before
    for pointer in reversed(blocks):
        libc.free(pointer)
    kept = libc.mallinfo2().arena - before
    assert grown >= block * count
    assert kept >= 0.9 * grown, f"the heap shrank from +{grown} to +{kept} bytes"

"""resnet8ptq/memory.py on a fresh process's heap: glibc's defaults give the memory a batch freed back to the
kernel, kept (``keep_freed_memory``) it stays for the next batch."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

BATCH = """
import ctypes, json, sys
from resnet8ptq.memory import keep_freed_memory

class MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h, glibc >= 2.33): ten size_t fields
    _fields_ = [(name, ctypes.c_size_t) for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks "
                "uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
if not hasattr(libc, "mallinfo2"):
    print(json.dumps(None)); sys.exit()
libc.malloc.restype, libc.mallinfo2.restype = ctypes.c_void_p, MallInfo2
libc.free.argtypes = [ctypes.c_void_p]
kept = keep_freed_memory() if sys.argv[1] == "kept" else None
if sys.argv[2] == "large":  # 8 MiB tensors in a fresh process: mapped on their own, or from the heap?
    mapped_before = libc.mallinfo2().hblks
    large = [libc.malloc(8 << 20) for _ in range(4)]
    print(json.dumps({"set": kept, "mapped": libc.mallinfo2().hblks - mapped_before})); sys.exit()
before = libc.mallinfo2().arena
blocks = [libc.malloc(64 * 1024) for _ in range(4096)]  # 256 MiB below glibc's mmap threshold: the heap
grown = libc.mallinfo2().arena - before
for block in reversed(blocks):
    libc.free(block)
after = libc.mallinfo2().arena - before
print(json.dumps({"set": kept, "grown": grown, "after": after}))
"""


def heap(mode: str, part: str = "small") -> dict | None:
    """``small``: the arena's growth over 256 MiB of 64 KiB blocks and what is left of it once they are freed;
    ``large``: how many of four 8 MiB blocks a fresh process maps on their own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
    }
    done = subprocess.run(
        [sys.executable, "-c", BATCH, mode, part],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_freed_memory_stays_in_the_heap_only_when_kept() -> None:
    default, kept = heap("default"), heap("kept")
    if default is None:
        pytest.skip("glibc older than 2.33 (no mallinfo2)")
    assert default["grown"] >= 256 << 20 and kept["grown"] >= 256 << 20
    assert default["after"] < 0.1 * default["grown"], default  # trimmed back to the kernel
    assert kept["set"] is True and kept["after"] >= 0.9 * kept["grown"], kept


def test_kept_memory_serves_large_tensors_from_the_heap() -> None:
    """Setting a malloc parameter turns glibc's dynamic mmap threshold off; left at 128 KiB, every tensor
    above it would be mapped and unmapped page by page (resnet8ptq/memory.py: MMAP_THRESHOLD_BYTES)."""
    kept = heap("kept", "large")
    if kept is None:
        pytest.skip("glibc older than 2.33 (no mallinfo2)")
    assert kept["mapped"] == 0, kept
    assert heap("default", "large")["mapped"] == 4  # glibc's defaults: a fresh process maps each on its own

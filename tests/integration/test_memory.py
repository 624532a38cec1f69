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
before = libc.mallinfo2().arena
blocks = [libc.malloc(64 * 1024) for _ in range(4096)]  # 256 MiB below glibc's mmap threshold: the heap
grown = libc.mallinfo2().arena - before
for block in reversed(blocks):
    libc.free(block)
print(json.dumps({"set": kept, "grown": grown, "after": libc.mallinfo2().arena - before}))
"""


def heap(mode: str) -> dict | None:
    """The arena's growth over 256 MiB of 64 KiB blocks, and what is left of it once they are freed."""
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_TOP_PAD_", "GLIBC_TUNABLES")}
    done = subprocess.run(
        [sys.executable, "-c", BATCH, mode], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_freed_memory_stays_in_the_heap_only_when_kept() -> None:
    default, kept = heap("default"), heap("kept")
    if default is None:
        pytest.skip("glibc older than 2.33 (no mallinfo2)")
    assert default["grown"] >= 256 << 20 and kept["grown"] >= 256 << 20
    assert default["after"] < 0.1 * default["grown"], default  # trimmed back to the kernel
    assert kept["set"] is True and kept["after"] >= 0.9 * kept["grown"], kept

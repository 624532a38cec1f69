"""glibc's malloc told to keep the memory a batch frees for the next batch (``mallopt(M_TOP_PAD)``, with
``M_MMAP_THRESHOLD`` at its largest so that the tensors come from that heap).

A run allocates and frees the same large tensors batch after batch: 500 images' activations are tens of MB
each, the crossbar's partial sums hundreds. With its defaults, glibc's malloc hands the top of its heap back
to the kernel as soon as more than its trim threshold is free there, and grows the heap again on the next
batch, so every batch pays the kernel to map and zero the same pages again. Measured on the 2-core AVX2-only
AMD EPYC (glibc 2.36): the integer executor over 2,000 test images made 877 ``brk`` calls (20 with the pad);
over 10,000 on one thread it took 24.9 s, 6.7 of them in the kernel, and 16.9 s with the pad; a crossbar
run (``device=cim device.rows=128 device.adc_bits=4``) spent 35-36 s in its device stage, 25 s with the pad.
A torch run's stages did not change measurably. ``bench/memory.py`` measures it on any machine.

PyTorch's CPU performance guide recommends a preloaded jemalloc or tcmalloc for the same churn; this changes
one documented parameter of the C library the process already runs on (mallopt(3)) and needs no library or
environment of its own. The price: up to 1 GiB of freed memory stays resident in a process after its peak.
A C library other than glibc, or a ``MALLOC_TOP_PAD_`` / ``GLIBC_TUNABLES`` malloc setting of the user's,
is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform

log = logging.getLogger(__name__)

M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3
"""mallopt(3)'s parameter numbers for the extra memory kept at the top of the heap and for the size from which
a block is mapped on its own instead of taken from the heap (glibc's malloc.h)."""
TOP_PAD_BYTES = 1 << 30
"""1 GiB: at 256 MiB the crossbar run above was slower than with glibc's defaults (a 58 s device stage)."""
MMAP_THRESHOLD_BYTES = 32 << 20
"""32 MiB, the largest glibc accepts on 64-bit (its ``DEFAULT_MMAP_THRESHOLD_MAX``). Setting any malloc
parameter turns off glibc's dynamic threshold, which otherwise climbs to the size of the blocks a process
frees; left at its 128 KiB start, every tensor above it is mapped and unmapped on its own, page by page. In
``bench/device.py``'s process on the 2-core AMD EPYC Zen 5 (glibc 2.36), the pad alone took 143 s, 98 of them
in the kernel, with 59 million page faults, glibc's defaults 123 s (75 s, 46 million), the pad with this
threshold 77 s (3 s, 1.2 million)."""


def user_set_malloc() -> bool:
    """Whether the environment already tunes glibc's malloc (its own variables take precedence)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(name in os.environ for name in ("MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")) or (
        "glibc.malloc." in tunables
    )


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` and ``M_TOP_PAD`` for this process, once; False (nothing changed)
    on another C library or where the environment tunes malloc itself."""
    if platform.libc_ver()[0] != "glibc" or user_set_malloc():
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    done = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(M_TOP_PAD, TOP_PAD_BYTES)
    )
    log.debug(
        "glibc malloc: M_MMAP_THRESHOLD=%d, M_TOP_PAD=%d %s",
        MMAP_THRESHOLD_BYTES, TOP_PAD_BYTES, "set" if done else "refused",
    )  # fmt: skip
    return done

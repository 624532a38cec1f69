"""The machine a run measured on: CPU model, the instruction-set features that select integer kernels, cores.

Read from the OS (``/proc/cpuinfo`` on Linux, ``platform`` elsewhere), no extra dependency. Accuracy of the
reference semantics does not depend on it; speed and the integer kernels' accuracy do.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Features that make x86 (and Arm) runtimes pick different int8/fp32 kernels, in the order they are listed.
KERNEL_FEATURES = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_int8",
    "amx_bf16",
    "asimd",  # Arm NEON
    "asimddp",  # Arm int8 dot product
    "i8mm",  # Arm int8 matrix multiply
    "sve",
)
# Features with an int8 dot product that accumulates u8 x s8 products in 32 bits. Without them, x86 u8s8
# kernels use AVX2 `vpmaddubsw`, which adds pairs of products in saturating 16-bit arithmetic.
INT8_DOT_PRODUCT = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


@dataclass(frozen=True)
class Hardware:
    """One machine as the runs record it (tags ``hardware.cpu``, ``hardware.isa``, ``hardware.cores``,
    ``hardware.kernel_path``)."""

    cpu: str
    isa: tuple[str, ...]
    cores: int
    kernel_path: str = ""
    """The variables that forced another kernel path (:data:`KERNEL_PATH_ENV`, ``NAME=value,...``); empty: the
    libraries' own choice for this CPU."""

    @property
    def has_int8_dot_product(self) -> bool:
        """Whether the CPU multiplies u8 x s8 with 32-bit accumulation (VNNI, AMX, Arm dot product)."""
        return any(feature in self.isa for feature in INT8_DOT_PRODUCT)

    @property
    def label(self) -> str:
        """`AMD EPYC (avx2,fma; 2 cores)`: what a report calls this machine."""
        forced = f"; kernels forced: {self.kernel_path}" if self.kernel_path else ""
        return f"{self.cpu} ({','.join(self.isa) or 'no SIMD features found'}; {self.cores} cores{forced})"

    def tags(self) -> dict[str, str]:
        """The run tags that record this machine."""
        return {
            "hardware.cpu": self.cpu,
            "hardware.isa": ",".join(self.isa),
            "hardware.cores": str(self.cores),
            "hardware.kernel_path": self.kernel_path or "native",
        }

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Hardware | None:
        """The machine recorded in a run's tags; None for runs logged before hardware was recorded."""
        if "hardware.cpu" not in tags:
            return None
        isa = tuple(feature for feature in tags.get("hardware.isa", "").split(",") if feature)
        cores = tags.get("hardware.cores", "0")
        kernel_path = tags.get("hardware.kernel_path", "native")
        forced = "" if kernel_path == "native" else kernel_path
        return cls(tags["hardware.cpu"], isa, int(cores) if cores.isdigit() else 0, forced)


def parse_cpuinfo(text: str, cores: int) -> Hardware:
    """The machine described by the text of ``/proc/cpuinfo`` (x86: `model name`/`flags`; Arm: `Features`)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    cpu = fields.get("model name") or fields.get("hardware") or fields.get("cpu model") or ""
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    return Hardware(
        cpu=cpu or platform.processor() or platform.machine() or "unknown",
        isa=tuple(feature for feature in KERNEL_FEATURES if feature in flags),
        cores=cores,
    )


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity (``taskset``, a SLURM allocation, a container's cpuset),
    else every core. Libraries that size their thread pools by the machine's cores (ONNX Runtime does) would
    otherwise put more threads on them than there are cores."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


KERNEL_PATH_ENV = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "OPENBLAS_CORETYPE",
)
"""Environment variables that make torch (ATen, oneDNN), MKL or OpenBLAS take another kernel path on the
same CPU: float results that depend on the kernels depend on these too."""


def kernel_path_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The :data:`KERNEL_PATH_ENV` variables this process has set."""
    return {name: environ[name] for name in KERNEL_PATH_ENV if name in environ}


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run torch on ``count`` intra-op threads, then restore the count: what is learned or measured in it
    must not depend on `threads` (a sum over another number of threads adds in another order)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@functools.cache
def detect() -> Hardware:
    """This machine (cores: the CPUs this process may run on)."""
    cores = usable_cores()
    cpuinfo = Path("/proc/cpuinfo")
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    forced = ",".join(f"{name}={value}" for name, value in kernel_path_env().items())
    return dataclasses.replace(parse_cpuinfo(text, cores), kernel_path=forced)

"""Hardware provenance: CPU model, kernel-selecting ISA features and cores, parsed from /proc/cpuinfo texts of
the machine kinds this project runs on (Intel with AVX512-VNNI/AMX, AMD with AVX2 only, Arm)."""

from __future__ import annotations

import pytest

from resnet8ptq.hardware import Hardware, detect, parse_cpuinfo

INTEL_AMX = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu vme sse sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 \
amx_bf16 amx_tile amx_int8 avx_vnni
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
"""
AMD_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr pae sse sse2 ht syscall avx avx2 fma bmi2 sha_ni
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm asimddp i8mm
CPU implementer\t: 0x41
"""


def test_intel_with_vnni_and_amx() -> None:
    machine = parse_cpuinfo(INTEL_AMX, cores=2)
    assert machine.cpu == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert machine.isa == (
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
        "avx_vnni",
        "avx512_bf16",
        "amx_int8",
        "amx_bf16",
    )
    assert machine.has_int8_dot_product


def test_amd_with_avx2_only() -> None:
    machine = parse_cpuinfo(AMD_AVX2, cores=2)
    assert (machine.cpu, machine.isa, machine.cores) == ("AMD EPYC", ("avx2", "fma"), 2)
    assert not machine.has_int8_dot_product
    assert machine.label == "AMD EPYC (avx2,fma; 2 cores)"


def test_arm_dot_product() -> None:
    machine = parse_cpuinfo(ARM, cores=4)
    assert machine.isa == ("asimd", "asimddp", "i8mm") and machine.has_int8_dot_product
    assert machine.cpu  # no model name on Arm: the platform's processor or machine name


def test_tags_round_trip() -> None:
    machine = parse_cpuinfo(AMD_AVX2, cores=2)
    tags = machine.tags()
    assert tags == {
        "hardware.cpu": "AMD EPYC",
        "hardware.isa": "avx2,fma",
        "hardware.cores": "2",
        "hardware.kernel_path": "native",
    }
    assert Hardware.from_tags(tags) == machine
    assert Hardware.from_tags({"backend": "onnx"}) is None, "runs logged before hardware was recorded"
    old = {k: v for k, v in tags.items() if k != "hardware.kernel_path"}  # logged before kernel_path
    assert Hardware.from_tags(old) == machine


def test_a_forced_kernel_path_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same CPU with oneDNN capped at AVX2 is another machine to the runs (and to resnet8ptq.diff)."""
    from resnet8ptq import hardware

    for name in hardware.KERNEL_PATH_ENV:
        monkeypatch.delenv(name, raising=False)
    native = hardware.detect.__wrapped__()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    forced = hardware.detect.__wrapped__()
    assert native.tags()["hardware.kernel_path"] == "native"
    assert forced.tags()["hardware.kernel_path"] == "ATEN_CPU_CAPABILITY=avx2,ONEDNN_MAX_CPU_ISA=AVX2"
    assert Hardware.from_tags(forced.tags()) == forced != native
    assert forced.label.endswith("kernels forced: ATEN_CPU_CAPABILITY=avx2,ONEDNN_MAX_CPU_ISA=AVX2)")


def test_this_machine() -> None:
    machine = detect()
    assert machine.cores >= 1 and machine.cpu
    assert set(machine.isa) <= set(parse_cpuinfo("flags: " + " ".join(machine.isa), 1).isa)

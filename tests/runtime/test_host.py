"""The host's ISA class, from /proc/cpuinfo text of the CPUs this project meets."""

from __future__ import annotations

from sam2serve.runtime.host import host_isa, parse_cpuinfo

ZEN4 = "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512_bf16 avx512_vnni avx512vl\n"
AVX2_EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
SAPPHIRE = "flags : avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8 avx_vnni\n"


def test_classes_of_known_hosts():
    zen4, epyc, spr = parse_cpuinfo(ZEN4), parse_cpuinfo(AVX2_EPYC), parse_cpuinfo(SAPPHIRE)
    assert (zen4.isa_class, zen4.native_bf16, zen4.vnni) == ("avx512_bf16", True, True)
    assert zen4.describe() == "AVX2 AVX-512 AVX512-BF16 AVX512-VNNI"
    assert (epyc.isa_class, epyc.native_bf16, epyc.vnni) == ("avx2", False, False)
    assert epyc.describe() == "AVX2"
    assert (spr.isa_class, spr.native_bf16, spr.vnni) == ("amx", True, True)


def test_no_flags_line_is_an_empty_isa():
    isa = parse_cpuinfo("processor : 0\nmodel name : something\n")
    assert (isa.isa_class, isa.describe(), isa.native_bf16) == ("other", "no AVX2", False)


def test_this_host_agrees_with_torch():
    """Where torch can tell, the flags read here say the same about native bf16."""
    import torch

    assert host_isa().native_bf16 == (
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    )

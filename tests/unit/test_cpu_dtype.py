"""`--dtype auto`: bfloat16 only with native bf16 in the CPU flags."""

from replica_stub.config import StubConfig
from replica_stub.engine.cpu_dtype import cpu_flags, resolve_dtype

AVX2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_auto_is_float32_without_native_bf16() -> None:
    assert resolve_dtype("auto", AVX2) == "float32"


def test_auto_is_bfloat16_with_avx512_bf16_or_amx() -> None:
    assert resolve_dtype("auto", SAPPHIRE) == "bfloat16"
    assert resolve_dtype("auto", "flags : avx2 amx_bf16\n") == "bfloat16"


def test_explicit_dtype_is_kept() -> None:
    assert resolve_dtype("bfloat16", AVX2) == "bfloat16"
    assert resolve_dtype("float32", SAPPHIRE) == "float32"


def test_flags_of_this_machine_are_read() -> None:
    assert isinstance(cpu_flags(), set)
    assert cpu_flags("no flags here") == set()


def test_auto_is_the_default() -> None:
    assert StubConfig().resolved().dtype == "auto"

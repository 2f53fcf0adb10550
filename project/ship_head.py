"""A trained draft head made into the repository's shipped head: its weights compressed (int4 by default: groups of 32
with float16 scales; int8: a scale a row), head.json kept (the target's fingerprint, the training record), and
SHA256SUMS beside them. --drafter auto and --drafter head take a shipped head for the target its fingerprint names
when the cache holds none of yours (project/cli_common.py cached_head).

    python project/ship_head.py ~/.cache/minitorch-spec/heads/<fingerprint> -o heads/qwen2.5-coder-1.5b-instruct

The head only proposes tokens the target verifies, so its bits change how many drafts are accepted, never the output;
measure that with the benchmarks' --head on both folders (heads/README.md says what was measured for the shipped one).
"""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from project.cli_common import run_cli
from project.one_line_parser import OneLineParser
from project.settings import UserError


def sha256sums(folder: Path, names: tuple[str, ...] = ("head.safetensors", "head.json")) -> str:
    """SHA256SUMS' text for these files of `folder` (`sha256sum -c` reads it)."""
    return "".join(f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()}  {n}\n" for n in names)


def main(argv: list[str] | None = None) -> int:
    from minitorch.models import ModelLoadError
    from minitorch.models.head_io import compress_head

    p = OneLineParser(description="Compress a trained draft head into a folder to ship (with SHA256SUMS).")
    p.add_argument("head", help="the trained head's folder (head.safetensors in float16 or float32, head.json)")
    p.add_argument("--output", "-o", required=True, help="the folder to write (e.g. heads/<target name>)")
    p.add_argument("--dtype", choices=("int4", "int8", "float16"), default="int4",
                   help="the shipped weights (default int4: about an eighth of float32)")
    args = p.parse_args(argv)
    src, out = Path(args.head), Path(args.output)
    if not (src / "head.safetensors").is_file() or not (src / "head.json").is_file():
        raise UserError(f"no draft head in {src} (needs head.json and head.safetensors)")
    if out.resolve() == src.resolve():
        raise UserError("--output must be another folder than the head's")
    try:
        compress_head(src, out, args.dtype)
    except ModelLoadError as e:
        raise UserError(str(e)) from None
    (out / "SHA256SUMS").write_text(sha256sums(out))
    size = (out / "head.safetensors").stat().st_size
    print(f"{out}: head.safetensors {size / 1e6:.1f} MB ({args.dtype}), head.json, SHA256SUMS")
    return 0


if __name__ == "__main__":
    run_cli(main)

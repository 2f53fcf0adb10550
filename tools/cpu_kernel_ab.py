"""A/B of the CPU product kernel (minitorch/cpu/packed.py) against edited copies of itself, on the real 1.5B target's
weights, per weight class (all 28 layers' gate, down, ... or the LM head; larger than the caches), in one process:
the variants alternate round by round, every variant's outputs must equal the first's bit for bit, and each line
prints ms, GB/s of the weights' bytes and the paired-median ratio against the first variant.

    python tools/cpu_kernel_ab.py [--variants base,l1,none] [--mode int8|float32] [--classes gate,down,head] [--rows 1,5]
    python tools/cpu_kernel_ab.py --step [--variants base,l1]   (whole decode steps and verifies of the model instead:
                                                                 float32 and int8, at a 220-token context, same logits)

A variant is a list of text edits to packed.py (VARIANTS below; an edit that no longer matches is an error), written
to a temporary module so numba compiles and caches it on its own. Add one to try an idea before editing the kernel.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import minitorch
from minitorch.models import load_model

ROOT = Path(__file__).resolve().parents[1]
_PF = "builder.call(pf, [addr, ir.Constant(_I32, 0), ir.Constant(_I32, 2), ir.Constant(_I32, 1)])"
VARIANTS: dict[str, list[tuple[str, str]]] = {
    "base": [],
    "l1": [(_PF, _PF.replace("ir.Constant(_I32, 2)", "ir.Constant(_I32, 3)"))],  # prefetch into L1 (before)
    "nta": [(_PF, _PF.replace("ir.Constant(_I32, 2)", "ir.Constant(_I32, 0)"))],  # non-temporal prefetch
    "none": [(_PF, "pass")],  # no software prefetch
    "span128": [("SPAN = 256", "SPAN = 128")],  # inputs per tile-kernel call
    "span512": [("SPAN = 256", "SPAN = 512")],
    "span1024": [("SPAN = 256", "SPAN = 1024")],
}


def write_variant(name: str, folder: Path) -> str:
    src = (ROOT / "minitorch" / "cpu" / "packed.py").read_text()
    src = src.replace("from ..packed import TILE", "from minitorch.packed import TILE")
    for old, new in VARIANTS[name]:
        if old not in src:
            raise SystemExit(f"variant {name}: the text {old[:60]!r}... is not in packed.py any more")
        src = src.replace(old, new)
    (folder / f"packed_{name}.py").write_text(src)
    return f"packed_{name}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default="base,l1,none")
    p.add_argument("--mode", default="int8", choices=("int8", "float32"))
    p.add_argument("--classes", default="gate,down,head")
    p.add_argument("--rows", default="1,5")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--step", action="store_true", help="time whole forwards of the model (1 and 5 rows) instead")
    args = p.parse_args()
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    folder = Path(tempfile.mkdtemp(prefix="packed_ab_"))
    sys.path.insert(0, str(folder))
    mods = [importlib.import_module(write_variant(n, folder)) for n in names]
    m, _ = load_model("qwen2.5-coder-1.5b-instruct", progress=False)
    with minitorch.no_grad():
        layers, head = m._fused(None)
    if args.step:
        return steps(m, names, mods, args.rounds)
    classes = {n: [getattr(lw, n) for lw in layers] for n in ("q", "k", "v", "o", "gate", "up", "down")}
    classes["head"] = [head]
    rng = np.random.default_rng(0)

    def run(fp, ws, xs, outs) -> float:
        t = time.perf_counter()
        for w, x, o in zip(ws, xs, outs):
            if args.mode == "int8":
                fp.packed_linear_q8(x, w, o)
            else:
                fp.packed_rows(x, *w.tiles, w.block, w.per, w.bits, w.shape[0], o)
        return time.perf_counter() - t

    for cname in args.classes.split(","):
        ws = classes[cname]
        nbytes = sum(a.nbytes for w in ws for a in w.tiles)
        for rows in (int(r) for r in args.rows.split(",")):
            xs = [rng.standard_normal((rows, w.shape[1])).astype(np.float32) for w in ws]
            res: dict[str, list[float]] = {n: [] for n in names}
            ref = None
            for rnd in range(args.rounds + 1):  # round 0 compiles and warms up
                order = list(zip(names, mods)) if rnd % 2 else list(zip(names, mods))[::-1]
                for n, fp in order:
                    outs = [np.empty((rows, w.shape[0]), np.float32) for w in ws]
                    dt = run(fp, ws, xs, outs)
                    if rnd:
                        res[n].append(dt)
                    if ref is None:
                        ref = outs
                    elif not all(np.array_equal(a, b) for a, b in zip(ref, outs)):
                        raise SystemExit(f"variant {n} changed the results ({cname}, {rows} rows)")
            base = np.array(res[names[0]])
            print(f"{args.mode} {cname} x{len(ws)} {rows} row(s) {nbytes / 1e6:.0f} MB: " + "; ".join(
                f"{n} {np.median(res[n]) * 1e3:.1f} ms {nbytes / np.median(res[n]) / 1e9:.1f} GB/s "
                f"x{np.median(base / np.array(res[n])):.3f}" for n in names), flush=True)


def steps(m, names: list[str], mods: list, rounds: int) -> None:
    """The model's forward over 1 and 5 new tokens with each variant's kernels swapped into minitorch.cpu.packed."""
    from minitorch.cpu import packed as fp

    prompt = [int(i) for i in np.random.default_rng(0).integers(100, 20000, 220)]
    for mode in ("float32", "int8"):
        fp.set_activations(mode)
        res: dict[tuple[int, str], list[float]] = {}
        ref: dict[int, np.ndarray] = {}
        with minitorch.no_grad():
            cache = m.new_cache(600)
            m(prompt, cache)
            for rnd in range(2 * rounds + 2):  # two untimed rounds first
                for n, mod in (list(zip(names, mods)) if rnd % 2 else list(zip(names, mods))[::-1]):
                    fp.packed_rows, fp.packed_rows_q8 = mod.packed_rows, mod.packed_rows_q8
                    for rows in (1, 5):
                        t = time.perf_counter()
                        out = m(prompt[:rows], cache).to_numpy()
                        if rnd >= 2:
                            res.setdefault((rows, n), []).append(time.perf_counter() - t)
                        if not np.array_equal(ref.setdefault(rows, out), out):
                            raise SystemExit(f"variant {n} changed the logits ({mode}, {rows} rows)")
                        cache.truncate(cache.length - rows)
        for rows in (1, 5):
            base = np.array(res[(rows, names[0])])
            print(f"{mode} forward of {rows} row(s): " + "; ".join(
                f"{n} {np.median(res[(rows, n)]) * 1e3:.1f} ms x{np.median(base / np.array(res[(rows, n)])):.3f}"
                for n in names), flush=True)
    fp.set_activations("float32")


if __name__ == "__main__":
    main()

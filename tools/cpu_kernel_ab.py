"""A/B of the CPU product kernel (minitorch/cpu/packed.py) against edited copies of itself, on the real 1.5B target's
weights, per weight class (all 28 layers' gate, down, ... or the LM head; larger than the caches), in one process:
the variants alternate round by round, every variant's outputs must equal the first's bit for bit, and each line
prints ms, GB/s of the weights' bytes and the paired-median ratio against the first variant.

    python tools/cpu_kernel_ab.py [--variants base,l1,none] [--mode int8|float32] [--classes gate,down,head] [--rows 1,5]
    python tools/cpu_kernel_ab.py --step [--variants base,l1]   (whole decode steps and verifies of the model instead:
                                                                 float32 and int8, at a 220-token context, same logits)
    python tools/cpu_kernel_ab.py --forms [--mode both] [--step]  (code forms instead of kernel variants: the 6-bit
                          weights (Q6_K: v, down, the LM head) in their int8-code form (one byte a code) against the
                          6-bit form, per class, or whole forwards with every 6-bit weight in the one form or the other)

A variant is a list of text edits to packed.py (VARIANTS below; an edit that no longer matches is an error), written
to a temporary module so numba compiles and caches it on its own. Add one to try an idea before editing the kernel.
With --forms each line gives both forms' ms and GB/s (each of its own bytes) and the int8-code form's time over the
6-bit form's: the ratio of the fastest rounds and the median of the paired (same-round) ratios; above 1: 6 bits win.
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
from minitorch.packed import PackedWeight

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
VARIANTS["one16"] = [("step = 16 if rows < SPLIT_ROWS else ROW_GROUP", "step = 16")]  # every call's rows in one body
VARIANTS["group8"] = [("ROW_GROUP = 16 if host_avx512() else 4", "ROW_GROUP = 8")]  # groups of 8 rows
# lane chunks a body takes at once by its row count (_chunks; docs/results/cpu_zen3_specbench_10_run3/kernel_*.log:
# 3 rows at 2 chunks ran 1.02-1.12x on 3-row products, within the box's spread of the unchanged 2-row lines, 0.95-0.99x;
# not adopted). At 4 chunks 3 rows keep 3 x 4 x 2 = 24 int32 sums of two ymm each, more than AVX2's 16 registers
_CH = "c = 8 if rows == 1 else 4 if rows <= 3 else 2 if rows <= 7 else 1"
VARIANTS["c2r23"] = [(_CH, "c = 8 if rows == 1 else 2 if rows <= 3 else 2 if rows <= 7 else 1")]
VARIANTS["c2r3"] = [(_CH, "c = 8 if rows == 1 else 4 if rows <= 2 else 2 if rows <= 7 else 1")]
VARIANTS["c1r47"] = [(_CH, "c = 8 if rows == 1 else 4 if rows <= 3 else 1")]
# sep4: with VNNI, a 4-bit word's high nibbles in an integer sum of their own beside the low nibbles' (before stop 69;
# the same bits): 2 R C int32 sums a body keeps, more than the 32 zmm registers at 16 rows
_ONE = "builder.store(vnni(builder.load(slots[r][j]), hi, xhi[r]), slots[r][j])"
_FOLD = "                            if (bits == 8 and vnni_hw) or bits == 6:"
VARIANTS["sep4"] = [
    (_ONE, "builder.store(vnni(builder.load(slots2[r][j]), hi, xhi[r]), slots2[r][j])"),
    ("            acc16 = [[[", "            slots2 = [[cgutils.alloca_once(builder, _VI) for _ in range(C)] for _ in range(R)]\n"
                            "            acc16 = [[["),
    ("                            builder.store(vzero_f if act == \"f32\" else vzero_i, slots[r][j])\n",
     "                            builder.store(vzero_f if act == \"f32\" else vzero_i, slots[r][j])\n"
     "                            builder.store(vzero_i, slots2[r][j])\n"),
    (_FOLD, "                            if bits == 4:\n"
            "                                isums = [builder.add(v, builder.load(slots2[r][j])) for j, v in enumerate(isums)]\n"
            + _FOLD),
]
# Probes (a name starting with "x": timing only, their results differ by construction, so no bit check).
# xsep: the int8 fold of 6-bit and 8-bit blocks as it was before its fmas (separate multiplies and adds, as 4-bit
# blocks still fold; other rounding, so a probe)
_FMA = 'fma_fold = act == "i8" and bits in (6, 8)'
VARIANTS["xsep"] = [(_FMA, "fma_fold = False")]
# xnoscale: the fold with constant scales (no loads of sc, d, m, dmin): what reading the scales costs
VARIANTS["xnoscale"] = [
    ("""    scale = [builder.fmul(_vload(builder, ptr["d"], builder.add(db, c(16 * j)), _VF),""",
     """    scale = [vconstf(1.5) if True else builder.fmul(_vload(builder, ptr["d"], builder.add(db, c(16 * j)), _VF),"""),
    ("""                            fold([builder.fmul(_vload(builder, ptr["dmin"], builder.add(db, c(16 * j)), _VF),""",
     """                            fold([vconstf(0.5) if True else builder.fmul(_vload(builder, ptr["dmin"], builder.add(db, c(16 * j)), _VF),"""),
    ("""        def vconst(n):  # n in all 16 int32 lanes""",
     """        def vconstf(v):
            return ir.Constant(_VF, [ir.Constant(_F32, v)] * 16)

        def vconst(n):  # n in all 16 int32 lanes"""),
]
# xnoacc: the fold without reading the accumulator (stores the term): what the accumulator's load and add cost
VARIANTS["xnoacc"] = [("_vstore(builder, builder.fadd(_vload(builder, ptr[\"acc\"], ao, _VF), term), ptr[\"acc\"], ao)",
                       "_vstore(builder, term, ptr[\"acc\"], ao)")]
# xnofold: the int8 mode's integer sums stored as they are, without the float fold of each block (its converts,
# scale loads and multiplies, the accumulator's load and add): what the fold costs
VARIANTS["xnofold"] = [(_FMA, "fma_fold = False"),
    ("parts.append([builder.fmul(xdb, builder.sitofp(v, _VF)) for v in isums])",
     "parts.append([builder.bitcast(v, _VF) for v in isums])"),
    ("                                term = builder.fmul(scale[j], parts[r][j])\n",
     "                                term = parts[r][j]\n"),
    ("                                if offsets is not None:\n                                    term = builder.fsub(",
     "                                if False:\n                                    term = builder.fsub("),
    ("_vstore(builder, builder.fadd(_vload(builder, ptr[\"acc\"], ao, _VF), term), ptr[\"acc\"], ao)",
     "_vstore(builder, term, ptr[\"acc\"], ao)"),
]


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
    p.add_argument("--mode", default="int8", choices=("int8", "float32", "both"),
                   help="activation mode of the per-class lines (--step always times both)")
    p.add_argument("--classes", default=None, help="weight classes (default gate,down,head; with --forms v,down,head)")
    p.add_argument("--rows", default="1,5")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--step", action="store_true", help="time whole forwards of the model (1 and 5 rows) instead")
    p.add_argument("--prefill", type=int, default=0, help="time the model's int8 prefill of this many tokens instead")
    p.add_argument("--forms", action="store_true",
                   help="A/B the int8-code form of the 6-bit weights against the 6-bit form (the kernels as committed)")
    args = p.parse_args()
    if args.forms:
        return forms(args)
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    folder = Path(tempfile.mkdtemp(prefix="packed_ab_"))
    sys.path.insert(0, str(folder))
    mods = [importlib.import_module(write_variant(n, folder)) for n in names]
    m, _ = load_model("qwen2.5-coder-1.5b-instruct", progress=False)
    with minitorch.no_grad():
        stack = m._fused(None)  # the one-call forward's DecoderStack
        layers, head = stack.layers, stack.head
    if args.step:
        return steps(m, names, mods, args.rounds)
    if args.prefill:
        return prefills(m, names, mods, args.rounds, args.prefill)
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

    if args.mode == "both":
        raise SystemExit("--mode both is for --forms; run the variants once per mode")
    for cname in (args.classes or "gate,down,head").split(","):
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
                    if n.startswith("x"):  # a probe: timing only
                        continue
                    if ref is None:
                        ref = outs
                    elif not all(np.array_equal(a, b) for a, b in zip(ref, outs)):
                        raise SystemExit(f"variant {n} changed the results ({cname}, {rows} rows)")
            base = np.array(res[names[0]])
            print(f"{args.mode} {cname} x{len(ws)} {rows} row(s) {nbytes / 1e6:.0f} MB: " + "; ".join(
                f"{n} {np.median(res[n]) * 1e3:.1f} ms {nbytes / np.median(res[n]) / 1e9:.1f} GB/s "
                f"x{np.median(base / np.array(res[n])):.3f}" for n in names), flush=True)


def time_forwards(m, variants: dict, rounds: int) -> dict:
    """{(mode, rows): {name: [seconds]}}: the model's forward over 1 and 5 new tokens (220-token context) in both
    activation modes, each variant put in place by its setup() before its forwards, in alternating order, two
    untimed rounds first; a variant that changes the logits stops the run."""
    from minitorch.cpu import packed as fp

    prompt = [int(i) for i in np.random.default_rng(0).integers(100, 20000, 220)]
    names = list(variants)
    res: dict[tuple[str, int], dict[str, list[float]]] = {}
    for mode in ("float32", "int8"):
        fp.set_activations(mode)
        ref: dict[int, np.ndarray] = {}
        with minitorch.no_grad():
            cache = m.new_cache(600)
            m(prompt, cache)
            for rnd in range(2 * rounds + 2):
                for n in (names if rnd % 2 else names[::-1]):
                    variants[n]()
                    for rows in (1, 5):
                        t = time.perf_counter()
                        out = m(prompt[:rows], cache).to_numpy()
                        if rnd >= 2:
                            res.setdefault((mode, rows), {}).setdefault(n, []).append(time.perf_counter() - t)
                        if not n.startswith("x") and not np.array_equal(ref.setdefault(rows, out), out):
                            raise SystemExit(f"{n} changed the logits ({mode}, {rows} rows)")  # (x: a probe)
                        cache.truncate(cache.length - rows)
    fp.set_activations("float32")
    return res


def steps(m, names: list[str], mods: list, rounds: int) -> None:
    """The model's forward over 1 and 5 new tokens with each variant's kernels swapped into minitorch.cpu.packed."""
    from minitorch.cpu import packed as fp

    def swap(mod):
        fp.packed_rows, fp.packed_rows_q8 = mod.packed_rows, mod.packed_rows_q8

    res = time_forwards(m, {n: (lambda mod=mod: swap(mod)) for n, mod in zip(names, mods)}, rounds)
    for (mode, rows), r in res.items():
        base = np.array(r[names[0]])
        print(f"{mode} forward of {rows} row(s): " + "; ".join(
            f"{n} {np.median(r[n]) * 1e3:.1f} ms x{np.median(base / np.array(r[n])):.3f}" for n in names), flush=True)


def prefills(m, names: list[str], mods: list, rounds: int, n: int) -> None:
    """The model's prefill of n random tokens in int8 mode (its products MAX_ROWS rows a call) with each variant's
    kernels, alternating, one untimed round first; a variant that changes the last row's logits stops the run. As the
    engines prefill: the LM head on the last row alone (last_n=1; before stop 69 on every row, as in
    docs/results/cpu_zen3_row_groups/prefill_400.log)."""
    from minitorch.cpu import packed as fp

    fp.set_activations("int8")
    prompt = [int(i) for i in np.random.default_rng(1).integers(100, 20000, n)]
    res: dict[str, list[float]] = {k: [] for k in names}
    ref = None
    with minitorch.no_grad():
        for rnd in range(rounds + 1):
            for k, mod in (list(zip(names, mods)) if rnd % 2 else list(zip(names, mods))[::-1]):
                fp.packed_rows, fp.packed_rows_q8 = mod.packed_rows, mod.packed_rows_q8
                cache = m.new_cache(n + 8)
                t = time.perf_counter()
                out = m(prompt, cache, last_n=1).to_numpy()[-1]
                if rnd:
                    res[k].append(time.perf_counter() - t)
                if ref is None:
                    ref = out
                elif not np.array_equal(ref, out):
                    raise SystemExit(f"{k} changed the logits")
    base = np.array(res[names[0]])
    print(f"int8 prefill of {n} tokens: " + "; ".join(
        f"{k} {np.median(res[k]):.2f} s x{np.median(base / np.array(res[k])):.3f}" for k in names), flush=True)


def form_states(m) -> dict[str, list]:
    """{"8": ..., "6": ...}: the assignments that put every 6-bit weight of model m in its int8-code form
    (PackedWeight.recoded(8)) or back as loaded: (parameter, value) for the weights alone and (owner, joined,
    [(parameter, view)]) for joined projections whose joined weight is 6-bit (the int8 form joined the same way)."""
    states: dict[str, list] = {"6": [], "8": []}
    in_joins = set()
    for layer in (m.model.layers[i] for i in range(len(m.model.layers))):
        a, mlp = layer.self_attn, layer.mlp
        for owner, lins in ((a, (a.q_proj, a.k_proj, a.v_proj)), (mlp, (mlp.gate_proj, mlp.up_proj))):
            j = getattr(owner, "joined", None)
            if j is None or j[0].bits != 6:
                continue
            fused8 = j[0].recoded(8)
            starts = np.cumsum([0] + [v.shape[0] for v in j[2][:-1]])
            views8 = tuple(fused8.narrow(0, int(s0), v.shape[0]) for s0, v in zip(starts, j[2]))
            states["6"].append((owner, j, [(lin.weight, v) for lin, v in zip(lins, j[2])]))
            states["8"].append((owner, (fused8, j[1], views8), [(lin.weight, v) for lin, v in zip(lins, views8)]))
            in_joins.update(id(lin.weight) for lin in lins[:j[1]])
    for _, p in m.named_parameters():
        if isinstance(p.value, PackedWeight) and p.value.bits == 6 and id(p) not in in_joins:
            states["6"].append((p, p.value))
            states["8"].append((p, p.value.recoded(8)))
    return states


def set_form(states: dict[str, list], form: str) -> None:
    for item in states[form]:
        if len(item) == 2:
            item[0].update(item[1])
        else:
            owner, joined, views = item
            for param, v in views:
                param.update(v)
            owner.joined = joined


def ratio_text(a: list[float], b: list[float]) -> str:
    """a's time over b's: the fastest rounds', and the median of the paired (same-round) ratios."""
    return f"x{min(a) / min(b):.3f} (min) x{np.median(np.array(a) / np.array(b)):.3f} (median)"


def forms(args) -> None:
    """--forms: the int8-code form ("int8 codes") against the 6-bit form ("6-bit") of the same weights, with the
    committed kernels, alternating round by round; every product / forward must give the same bits in both."""
    from minitorch.cpu import packed as fp

    m, _ = load_model("qwen2.5-coder-1.5b-instruct", progress=False)
    if args.step:
        return form_steps(m, args.rounds)
    with minitorch.no_grad():
        stack = m._fused(None)  # the one-call forward's DecoderStack
        layers, head = stack.layers, stack.head
    classes = {n: [getattr(lw, n) for lw in layers] for n in ("q", "k", "v", "o", "gate", "up", "down")}
    classes["head"] = [head]
    rng = np.random.default_rng(0)
    modes = ("int8", "float32") if args.mode == "both" else (args.mode,)
    for cname in (args.classes or "v,down,head").split(","):
        six = [w for w in classes[cname] if w.bits == 6]
        if not six:
            print(f"{cname}: no 6-bit weights", flush=True)
            continue
        pair = {"int8 codes": [w.recoded(8) for w in six], "6-bit": six}
        nbytes = {f: sum(w.nbytes for w in ws) for f, ws in pair.items()}
        for mode in modes:
            for rows in (int(r) for r in args.rows.split(",")):
                xs = [rng.standard_normal((rows, w.shape[1])).astype(np.float32) for w in six]
                res: dict[str, list[float]] = {f: [] for f in pair}
                ref = None
                for rnd in range(args.rounds + 1):  # round 0 compiles and warms up
                    for f in (list(pair) if rnd % 2 else list(pair)[::-1]):
                        outs = [np.empty((rows, w.shape[0]), np.float32) for w in six]
                        t = time.perf_counter()
                        for w, x, o in zip(pair[f], xs, outs):
                            if mode == "int8":
                                fp.packed_linear_q8(x, w, o)
                            else:
                                fp.packed_rows(x, *w.tiles, w.block, w.per, w.bits, w.shape[0], o)
                        if rnd:
                            res[f].append(time.perf_counter() - t)
                        if ref is None:
                            ref = outs
                        elif not all(np.array_equal(a, b) for a, b in zip(ref, outs)):
                            raise SystemExit(f"the {f} form changed the results ({cname}, {mode}, {rows} rows)")
                print(f"{mode} {cname} x{len(six)} {rows} row(s): " + "; ".join(
                    f"{f} {nbytes[f] / 1e6:.0f} MB {np.median(res[f]) * 1e3:.2f} ms "
                    f"{nbytes[f] / np.median(res[f]) / 1e9:.1f} GB/s" for f in pair)
                    + "; int8 codes / 6-bit " + ratio_text(res["int8 codes"], res["6-bit"]), flush=True)


def form_steps(m, rounds: int) -> None:
    """Whole forwards over 1 and 5 new tokens (220-token context) with every 6-bit weight in either form."""
    states = form_states(m)
    count = {f: sum(len(it[2]) if len(it) == 3 else 1 for it in states[f]) for f in states}
    print(f"6-bit weights swapped: {count['6']}", flush=True)
    res = time_forwards(m, {"int8 codes": lambda: set_form(states, "8"), "6-bit": lambda: set_form(states, "6")},
                        rounds)
    set_form(states, "6")
    for (mode, rows), r in res.items():
        print(f"{mode} forward of {rows} row(s): " + "; ".join(f"{n} {np.median(r[n]) * 1e3:.1f} ms" for n in ("int8 codes", "6-bit"))
              + "; int8 codes / 6-bit " + ratio_text(r["int8 codes"], r["6-bit"]), flush=True)


if __name__ == "__main__":
    main()

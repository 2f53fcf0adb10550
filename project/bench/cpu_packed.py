"""A/B of the packed weight forms on the real products of a GGUF model, in one process, alternating:

  new   the current form (minitorch/packed.py): 4-bit codes as nibbles where they fit (Q4_K, Q4_1), int8
        block scales under float32 super-block factors, through minitorch/cpu/packed.py's kernel;
  old   the previous form and kernel, kept verbatim below: int8 codes plus a float32 scale and offset per
        block (about 1.25 bytes a Q4_K weight) through the kernel minitorch/cpu/packed.py had before the nibbles.

    python project/bench/cpu_packed.py                         # target, rows 1 and 5, 9 rounds
    python project/bench/cpu_packed.py --model draft --rows 1,5,8 --rounds 15 --tokens 32 --data-file Q.jsonl

Part 1 (products): every linear weight of one forward (the layers' projections + the vocabulary head),
each multiplied by random activations of R rows; one round times new then old (or old then new,
alternating), and the per-forward sum is printed as medians with the paired ratio, in wall seconds and
in this process's CPU seconds (with --threads 1 the CPU seconds do not count time spent waiting for a
core, so they are the contention-robust figure on a shared machine). Both give the
same bits (checked on every product of the first round): the same fma chain reads different bytes.
Part 2 (--tokens N > 0): greedy decoding of N tokens from the benchmarks' chat prompt (evaluation_data's
build_prompt) of the first question of --data-file (else GSM8K's first test question, inline), the backend's packed slot switched between the two
kernels per round; tokens/s medians, and the two token lists must be identical.
The 1-minute load average is printed: the box is shared, so only the ratio of a run means something.

--against REV adds "prev": minitorch/cpu/packed.py as it was at git revision REV (read with `git show`
into a temporary module), float mode, and with --int8 "prev-int8"; their results must equal new's and
int8's bit for bit (part 1: every product of the first round; part 2: the tokens), and the summary lines
print prev/new and prev-int8/int8. E.g. the tile kernels against the numba loops before them:
    python project/bench/cpu_packed.py --rows 1,5 --int8 --against ab1f362
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit, prange


from minitorch.cpu.packed import _block_sums, fma
from minitorch.packed import TILE, PackedWeight, _nibble_codes

MODELS = {"draft": "qwen2.5-coder-0.5b-instruct", "target": "qwen2.5-coder-1.5b-instruct"}
QUESTION = ("Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins "
            "for her friends every day with four. She sells the remainder at the farmers' market daily for $2 "
            "per fresh duck egg. How much in dollars does she make every day at the farmers' market?")


@njit(cache=True, parallel=True)
def old_packed_rows(x: np.ndarray, qt: np.ndarray, st: np.ndarray, ot: np.ndarray, block: int, n_len: int,
                    out: np.ndarray) -> None:  # pragma: no cover - numba
    """fast_packed.packed_rows before the nibble form (commit 3f63469), verbatim."""
    groups, k_len, _ = qt.shape
    rows = x.shape[0]
    xs = _block_sums(x, block)
    pairs_end = block - block % 2
    for g in prange(groups):
        acc = np.zeros((rows, TILE), dtype=np.float32)
        part = np.empty((rows, TILE), dtype=np.float32)
        for b in range(k_len // block):
            k0 = b * block
            part[:] = 0
            for k in range(k0, k0 + pairs_end, 2):
                for r in range(rows):
                    x0 = x[r, k]
                    x1 = x[r, k + 1]
                    for i in range(TILE):
                        p = fma(np.float32(qt[g, k, i]), x0, part[r, i])
                        part[r, i] = fma(np.float32(qt[g, k + 1, i]), x1, p)
            if pairs_end < block:
                k = k0 + block - 1
                for r in range(rows):
                    x0 = x[r, k]
                    for i in range(TILE):
                        part[r, i] = fma(np.float32(qt[g, k, i]), x0, part[r, i])
            for r in range(rows):
                xb = xs[r, b]
                for i in range(TILE):
                    acc[r, i] += st[g, b, i] * part[r, i] - ot[g, b, i] * xb
        m = min(TILE, n_len - g * TILE)
        for r in range(rows):
            for i in range(m):
                out[r, g * TILE + i] = acc[r, i]


def old_form(pw: PackedWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(qt int8 (G, K, TILE), st, ot float32 (G, K / block, TILE)): the previous tiled layout, same values."""
    qt = pw.qt if pw.bits != 6 else pw.recoded(8).qt  # 6-bit codes: their int8 form (same codes)
    if pw.bits == 4:
        g, kw, _ = qt.shape
        rows = _nibble_codes(np.ascontiguousarray(qt.transpose(0, 2, 1)).reshape(g * TILE, kw))  # (G*TILE, K)
        qt = rows.reshape(g, TILE, kw * 8).transpose(0, 2, 1)
    st = np.repeat(pw.d, pw.per, axis=1) * pw.sc.astype(np.float32)
    ot = (np.repeat(pw.dmin, pw.per, axis=1) * pw.m.astype(np.float32) if pw.has_offset
          else np.zeros_like(st))
    return np.ascontiguousarray(qt), np.ascontiguousarray(st), np.ascontiguousarray(ot)


def previous_kernels(rev: str) -> Any:
    """minitorch/cpu/packed.py at git revision rev, imported as a module of its own (numba cache in a temporary
    folder; its relative import of TILE made absolute)."""
    import importlib.util
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[2]
    try:
        src = subprocess.run(["git", "show", f"{rev}:minitorch/cpu/packed.py"], cwd=root, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"error: cannot read minitorch/cpu/packed.py at {rev}: {getattr(e, 'stderr', e)}")
    path = Path(tempfile.mkdtemp(prefix="prev_packed_")) / f"prev_packed_{rev.replace('/', '_')}.py"
    path.write_text(src.replace("from ..packed import", "from minitorch.packed import"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def forward_weights(model: Any) -> list[PackedWeight]:
    head = model.model.embed_tokens.weight.value if model.lm_head is None else model.lm_head.weight.value
    mats = [p.value for name, p in model.named_parameters() if ".layers." in name and name.endswith("proj.weight")]
    return [w for w in mats + [head] if isinstance(w, PackedWeight)]


def agreement(model: Any, tok: Any, args: argparse.Namespace, fast_packed: Any) -> None:
    """Top-1 agreement, int8 activations vs float32, at every position of prompt + gold answer (the answer
    cut to --positions tokens), each sequence run through the cache in chunks of 16 tokens so every
    product takes the row kernels (the float chunks reproduce the float decode steps bit for bit)."""
    import minitorch

    from project.evaluation.data import build_prompt, load_problems, read_json_rows

    rows = read_json_rows(args.data_file)[:args.agreement]
    probs = load_problems(data_file=args.data_file)[:args.agreement]
    total = agree = answer_total = answer_agree = 0
    t0 = time.perf_counter()
    for prob, row in zip(probs, rows):
        prompt = tok.encode(build_prompt(tok, prob.question))
        answer = tok.encode(str(row.get("answer", "")))[:args.positions]
        ids = prompt + answer
        tops = {}
        for mode in ("float32", "int8"):
            old = fast_packed.set_activations(mode)
            try:
                with minitorch.no_grad():
                    cache = model.new_cache(len(ids) + 1)
                    got = []
                    for c0 in range(0, len(ids), 16):
                        got.append(model(ids[c0:c0 + 16], cache).to_numpy()[0].argmax(-1))
            finally:
                fast_packed.set_activations(old)
            tops[mode] = np.concatenate(got)
        same = tops["float32"] == tops["int8"]
        total += len(ids)
        agree += int(same.sum())
        answer_total += len(answer)
        answer_agree += int(same[len(prompt):].sum())
    print(f"int8 vs float32 top-1 agreement: {agree}/{total} = {agree / total:.4f} over all positions, "
          f"{answer_agree}/{answer_total} = {answer_agree / max(answer_total, 1):.4f} over the answer positions "
          f"({len(probs)} questions, {time.perf_counter() - t0:.0f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="target", help="draft, target, a registry name or a GGUF path")
    ap.add_argument("--rows", default="1,5", help="activation rows per product, comma-separated (1..16)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per decode round (0: skip part 2)")
    ap.add_argument("--decode-rounds", type=int, default=4)
    ap.add_argument("--data-file", type=Path, default=None, help="GSM8K JSONL; its first question is the prompt")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--int8", action="store_true", help="also time the int8-activation mode (VNNI, or AVX2 integer products)")
    ap.add_argument("--agreement", type=int, default=0, metavar="N",
                    help="top-1 agreement of the int8 mode with the float mode over the first N questions of "
                         "--data-file, teacher-forced on prompt + gold answer (at most --positions answer tokens)")
    ap.add_argument("--positions", type=int, default=256)
    ap.add_argument("--against", metavar="REV", default=None,
                    help="also time minitorch/cpu/packed.py of git revision REV ('prev', 'prev-int8')")
    args = ap.parse_args(argv)
    try:
        rows_list = [int(r) for r in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows must be integers, got {args.rows!r}")
    if not all(1 <= r <= 16 for r in rows_list) or args.rounds < 1 or args.tokens < 0 or args.decode_rounds < 1:
        ap.error("--rows in 1..16, --rounds and --decode-rounds >= 1, --tokens >= 0")
    if args.data_file is not None and not args.data_file.is_file():
        ap.error(f"--data-file {args.data_file} does not exist")
    if args.agreement and args.data_file is None:
        ap.error("--agreement needs --data-file")

    import numba

    import minitorch
    from minitorch.cpu import packed as fast_packed
    from minitorch.models import load_model

    if args.threads:
        numba.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = load_model(MODELS.get(args.model, args.model), progress=False, weights="packed")
    weights = forward_weights(model)
    olds = {id(w): old_form(w) for w in weights}
    new_b = sum(w.nbytes for w in weights)
    old_b = sum(sum(a.nbytes for a in olds[id(w)]) for w in weights)
    print(f"model {args.model}: {len(weights)} packed products a forward, loaded + old form built in "
          f"{time.perf_counter() - t0:.1f} s; weight bytes a forward: new {new_b / 1e9:.3f} GB, old {old_b / 1e9:.3f} GB "
          f"({new_b / old_b:.3f}x); threads {numba.get_num_threads()}")

    def run_new(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
        fast_packed.packed_rows(x, *w.tiles, w.block, w.per, w.bits, w.shape[0], out)

    def run_old(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
        qt, st, ot = olds[id(w)]
        old_packed_rows(x, qt, st, ot, w.block, w.shape[0], out)

    def run_int8(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
        if fast_packed.int8_ready(w):
            fast_packed.packed_linear_q8(x, w, out)
        else:
            run_new(x, w, out)

    variants = {"new": run_new, "old": run_old}
    if args.int8:
        variants["int8"] = run_int8
    prev = None
    if args.against:
        prev = previous_kernels(args.against)
        # kernels from before the 6-bit form (PACKED_FORMAT 5) read those weights in their int8-code form
        as_prev = {id(w): w.recoded(8) for w in weights if w.bits == 6 and not hasattr(prev, "_tile_f32_q6")}

        def run_prev(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
            w = as_prev.get(id(w), w)
            prev.packed_rows(x, *w.tiles, w.block, w.per, w.bits, w.shape[0], out)

        def run_prev_int8(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
            w = as_prev.get(id(w), w)
            if prev.int8_ready(w):
                prev.packed_linear_q8(x, w, out)
            else:
                run_prev(x, w, out)

        variants["prev"] = run_prev
        if args.int8:
            variants["prev-int8"] = run_prev_int8
    same_as = {"old": "new", "prev": "new", "prev-int8": "int8"}  # must give the same bits
    names = list(variants)
    rng = np.random.default_rng(0)
    for rows in rows_list:
        xs = [rng.standard_normal((rows, w.shape[1])).astype(np.float32) for w in weights]
        outs = [np.empty((rows, w.shape[0]), np.float32) for w in weights]
        for x, w, o in zip(xs, weights, outs):  # compile + exactness check
            got = {}
            for label in names:
                variants[label](x, w, o)
                got[label] = o.copy()
            for label, ref in same_as.items():
                if label in got and not np.array_equal(got[label], got[ref]):
                    print(f"error: {label} and {ref} kernels differ on a {w.shape} product", file=sys.stderr)
                    return 1
        times: dict[str, list[float]] = {k: [] for k in names}
        cpu: dict[str, list[float]] = {k: [] for k in names}
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]  # rotate who goes first
            for label in order:
                fn = variants[label]
                t, c = time.perf_counter(), time.process_time()
                for x, w, o in zip(xs, weights, outs):
                    fn(x, w, o)
                times[label].append(time.perf_counter() - t)
                cpu[label].append(time.process_time() - c)
        for what, tt in (("wall", times), ("cpu", cpu)):
            line = f"rows {rows:2d} {what:4s}: per-forward products ms " + ", ".join(
                f"{k} {1e3 * statistics.median(tt[k]):7.1f}" for k in names)
            for k in names[1:]:
                base = "int8" if k == "prev-int8" else "new"
                ratios = [o / n for n, o in zip(tt[base], tt[k])]
                line += f"; {k}/{base} paired median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            print(line + f"; {args.rounds} rounds, loadavg {os.getloadavg()[0]:.2f}", flush=True)

    if args.agreement:
        agreement(model, tok, args, fast_packed)

    if args.tokens:
        from project.evaluation.data import build_prompt, load_problems

        question = QUESTION if args.data_file is None else load_problems(data_file=args.data_file)[0].question
        ids = tok.encode(build_prompt(tok, question))
        backend = model.model.norm.weight.value.backend
        new_slot = backend.packed_linear

        def old_slot(x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
            if x.shape[0] <= fast_packed.MAX_ROWS and id(w) in olds:
                run_old(x, w, out)
            else:  # prefill (BLAS path) and narrowed heads: same in both variants
                new_slot(x, w, out)

        def decode() -> tuple[float, list[int]]:
            with minitorch.no_grad():
                cache = model.new_cache(len(ids) + args.tokens + 1)
                nxt = int(model(ids, cache, last_n=1).to_numpy()[0, -1].argmax())
                out = [nxt]
                t = time.perf_counter()
                for _ in range(args.tokens - 1):
                    nxt = int(model([nxt], cache).to_numpy()[0, -1].argmax())
                    out.append(nxt)
                return (args.tokens - 1) / (time.perf_counter() - t), out

        speeds: dict[str, list[float]] = {k: [] for k in names}
        tokens: dict[str, list[int]] = {}
        try:
            for rnd in range(args.decode_rounds):
                for label in names[rnd % len(names):] + names[:rnd % len(names)]:
                    backend.packed_linear = {"old": old_slot, "prev": prev and prev.packed_linear,
                                             "prev-int8": prev and prev.packed_linear}.get(label, new_slot)
                    fast_packed.set_activations("int8" if label == "int8" else "float32")
                    if prev is not None:
                        prev.set_activations("int8" if label == "prev-int8" else "float32")
                    tps, out = decode()
                    speeds[label].append(tps)
                    tokens[label] = out
        finally:
            backend.packed_linear = new_slot
            fast_packed.set_activations("float32")
        same = all(tokens[k] == tokens[ref] for k, ref in same_as.items() if k in tokens)
        med = {k: statistics.median(v) for k, v in speeds.items()}
        line = (f"decode {args.tokens} tokens, prompt {len(ids)}: " + ", ".join(f"{k} {med[k]:.2f} tok/s" for k in names)
                + "; " + ", ".join(f"{k}/new {med[k] / med['new']:.3f}" for k in names[1:])
                + (f", prev-int8/int8 {med['prev-int8'] / med['int8']:.3f}" if "prev-int8" in med else "")
                + f" ({args.decode_rounds} rounds each), same tokens ({', '.join(f'{k} == {r}' for k, r in same_as.items() if k in tokens)}): {same}")
        if "int8" in tokens:
            n_same = next((i for i, (a, b) in enumerate(zip(tokens["int8"], tokens["new"])) if a != b), len(tokens["new"]))
            line += f", int8 follows float for {n_same}/{len(tokens['new'])} tokens"
        print(line + f", loadavg {os.getloadavg()[0]:.2f}", flush=True)
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

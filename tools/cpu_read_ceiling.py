"""How close the CPU products of the 1.5B target come to what the memory delivers, on this box, in one process:

1. read ceilings (project/bench/roofline.py's read kernel, 2 threads): one array as large as a token's weights,
   and the same bytes as the model's weight arrays, one kernel call each (as the products read them, call by call);
2. one forward's products (every projection and the LM head, random activations), float32 and int8 activations,
   1 and 5 rows, in GB/s of the weights' bytes;
3. the decode step and a 5-row verify of the real model, each layer's q/k/v and gate/up joined into one product
   (Qwen2ForCausalLM.join_projections, the default) against one product each, alternating, same logits checked.

    python tools/cpu_read_ceiling.py [--rounds 12]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


from project.bench import roofline

import minitorch
from minitorch.cpu import packed as fp
from minitorch.models import load_model


def med(xs: list[float]) -> float:
    return float(np.median(xs))


def read_ceilings(ws: list, rounds: int) -> None:
    arrs = [a.reshape(-1).view(np.uint8) for w in ws for a in w.tiles if a.nbytes >= 1 << 16]  # the bulk
    parts = [a[:a.size - a.size % 4].view(np.float32) for a in arrs]
    nbytes = sum(p.nbytes for p in parts)
    big = np.ones(nbytes // 4, np.float32)
    roofline._read_sum(big[:1024], roofline.CHUNKS)
    one, each = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        roofline._read_sum(big, roofline.CHUNKS)
        one.append(time.perf_counter() - t)
        t = time.perf_counter()
        for p in parts:
            roofline._read_sum(p, roofline.CHUNKS)
        each.append(time.perf_counter() - t)
    print(f"read ceiling, {nbytes / 1e6:.0f} MB: one array {nbytes / med(one) / 1e9:.1f} GB/s; the weights' "
          f"{len(parts)} arrays, a call each {nbytes / med(each) / 1e9:.1f} GB/s")


def products(ws: list, rounds: int) -> None:
    rng = np.random.default_rng(0)
    nbytes = sum(w.nbytes for w in ws)
    res: dict[tuple[str, int], list[float]] = {}
    for rnd in range(rounds + 1):
        for rows in (1, 5):
            for mode in ("float32", "int8"):
                total = 0.0
                for w in ws:
                    x = rng.standard_normal((rows, w.shape[1])).astype(np.float32)
                    out = np.empty((rows, w.shape[0]), np.float32)
                    t = time.perf_counter()
                    if mode == "int8":
                        fp.packed_linear_q8(x, w, out)
                    else:
                        fp.packed_rows(x, *w.tiles, w.block, w.per, w.bits, w.shape[0], out)
                    total += time.perf_counter() - t  # only the products count, not making x
                if rnd:
                    res.setdefault((mode, rows), []).append(total)
    for (mode, rows), v in res.items():
        print(f"one forward's products ({len(ws)} calls), {mode:7s} {rows} row(s): {med(v) * 1e3:6.1f} ms, "
              f"{nbytes / med(v) / 1e9:5.1f} GB/s")


def joined_ab(m, rounds: int) -> None:
    owners = [o for i in range(len(m.model.layers)) for o in (m.model.layers[i].self_attn, m.model.layers[i].mlp)]
    joined = [o.joined for o in owners]
    prompt = [int(i) for i in np.random.default_rng(0).integers(100, 20000, 220)]
    for mode in ("float32", "int8"):
        fp.set_activations(mode)
        res: dict[tuple[int, bool], list[float]] = {}
        outs: dict[tuple[int, bool], np.ndarray] = {}
        with minitorch.no_grad():
            cache = m.new_cache(600)
            m(prompt, cache)
            for rnd in range(2 * rounds + 2):
                for on in ((True, False) if rnd % 2 else (False, True)):
                    for o, j in zip(owners, joined):
                        o.joined = j if on else None
                    for rows in (1, 5):
                        t = time.perf_counter()
                        outs[(rows, on)] = m(prompt[:rows], cache).to_numpy()
                        if rnd >= 2:
                            res.setdefault((rows, on), []).append(time.perf_counter() - t)
                        cache.truncate(cache.length - rows)
        for rows in (1, 5):
            a, b = np.array(res[(rows, False)]), np.array(res[(rows, True)])
            print(f"{mode:7s} {rows} row(s): a product each {med(a) * 1e3:6.1f} ms, joined {med(b) * 1e3:6.1f} ms, "
                  f"paired ratio (each / joined) median {np.median(a / b):.3f} over {len(a)}; same logits "
                  f"{np.array_equal(outs[(rows, False)], outs[(rows, True)])}")
    fp.set_activations("float32")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=12)
    args = p.parse_args()
    m, _ = load_model("qwen2.5-coder-1.5b-instruct", progress=False)
    with minitorch.no_grad():
        stack = m._fused(None)  # the one-call forward's DecoderStack
        layers, head = stack.layers, stack.head
    ws = [w for lw in layers for w in (lw.q, lw.k, lw.v, lw.o, lw.gate, lw.up, lw.down)] + [head]
    print(f"bandwidth (roofline.stream_bandwidth, 2 threads): {roofline.stream_bandwidth(threads=2)}")
    read_ceilings(ws, args.rounds)
    products(ws, args.rounds)
    joined_ab(m, args.rounds)


if __name__ == "__main__":
    main()

"""Device probe (issue 14), coder pair shapes, random weights, 32k caches, one process:
    PYTHONPATH=. python3 tools/overlap_probe.py [overlap] [marginal]
overlap:  does a draft step run alongside the target's verify step? Times k draft steps (0.5B, CUDA-core
          GEMV) and the 5-token verify step (1.5B, tensor-core GEMV) alone, one after the other on one
          stream, and on two streams at once (equal priority, and the verify's stream high priority).
marginal: what each kernel kind of the draft's one-token step costs inside its CUDA graph: the graph
          captured with every launch of that kind left out, against the whole graph (the numbers are
          wrong then; only the time is of interest)."""
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from minitorch.cuda.decoder import CudaDecoder, random_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "project" / "bench"))
import throughput  # noqa: E402  (the bench's shapes and graph timer)


def build(shape: str, gemv: str, seed: int) -> CudaDecoder:
    cfg = SimpleNamespace(**throughput.SHAPES[shape])
    dec = CudaDecoder(cfg, random_weights(cfg, seed=seed), max_len=32768, max_tokens=16, gemv=gemv)
    dec.prefill([int(x) for x in np.random.default_rng(seed).integers(0, cfg.vocab_size, 256)])
    return dec


def timed(cp, streams, work, reps=20):
    """Median ms of work() (which enqueues on `streams`), from an event on streams[0] that every
    stream waits for, to the last stream's end event."""
    out = []
    for _ in range(reps):
        for s in streams:
            s.synchronize()
        e0 = cp.cuda.Event()
        e0.record(streams[0])
        for s in streams[1:]:
            s.wait_event(e0)
        work()
        ends = []
        for s in streams:
            e = cp.cuda.Event()
            e.record(s)
            ends.append(e)
        for e in ends:
            e.synchronize()
        out.append(max(cp.cuda.get_elapsed_time(e0, e) for e in ends))
    return statistics.median(out)


def overlap(cp) -> None:
    target = build("qwen2.5-coder-1.5b", "tc", 0)
    draft = build("qwen2.5-coder-0.5b", "ours", 1)
    pt, pd = int(target.pos.get()[0]), int(draft.pos.get()[0])
    for prio in ("equal", "verify high"):
        if prio == "verify high":
            # CUDA clamps priorities into the device's range (0 lowest; -5 highest on the H200)
            target.stream = cp.cuda.Stream(non_blocking=True, priority=-5)
            draft.stream = cp.cuda.Stream(non_blocking=True, priority=0)
            target.set_position(pt)
            draft.set_position(pd)
        sT, sD = target.stream, draft.stream
        V = lambda: target.replay(5, all_logits=True, advance=False)  # noqa: E731
        Dk = lambda k: [draft.replay(1, all_logits=False, advance=False) for _ in range(k)]  # noqa: E731
        V()
        Dk(1)
        v = timed(cp, [sT], V)
        print(f"[{prio}] verify(5) alone {v:.3f} ms")
        for k in (1, 2, 3, 4, 5):
            d = timed(cp, [sD], lambda: Dk(k))

            def both_one_stream() -> None:
                own = draft.stream  # the draft's steps on the verify's stream, for this measurement only
                draft.stream = sT
                Dk(k)
                draft.stream = own
                V()

            seq = timed(cp, [sT], both_one_stream)
            conc = timed(cp, [sT, sD], lambda: (V(), Dk(k)))
            print(f"[{prio}] k={k}: draft steps alone {d:.3f} ms ({d / k:.3f} a step); sequential {seq:.3f}; "
                  f"two streams {conc:.3f} (max of alone {max(v, d):.3f}, saved {seq - conc:.3f} ms)")


def marginal_one(cp, shape: str, gemv: str, T: int, kind: str) -> None:
    """One row of the marginal table, in its own process: leaving kernels out can make the next ones
    read garbage indices, which would poison the whole CUDA context."""
    dec = build(shape, gemv, 2)
    lib = dec.k
    names = []
    dec.k = SimpleNamespace(launch=lambda name, *a, **k: (names.append(name), lib.launch(name, *a, **k)), get=lib.get)
    dec._step(T, T > 1, False)
    dec.k = lib
    dec.stream.synchronize()
    if kind == "list":
        print(" ".join(sorted(set(names), key=names.index)))
        return
    full = throughput.time_graph(cp, dec, T) * 1e3
    if kind == "none":
        print(f"[{shape} {gemv} T={T}] whole step graph {full:.3f} ms, {len(names)} launches")
        return
    skip = set(kind.split("+"))
    dec.k = SimpleNamespace(launch=lambda name, *a, **k: None if name in skip else lib.launch(name, *a, **k), get=lib.get)
    dec.graphs.clear()
    t = throughput.time_graph(cp, dec, T) * 1e3
    n = sum(1 for x in names if x in skip)
    print(f"[{shape} {gemv} T={T}]   without {kind:40s} x{n:3d}: {t:.3f} ms (whole {full:.3f}) -> {full - t:+.3f} ms "
          f"({(full - t) / max(n, 1) * 1e3:.1f} us a launch)")


def marginal(cp) -> None:
    import subprocess

    for shape, gemv, T in (("qwen2.5-coder-0.5b", "ours", 1), ("qwen2.5-coder-1.5b", "tc", 5)):
        one = [sys.executable, __file__, "marginal-one", shape, gemv, str(T)]
        kinds = subprocess.run(one + ["list"], capture_output=True, text=True).stdout.split()
        for kind in ["none"] + kinds + ["attn_partial_bf16+attn_combine_bf16"]:
            r = subprocess.run(one + [kind], capture_output=True, text=True)
            print((r.stdout.strip() or f"[{shape}] {kind}: failed: {r.stderr.strip()[-200:]}"), flush=True)


def main() -> None:
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/overlap_probe.py")

    what = sys.argv[1:] or ["overlap", "marginal"]
    if what[0] == "marginal-one":
        marginal_one(cp, what[1], what[2], int(what[3]), what[4])
        return
    if "overlap" in what:
        overlap(cp)
    if "marginal" in what:
        marginal(cp)


if __name__ == "__main__":
    main()

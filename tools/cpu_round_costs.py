"""Seconds a round and a token of a CPU tree run, by kind of round (tree, chain, plain): runs a program (a benchmark)
with minitorch/generation/tree_decoding.py's round functions timed, and prints the sums when it exits.

    python tools/cpu_round_costs.py project/benchmark_gsm8k.py --limit 8 --max-new-tokens 256 --drafter head \\
        --draft-tree 2,3,6 --modes spec

What ShapeChoice weighs from running means of a few rounds, over a whole run: whether the tree rounds it picked cost
more a token than the chain's (docs/results/cpu_zen3_tree_choice/)."""
import atexit
import collections
import runpy
import sys
import time

from minitorch.generation import tree_decoding as td

LOG: list = []  # (kind, drafted, emitted, seconds) a round


def timed(kind, fn):
    def wrap(*a, **kw):
        t = time.perf_counter()
        r = fn(*a, **kw)
        LOG.append((kind(a), r.drafted, r.emitted, time.perf_counter() - t))
        return r
    return wrap


@atexit.register
def report() -> None:
    agg = collections.defaultdict(lambda: [0, 0, 0, 0.0])
    for kind, drafted, emitted, secs in LOG:
        a = agg[kind]
        a[0], a[1], a[2], a[3] = a[0] + 1, a[1] + drafted, a[2] + emitted, a[3] + secs
    for kind, (n, d, e, s) in sorted(agg.items()):
        print(f"{kind:6s} rounds {n:5d}  drafted/round {d / n:5.2f}  tokens/round {e / n:5.2f}  "
              f"ms/round {1e3 * s / n:6.1f}  ms/token {1e3 * s / e:6.1f}", file=sys.stderr)


if __name__ == "__main__":
    # chain_round(target, drafter, cache, context, out, g, ...), tree_round(target, drafter, cache, context, out, top_k, ...)
    td.chain_round = timed(lambda a: "chain" if a[5] > 0 else "plain", td.chain_round)
    td.tree_round = timed(lambda a: "tree" if a[5] > 0 else "plain", td.tree_round)
    sys.argv = sys.argv[1:]
    sys.path.insert(0, ".")
    runpy.run_path(sys.argv[0], run_name="__main__")

"""What the benchmark's summary (sb10_r3.log: each mode's median run, and "each run alone" with its counts) does not
print for a --repeats 3 results file: which questions fall below 0.95x in each run alone, the mean of the runs, each
question's prefill shared between the modes (the same work: their mean), and how far the two modes' prefills spread.

    python docs/results/cpu_zen4_specbench_10_repeats3/analyze.py docs/results/cpu_zen4_specbench_10_repeats3/sb10_r3.jsonl.gz
"""
import gzip, json, statistics as S, sys

by_id = {}
for line in (gzip.open if sys.argv[1].endswith(".gz") else open)(sys.argv[1], "rt"):
    r = json.loads(line)
    by_id.setdefault(r["id"], {})[r["mode"]] = r
pairs = [(k, v["spec"], v["target"]) for k, v in by_id.items() if len(v) == 2]


def line(name, ratios):
    below = sorted((x, k) for k, x in ratios if x < 0.95)
    print(f"{name:42s} median {S.median(x for _, x in ratios):.3f}  below 0.95x {len(below):2d} of {len(ratios)}: "
          + ", ".join(f"{k.split('-')[1]} {x:.3f}" for x, k in below))


for i in range(len(pairs[0][1]["time_s_runs"])):
    line(f"run {i + 1} alone", [(k, t["time_s_runs"][i] / s["time_s_runs"][i]) for k, s, t in pairs])
line("mean of the runs", [(k, S.mean(t["time_s_runs"]) / S.mean(s["time_s_runs"])) for k, s, t in pairs])


def shared(s, t):  # the median runs, each mode's prefill replaced by the mean of the two
    ps, pt = s["stats"]["time_prefill"], t["stats"]["time_prefill"]
    p = (ps + pt) / 2
    return (t["time_s"] - pt + p) / (s["time_s"] - ps + p)


line("median runs, prefill shared", [(k, shared(s, t)) for k, s, t in pairs])
pr = [s["stats"]["time_prefill"] / t["stats"]["time_prefill"] for _, s, t in pairs]
print(f"spec prefill / target prefill (median runs): median {S.median(pr):.3f} sd {S.stdev(pr):.3f} "
      f"min {min(pr):.3f} max {max(pr):.3f}")
same = sum(bool(s.get("repeats_identical")) and bool(t.get("repeats_identical")) for _, s, t in pairs)
print(f"every run of a mode wrote the same text (repeats_identical): {same} of {len(pairs)}")

"""Spec-Bench --repeats 3 records: per-question speedups from the median run (what the summary keeps), from each
single run index (a one-timing benchmark each), and with each question's prefill shared (the two modes' mean).

    python docs/results/cpu_zen4_specbench_10_repeats3/analyze.py docs/results/cpu_zen4_specbench_10_repeats3/sb10_r3.jsonl.gz
"""
import gzip, json, statistics as S, sys, collections
R = {}
for l in (gzip.open if sys.argv[1].endswith(".gz") else open)(sys.argv[1], "rt"):
    r = json.loads(l); R.setdefault(r["id"], {})[r["mode"]] = r
qs = [(k, v) for k, v in R.items() if len(v) == 2]
def line(name, xs):
    below = sorted((x, k) for x, k in xs if x < 0.95)
    print(f"{name:42s} median {S.median([x for x, _ in xs]):.3f}  below 0.95x {len(below):2d} of {len(xs)}  lowest "
          f"{min(xs)[0]:.3f} ({min(xs)[1]})  " + ", ".join(f"{k.split('-')[1]} {x:.3f}" for x, k in below))
tot_s = sum(v["spec"]["time_s"] for _, v in qs); tot_t = sum(v["target"]["time_s"] for _, v in qs)
print(f"questions {len(qs)}; total seconds spec {tot_s:.0f} target {tot_t:.0f}: {tot_t / tot_s:.3f}x")
line("median run (the summary's)", [(v["target"]["time_s"] / v["spec"]["time_s"], k) for k, v in qs])
n = len(qs[0][1]["spec"]["time_s_runs"])
for i in range(n):
    line(f"run {i + 1} only (a one-timing benchmark)", [(v["target"]["time_s_runs"][i] / v["spec"]["time_s_runs"][i], k) for k, v in qs])
line("mean of the runs", [(S.mean(v["target"]["time_s_runs"]) / S.mean(v["spec"]["time_s_runs"]), k) for k, v in qs])
def shared(v):
    s, t = v["spec"], v["target"]
    ps, pt = s["stats"]["time_prefill"], t["stats"]["time_prefill"]
    p = (ps + pt) / 2
    return (t["time_s"] - pt + p) / (s["time_s"] - ps + p)
line("median run, prefill shared (mean of both)", [(shared(v), k) for k, v in qs])
pr = [v["spec"]["stats"]["time_prefill"] / v["target"]["stats"]["time_prefill"] for _, v in qs]
print(f"prefill spec/target (median runs): median {S.median(pr):.3f} sd {S.stdev(pr):.3f} min {min(pr):.3f} max {max(pr):.3f}")
cat = collections.defaultdict(lambda: [0.0, 0.0])
for _, v in qs:
    c = cat[v["spec"]["category"]]; c[0] += v["spec"]["time_s"]; c[1] += v["target"]["time_s"]
print("by category:", ", ".join(f"{c} {t / s:.2f}" for c, (s, t) in sorted(cat.items(), key=lambda x: -x[1][1] / x[1][0])))
ident = sum(v["spec"]["text"] == v["target"]["text"] for _, v in qs)
rep = sum(bool(v["spec"].get("repeats_identical")) and bool(v["target"].get("repeats_identical")) for _, v in qs)
print(f"texts identical spec/target {ident} of {len(qs)}; every repeat the same text {rep} of {len(qs)}")

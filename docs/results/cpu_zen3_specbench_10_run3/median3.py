"""Per question: the paired speedup (target seconds over spec seconds, both modes of one run) of each of three runs
of the same command and code: stop 62's two (--repeats 2: time_s_runs) and stop 63's one; the median of the three."""
import gzip, json, statistics, sys
def load(p):
    op = gzip.open if p.endswith('.gz') else open
    by = {}
    for l in op(p, 'rt'):
        r = json.loads(l)
        if 'mode' in r:
            by.setdefault(r['id'], {})[r['mode']] = r
    return by
a, b = load(sys.argv[1]), load(sys.argv[2])
rows = []
for i, d in b.items():
    if i not in a or 'spec' not in d or 'target' not in d:
        continue
    s2, t2 = a[i]['spec']['time_s_runs'], a[i]['target']['time_s_runs']
    assert a[i]['spec']['text'] == d['spec']['text'] == d['target']['text']
    r = [t2[0] / s2[0], t2[1] / s2[1], d['target']['time_s'] / d['spec']['time_s']]
    rows.append((statistics.median(r), i, d['spec']['category'], r))
rows.sort()
print(f"{len(rows)} questions; below 0.95x: run1 {sum(x[3][0] < .95 for x in rows)}, run2 {sum(x[3][1] < .95 for x in rows)}, "
      f"run3 {sum(x[3][2] < .95 for x in rows)}, median of three {sum(x[0] < .95 for x in rows)}; "
      f"median question (median of three) {statistics.median(x[0] for x in rows):.3f}x")
for m, i, c, r in rows[:12]:
    print(f"{i:16s} {c:14s} median {m:.3f}  runs " + " ".join(f"{x:.3f}" for x in r))

#!/usr/bin/env bash
# Call A: ray installed from the staged pieces; issue 25's before/after (bench-ab); a --ray run of the same
# benchmark on the new tree in the same call; the target's answers to 150 GSM8K train problems (gen).
set -u
OUT="${OUT:-/tmp/gpu}"; export MINITORCH_SPEC_CACHE=/root/cache PYTHONUNBUFFERED=1
W=/tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
cat /root/raystage/ray.0 /root/raystage/ray.1 > $W && echo "$(cat .raywhl/sha)  $W" | sha256sum -c - \
  && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl .raywhl/deps/*.whl $W \
  && echo "ray installed"
export PYTHONPATH=/tmp/site
BASE=$PWD/.snap/base LIMIT=330 bash tools/gpu.sh bench-ab
echo "=== ray run $(date -u +%T)"
timeout 200 python3 project/benchmark_gsm8k.py --limit 20 --backend cuda --no-plots --no-progress --ray \
  -o $OUT/gsm8k_ray.jsonl > $OUT/ray.log 2>&1; echo "ray rc=$?"; grep -E "ray:|speedup|^spec|^target" $OUT/ray.log | tail -6
python3 - $OUT/gsm8k_new.jsonl $OUT/gsm8k_ray.jsonl <<'PY'
import json, sys
V = {'time_s', 'tokens_per_s', 'stats', 'finished_at', 'shard', 'predicted_speedup'}
def L(p):
    rs = [json.loads(l) for l in open(p) if l.strip()]
    rs = [r for r in rs if 'mode' in r]
    return rs, sorted(({k: v for k, v in r.items() if k not in V} for r in rs), key=lambda r: (r['index'], r['mode']))
(ra, a), (rb, b) = L(sys.argv[1]), L(sys.argv[2])
tps = lambda rs, m: sum(r['generated_tokens'] for r in rs if r['mode'] == m) / sum(r['time_s'] for r in rs if r['mode'] == m)
print(f"ray-vs-plain: {len(a)} {len(b)} {'EQUAL' if a == b else 'DIFFER'}; spec tok/s plain {tps(ra,'spec'):.1f} ray {tps(rb,'spec'):.1f}; "
      f"target plain {tps(ra,'target'):.1f} ray {tps(rb,'target'):.1f}")
PY
GEN_LIMIT=90 bash tools/gpu_head.sh gen 120

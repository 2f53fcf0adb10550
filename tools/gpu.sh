#!/usr/bin/env bash
# GPU-run script: one mode a device call, run from the repository root on the GPU machine; logs and results
# under $OUT (default /tmp/gpu), each call at most LIMIT seconds (default 570). Modes, named for what they measure:
#
#   bash tools/gpu.sh tests       build the kernels, then the whole GPU suite: python -m pytest -m gpu -q -x
#                                 (junit XML and a summary line in $OUT; carry nothing but the tree)
#   bash tools/gpu.sh bits        digests of tools/check_bits.py with this tree's kernels and with $BASE's
#                                 (a copy of an older commit: git archive 8819703 | tar -x -C .snap/base; carry .snap)
#   bash tools/gpu.sh step        random-weight step costs and the cost model through project/bench/throughput.py:
#                                 the coder pair and the R1 shapes with the CLI's defaults, and --gemv ours
#   bash tools/gpu.sh ab          tools/ab_steps.py over $BASE and this tree in one call (step / verify / engine)
#   bash tools/gpu.sh bench-real  the real pair: GSM8K first 20 with the defaults and with --gpu-gemv ours, MATH-500
#                                 first 20 (results and summaries in $OUT)
#   bash tools/gpu.sh ray         the real pair, GSM8K first 20 plain and with --ray in one call (records equal?
#                                 tokens/s of both); ray staged first, see the mode
#   bash tools/gpu.sh bench-ab    the real pair, GSM8K first 20 with the defaults in $BASE and in this tree, one call:
#                                 tokens/s of both and whether every text is the same
#
# The real pair: the workplace staging tool (stage_weights.sh, run on the developer machine) carries the GGUF files over (its header gives the calls; `join`
# rebuilds them in /root/cache); carry .whl (the gguf and math-verify wheels) with the bench modes.
set -u
OUT="${OUT:-/tmp/gpu}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
T0=$(date +%s)
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
run() {  # run NAME TIMEOUT CMD...: log to $OUT/NAME.log, print the lines matching PAT
  local name=$1 t=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 20 ]; then log "$name skipped (time)"; return; fi
  [ "$t" -gt "$l" ] && t=$l
  log "$name (timeout ${t}s): $*"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?" >> "$OUT/$name.log"
  grep -E "${PAT:-tokens/sec|speedup|passed|failed|error|Error|rc=|cost model|engine|decode step}" "$OUT/$name.log" \
    | cut -c1-260 | tail -"${TAILN:-14}"
}
build() {  # this tree's kernels (compile_cuda.sh), unless already built
  [ -f minitorch/cuda_kernels/gemv.fatbin ] && [ -z "${REBUILD:-}" ] && return
  log build; ./compile_cuda.sh > "$OUT/build.log" 2>&1; echo "build rc=$?"
}
need_base() {
  [ -n "${BASE:-}" ] && [ -d "$BASE/minitorch" ] || { echo "set BASE to a copy of the older tree (see the header)"; exit 2; }
}
real_env() {  # the real pair staged in /root/cache, the carried wheels (gguf, math-verify), the kernels built
  export MINITORCH_SPEC_CACHE=/root/cache
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl && export PYTHONPATH=/tmp/site
  build
}
B="--limit 20 --backend cuda --no-plots --no-progress"
PG='speedup|^spec |^target |time:|identical|rc=|Error|error'
case "${1:-}" in
tests)
  build
  PAT='passed|failed|error|rc=' TAILN=6 run tests 540 python3 -m pytest -m gpu -q -x -p no:cacheprovider \
      --junitxml="$OUT/gpu_tests.xml"
  ;;
bits)
  need_base; build
  log "base kernels from $BASE/kernels"
  MINITORCH_KERNELS_DIR="$BASE/kernels" MINITORCH_CUDA_BUILD_DIR=/tmp/base_build ./compile_cuda.sh > "$OUT/build_base.log" 2>&1
  echo "base build rc=$?"
  PAT='.' run bits_new 120 python3 tools/check_bits.py
  PAT='.' run bits_base 120 env MINITORCH_CUDA_BUILD_DIR=/tmp/base_build python3 tools/check_bits.py
  grep -v '^rc=' "$OUT/bits_new.log" > /tmp/a; grep -v '^rc=' "$OUT/bits_base.log" > /tmp/b
  diff /tmp/a /tmp/b > /dev/null && echo "bits: IDENTICAL digests" || echo "bits: DIGESTS DIFFER (see the logs)"
  ;;
step)
  build
  S="project/bench/throughput.py --spec --max-len 32768 --gemv tc --draft-gemv ourstc --int8 draft --gammas 3 4 --extend 4"
  PAT='cost model|cost ratio|decode step|verify|rc=|Error' run step_coder 150 python3 $S --spec-pair coder
  PAT='cost model|cost ratio|decode step|verify|rc=|Error' run step_r1 200 python3 $S --spec-pair r1
  PAT='tokens/sec|decode step|rc=|Error' run step_ours 120 python3 project/bench/throughput.py --shape qwen2.5-coder-1.5b \
      --max-len 32768 --gemv ours
  ;;
ab)
  need_base; build
  [ -f "$BASE/minitorch/cuda_kernels/gemv.fatbin" ] || (cd "$BASE" && ./compile_cuda.sh > "$OUT/build_base.log" 2>&1)
  for i in 1 2; do  # interleaved, twice: the two trees see the same machine state
    PAT='"tree"' run ab_base_$i 120 env PYTHONPATH="$BASE" python3 tools/ab_steps.py base  # $BASE's minitorch
    PAT='"tree"' run ab_new_$i 120 env PYTHONPATH=. python3 tools/ab_steps.py new
  done
  ;;
bench-real)
  real_env
  PAT=$PG TAILN=8 run gsm8k_default 150 python3 project/benchmark_gsm8k.py $B -o "$OUT/gsm8k_default.jsonl"
  PAT=$PG TAILN=8 run gsm8k_ours 150 python3 project/benchmark_gsm8k.py $B --gpu-gemv ours -o "$OUT/gsm8k_ours.jsonl"
  PAT=$PG TAILN=8 run math500_default 170 python3 project/benchmark_limo.py --dataset math500 $B \
      -o "$OUT/math500_default.jsonl"
  ;;
bench-ab)
  need_base; real_env
  [ -f "$BASE/minitorch/cuda_kernels/gemv.fatbin" ] || (cd "$BASE" && ./compile_cuda.sh > "$OUT/build_base.log" 2>&1)
  PAT=$PG TAILN=8 run gsm8k_base 200 env PYTHONPATH="$BASE:${PYTHONPATH:-}" python3 "$BASE/project/benchmark_gsm8k.py" $B \
      -o "$OUT/gsm8k_base.jsonl"
  PAT=$PG TAILN=8 run gsm8k_new 200 python3 project/benchmark_gsm8k.py $B -o "$OUT/gsm8k_new.jsonl"
  python3 - "$OUT/gsm8k_base.jsonl" "$OUT/gsm8k_new.jsonl" <<'PY'
import json, sys
def load(p):
    return {(r["id"], r["mode"]): r for r in map(json.loads, open(p)) if "mode" in r}
a, b = load(sys.argv[1]), load(sys.argv[2])
same = sum(a[k]["text"] == b[k]["text"] for k in a if k in b)
print(f"bench-ab: {same} of {len(a)} texts identical ({len(b)} in the new run)")
PY
  ;;
ray)
  # --ray against a plain run of the same benchmark, one call: texts equal and speed within noise. Ray (79 MB) does
  # not fit one call: split it (split -b 40000000 ray-*.whl .raywhl/p/ray.), one call a piece copying it into
  # /root/raystage, then carry .raywhl/deps (jsonschema, jsonschema-specifications, referencing, rpds-py) and
  # .raywhl/sha (the wheel's sha256) with this mode.
  real_env
  W=/tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
  cat /root/raystage/ray.* > $W && echo "$(cat .raywhl/sha)  $W" | sha256sum -c - && python3 -m pip install -q --no-index \
    --no-deps --no-compile --no-cache-dir --target /tmp/site .raywhl/deps/*.whl $W || { echo "ray not staged"; exit 2; }
  PAT=$PG TAILN=8 run gsm8k_plain 200 python3 project/benchmark_gsm8k.py $B -o "$OUT/gsm8k_plain.jsonl"
  PAT="ray:|$PG" TAILN=8 run gsm8k_ray 200 python3 project/benchmark_gsm8k.py $B --ray -o "$OUT/gsm8k_ray.jsonl"
  python3 - "$OUT/gsm8k_plain.jsonl" "$OUT/gsm8k_ray.jsonl" <<'PY'
import json, sys
V = {'time_s', 'tokens_per_s', 'stats', 'finished_at', 'shard', 'predicted_speedup'}
def load(p):
    rs = [r for r in map(json.loads, filter(str.strip, open(p))) if 'mode' in r]
    return rs, sorted(({k: v for k, v in r.items() if k not in V} for r in rs), key=lambda r: (r['index'], r['mode']))
def tps(rs, m):
    return sum(r['generated_tokens'] for r in rs if r['mode'] == m) / sum(r['time_s'] for r in rs if r['mode'] == m)
(ra, a), (rb, b) = load(sys.argv[1]), load(sys.argv[2])
print(f"ray-vs-plain: {len(a)} {len(b)} {'EQUAL' if a == b else 'DIFFER'}; spec tok/s plain {tps(ra, 'spec'):.1f} "
      f"ray {tps(rb, 'spec'):.1f}; target plain {tps(ra, 'target'):.1f} ray {tps(rb, 'target'):.1f}")
PY
  ;;
*)
  sed -n "2,24p" "$0"; exit 2
  ;;
esac
log done

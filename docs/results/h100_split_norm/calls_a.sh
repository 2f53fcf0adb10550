#!/bin/bash
# stop 58, call A: the split norm's A/B and GPU tests, then GSM8K / MATH-500 first 20: chain with and without the
# split norm, longer chains, trees (each run with its own target-alone baseline)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MINITORCH_SPEC_CACHE=/root/cache
T0=$(date +%s); LIMIT=${LIMIT:-575}
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
run() { local name=$1 t=$2; shift 2; local l; l=$(left)
  if [ "$l" -lt 30 ]; then log "$name skipped (time)"; return; fi
  [ "$t" -gt "$l" ] && t=$l
  log "$name (timeout ${t}s)"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?" >> "$OUT/$name.log"
  grep -E "speedup|^spec |^target |passed|failed|rc=|Error|verify|same_bits|variant" "$OUT/$name.log" | cut -c1-300 | tail -6; }
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
[ -f minitorch/cuda_kernels/gemv.fatbin ] || { log build; ./compile_cuda.sh > "$OUT/build.log" 2>&1; echo "build rc=$?"; }
run split_ab 90 python3 tools/verify_profile.py --split-ab
run gpu_tests 120 python3 -m pytest -m gpu -q tests/test_cuda_tree.py tests/test_cuda_head_drafter.py
B="--limit 20 --backend cuda --no-plots --no-progress --drafter head"
G=project/benchmark_gsm8k.py
NOSPLIT="import sys, runpy; import minitorch.cuda.decoder as d; d.SPLIT_NORM_FROM = None; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
run gsm8k_chain4 120 python3 $G $B --gamma 4 -o $OUT/gsm8k_chain4.jsonl
run gsm8k_chain4_nosplit 120 python3 -c "$NOSPLIT" $G $B --gamma 4 -o $OUT/gsm8k_chain4_nosplit.jsonl
run gsm8k_chain6 120 python3 $G $B --gamma 6 -o $OUT/gsm8k_chain6.jsonl
run gsm8k_tree_2_4_8 120 python3 $G $B --draft-tree 2,4,8 -o $OUT/gsm8k_tree_2_4_8.jsonl
run gsm8k_tree_3_5_15 120 python3 $G $B --draft-tree 3,5,15 -o $OUT/gsm8k_tree_3_5_15.jsonl
run gsm8k_chain8 120 python3 $G $B --gamma 8 -o $OUT/gsm8k_chain8.jsonl
cd "$OUT" && tar czf bench58a.tgz *.jsonl *.log && rm -f *.jsonl gsm8k*.log && ls

#!/bin/bash
# stop 59, call A: GPU tests (the int8 head, the two-pass top-k, the shared row norm), then GSM8K first 20 with the
# shipped head: chain gamma 6 on bf16 and on 8-bit head rows, trees on 8-bit rows (each run its own target alone)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MINITORCH_SPEC_CACHE=/root/cache
T0=$(date +%s); LIMIT=${LIMIT:-430}
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
run() { local name=$1 t=$2; shift 2; local l; l=$(left)
  if [ "$l" -lt 30 ]; then log "$name skipped (time)"; return; fi
  [ "$t" -gt "$l" ] && t=$l
  log "$name (timeout ${t}s)"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?" >> "$OUT/$name.log"
  grep -E "speedup|^spec |^target |passed|failed|rc=|Error|draft steps|acceptance by" "$OUT/$name.log" | cut -c1-300 | tail -7; }
nvidia-smi --query-gpu=name --format=csv,noheader
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.done; }
export PYTHONPATH="$PYTHONPATH:/tmp/site"
[ -f minitorch/cuda_kernels/gemv.fatbin ] || { log build; ./compile_cuda.sh > "$OUT/build.log" 2>&1; echo "build rc=$?"; }
run gpu_tests 150 python3 -m pytest -m gpu -q tests/test_cuda_head_drafter.py tests/test_cuda_tree.py tests/test_cuda_batch.py -k "int8 or proposals or head_equals or topk or norm or batch"
B="--limit 20 --backend cuda --no-plots --no-progress --drafter head"
G=project/benchmark_gsm8k.py
run gsm8k_chain6_bf16 90 python3 $G $B --gamma 6 --gpu-draft-weights bf16 -o $OUT/gsm8k_chain6_bf16.jsonl
run gsm8k_chain6_int8 90 python3 $G $B --gamma 6 -o $OUT/gsm8k_chain6_int8.jsonl
run gsm8k_tree_3_5_15_int8 90 python3 $G $B --draft-tree 3,5,15 -o $OUT/gsm8k_tree_3_5_15_int8.jsonl
run gsm8k_tree_3_6_15_int8 90 python3 $G $B --draft-tree 3,6,15 -o $OUT/gsm8k_tree_3_6_15_int8.jsonl
cd "$OUT" && tar czf bench59a.tgz *.jsonl *.log 2>/dev/null && rm -f *.jsonl gsm8k*.log && ls

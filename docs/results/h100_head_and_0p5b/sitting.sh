#!/bin/bash
# stop 60: one GPU sitting as a queue of jobs. Each device call runs `bash docs/results/h100_head_and_0p5b/sitting.sh`;
# jobs already done on this machine (/root/done/NAME) are skipped, an interrupted Spec-Bench run resumes from its
# JSONL, and each call packs what it finished into $OUT/sitting_<t>.tgz (logs, JSONL, summaries).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MINITORCH_SPEC_CACHE=/root/cache
T0=$(date +%s); LIMIT=${LIMIT:-560}; W=/root/work; mkdir -p $W /root/done
log() { echo "=== $(date -u +%H:%M:%S) t=$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
job() { local name=$1 t=$2; shift 2; local l; l=$(left)
  [ -f /root/done/$name ] && return
  if [ "$l" -lt 40 ]; then log "$name skipped (time)"; return; fi
  [ "$t" -gt "$l" ] && t=$l
  log "$name (timeout ${t}s)"
  timeout "$t" bash -c "$(declare -f sb); W=$W; \"\$@\"" _ "$@" >> "$W/$name.log" 2>&1; local rc=$?; echo "rc=$rc" >> "$W/$name.log"
  [ $rc -eq 0 ] && touch /root/done/$name
  grep -E "speedup|^spec |^target |passed|failed|rc=|Error|acceptance by|identical" "$W/$name.log" | cut -c1-300 | tail -8; }
sb() { local name=$1; shift; local f=$W/$name.jsonl  # a function: job runs it through bash -c
  python3 project/benchmark_specbench.py --backend cuda --no-plots --no-progress -o $f $( [ -s $f ] && echo --resume ) "$@" \
    && python3 project/benchmark_specbench.py summary $f > $W/$name.summary.txt 2>&1 && tail -30 $W/$name.summary.txt; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.done; }
export PYTHONPATH="$PYTHONPATH:/tmp/site"
[ -f minitorch/cuda_kernels/gemv.fatbin ] || { log build; ./compile_cuda.sh > "$W/build.log" 2>&1; echo "build rc=$?"; }
B="--limit 20 --backend cuda --no-plots --no-progress"
job sb_head_all 470 sb sb_head_all                                  # all 480, the CLI's defaults (the shipped head)
job gsm8k_head 90 python3 project/benchmark_gsm8k.py $B -o $W/gsm8k_head.jsonl
job math500_head 100 python3 project/benchmark_limo.py --dataset math500 $B -o $W/math500_head.jsonl
job gpu_tests_int8_head 120 python3 -m pytest -m gpu -q tests/test_cuda_head_drafter.py -k "int8"
job sb_model_10 300 sb sb_model_10 --drafter model --per-category 10     # the 0.5B, first 10 of each category
job sb_head_10_t06 300 sb sb_head_10_t06 --per-category 10 --temperature 0.6
job sb_model_all 470 sb sb_model_all --drafter model                # the 0.5B on the rest, while time is left
cd $W && for f in *.jsonl; do [ -f "$f" ] && gzip -kf "$f"; done
tar czf $OUT/sitting_$(date -u +%H%M%S).tgz *.log *.jsonl.gz *.summary.txt 2>/dev/null; ls -la $OUT

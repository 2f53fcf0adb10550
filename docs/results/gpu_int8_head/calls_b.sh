#!/bin/bash
# stop 59, call B: all of Spec-Bench with the CLI's defaults on the CUDA-graph path (the shipped head, gamma 6, its
# 8-bit rows), resumable; then MATH-500 first 20 while time is left
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MINITORCH_SPEC_CACHE=/root/cache
T0=$(date +%s); LIMIT=${LIMIT:-540}
nvidia-smi --query-gpu=name --format=csv,noheader
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.done; }
export PYTHONPATH="$PYTHONPATH:/tmp/site"
[ -f minitorch/cuda_kernels/gemv.fatbin ] || { ./compile_cuda.sh > "$OUT/build.log" 2>&1; echo "build rc=$?"; }
F=/root/sb59.jsonl
timeout ${SB_LIMIT:-420} python3 project/benchmark_specbench.py --backend cuda --no-plots --no-progress -o $F \
  $( [ -s $F ] && echo --resume ) > $OUT/sb59.log 2>&1; echo "rc=$?"
grep -c '"mode": "spec"' $F
python3 project/benchmark_specbench.py summary $F > $OUT/sb59_summary.txt 2>&1; tail -26 $OUT/sb59_summary.txt
gzip -c $F > $OUT/sb59.jsonl.gz
B="--limit 20 --backend cuda --no-plots --no-progress --drafter head"
for w in int8; do
  l=$(( LIMIT - ($(date +%s) - T0) )); [ $l -lt 60 ] && { echo "math500_$w skipped (time)"; continue; }
  timeout $l python3 project/benchmark_limo.py --dataset math500 $B --gpu-draft-weights $w -o $OUT/math500_$w.jsonl > $OUT/math500_$w.log 2>&1
  echo "math500_$w rc=$?"; grep -E "speedup|^spec |^target |draft steps" $OUT/math500_$w.log | cut -c1-250
done
cd "$OUT" && for f in math500_*.jsonl; do [ -f "$f" ] && gzip "$f"; done; ls

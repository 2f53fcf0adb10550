#!/bin/bash
# stop 58, call B: all of Spec-Bench with the CLI's defaults on the CUDA-graph path (the shipped head), resumable
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MINITORCH_SPEC_CACHE=/root/cache
nvidia-smi --query-gpu=name --format=csv,noheader
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && touch /tmp/site/.done; }
export PYTHONPATH="$PYTHONPATH:/tmp/site"
[ -f minitorch/cuda_kernels/gemv.fatbin ] || { ./compile_cuda.sh > "$OUT/build.log" 2>&1; echo "build rc=$?"; }
F=/root/sb58.jsonl
timeout ${SB_LIMIT:-540} python3 project/benchmark_specbench.py --backend cuda --no-plots --no-progress -o $F \
  $( [ -s $F ] && echo --resume ) > $OUT/sb58.log 2>&1; echo "rc=$?"
grep -c '"mode": "spec"' $F
python3 project/benchmark_specbench.py summary $F > $OUT/sb58_summary.txt 2>&1; tail -24 $OUT/sb58_summary.txt
gzip -c $F > $OUT/sb58.jsonl.gz

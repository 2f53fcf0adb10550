#!/usr/bin/env bash
# Call B: train the head on --backend cuda (GSM8K train + call A's target answers), its acceptance on GSM8K test
# first 5 through the CPU engine on the CUDA backend, and the 0.5B draft's there for comparison.
set -u
OUT="${OUT:-/tmp/gpu}"; export MINITORCH_SPEC_CACHE=/root/cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site
TRAIN_LIMIT=${TRAIN_LIMIT:-300} EVAL_LIMIT=150 EVAL_N=5 bash tools/gpu_head.sh train
echo "=== draft model, same engine $(date -u +%T)"
timeout 100 python3 project/benchmark_gsm8k.py --backend cuda --dtype float32 --drafter model --gamma 4 --draft-extend 0 \
  --limit 5 --max-new-tokens 256 --modes spec --no-plots --no-progress -o /tmp/gsm8k_draft_eager.jsonl > /tmp/eval_draft.log 2>&1
echo "rc=$?"; tail -8 /tmp/eval_draft.log; cp /root/gen/train_gen.jsonl $OUT/

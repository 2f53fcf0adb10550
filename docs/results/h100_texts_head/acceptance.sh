#!/usr/bin/env bash
# acceptance of two heads on Spec-Bench first 5 per category, greedy, fixed gamma 3 (deterministic tau), spec mode only
# Ran on the 2-core Zen 3 dev box, 07:20-07:58 UTC, from /work/runs/s64 (paths made relative here); its acc_old.* and
# acc_new.* are acceptance_shipped.* and acceptance_candidate.* in this folder. Tau does not depend on the box (greedy, gamma fixed).
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD
for h in old:heads/qwen2.5-coder-1.5b-instruct new:docs/results/h100_texts_head/head_int4; do
  n=${h%%:*}; d=${h#*:}
  python project/benchmark_specbench.py --per-category 5 --max-new-tokens 128 --modes spec --draft-budget fixed \
    --head $d --no-plots --no-progress -o docs/results/h100_texts_head/acc_$n.jsonl > docs/results/h100_texts_head/acc_$n.log 2>&1; echo rc=$? >> docs/results/h100_texts_head/acc_$n.log
done

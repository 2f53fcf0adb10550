#!/bin/bash
# stop 59, call C (the third of the sitting; run inline, kept here as it ran): GSM8K tree 3,6,15 again, tree 4,6,15 and
# MATH-500 tree 3,6,15, each with its own target alone (before it, on the same machine: pytest -m gpu
# tests/test_cuda_tree.py tests/test_cuda_batch.py tests/test_cuda_int8.py: 95 passed)
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINITORCH_SPEC_CACHE=/root/cache; B="--limit 20 --backend cuda --no-plots --no-progress --drafter head"; for r in "gsm8k_tree_3_6_15_r2 project/benchmark_gsm8k.py --draft-tree 3,6,15" "gsm8k_tree_4_6_15 project/benchmark_gsm8k.py --draft-tree 4,6,15" "math500_tree_3_6_15 project/benchmark_limo.py --dataset math500 --draft-tree 3,6,15"; do set -- $r; n=$1; shift; echo "== $n"; timeout 110 python3 "$@" $B -o $OUT/$n.jsonl > $OUT/$n.log 2>&1; echo rc=$?; grep -E "speedup|^spec |^target |draft steps" $OUT/$n.log | cut -c1-260; done; cd $OUT && gzip *.jsonl; ls

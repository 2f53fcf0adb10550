#!/bin/bash
# stop 61: the shipped head on all 480 Spec-Bench questions on the H200 (issue 43's resolution line), GSM8K and
# MATH-500 first 20, all 480 again with a draft tree (translation and qa are below 1.5x with the chain), the 0.5B
# beside the head, temperature 0.6. Each call: `LIMIT=N bash docs/results/h200_head/sitting.sh`.
source tools/sitting_lib.sh
setup
B="--limit 20 --backend cuda --no-plots --no-progress"
job sb_head_all 560 sb sb_head_all                                  # all 480, the CLI's defaults (the shipped head)
job gsm8k_head 90 python3 project/benchmark_gsm8k.py $B -o $W/gsm8k_head.jsonl
job math500_head 100 python3 project/benchmark_limo.py --dataset math500 $B -o $W/math500_head.jsonl
job sb_tree_all 560 sb sb_tree_all --draft-tree 3,6,15             # all 480 with the tree that led on GSM8K
job sb_model_10 300 sb sb_model_10 --drafter model --per-category 10     # the 0.5B, first 10 of each category
job sb_head_10_t06 300 sb sb_head_10_t06 --per-category 10 --temperature 0.6
job sb_model_all 470 sb sb_model_all --drafter model                # the 0.5B on all 480, while time is left
pack

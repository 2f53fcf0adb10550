#!/bin/bash
# stop 60: one GPU sitting as a queue of jobs. Each device call runs `bash docs/results/h100_head_and_0p5b/sitting.sh`;
# jobs already done on this machine (/root/done/NAME) are skipped, an interrupted Spec-Bench run resumes from its
# JSONL, and each call packs what it finished into $OUT/sitting_<t>.tgz (logs, JSONL, summaries). Its helpers, written
# here at stop 60, moved into tools/sitting_lib.sh at stop 61 unchanged; the jobs are the ones that ran.
source tools/sitting_lib.sh
setup
B="--limit 20 --backend cuda --no-plots --no-progress"
job sb_head_all 470 sb sb_head_all                                  # all 480, the CLI's defaults (the shipped head)
job gsm8k_head 90 python3 project/benchmark_gsm8k.py $B -o $W/gsm8k_head.jsonl
job math500_head 100 python3 project/benchmark_limo.py --dataset math500 $B -o $W/math500_head.jsonl
job gpu_tests_int8_head 120 python3 -m pytest -m gpu -q tests/test_cuda_head_drafter.py -k "int8"
job sb_model_10 300 sb sb_model_10 --drafter model --per-category 10     # the 0.5B, first 10 of each category
job sb_head_10_t06 300 sb sb_head_10_t06 --per-category 10 --temperature 0.6
job sb_model_all 470 sb sb_model_all --drafter model                # the 0.5B on the rest, while time is left
pack

#!/bin/bash
# stop 65: the candidate head of docs/results/h100_texts_head/ (stage B, int4) on all 480 Spec-Bench questions on the
# GPU (issue 43's line: >= 1.8x), the shipped head beside it on the same machine, then the candidate on GSM8K and
# MATH-500 first 20, temperature 0.6 (first 10 a category). Each call: `LIMIT=N bash .cand/sitting.sh`
# (the heads travel in .cand/, carried: cand/ the candidate, shipped/ a copy of heads/qwen2.5-coder-1.5b-instruct).
source tools/sitting_lib.sh
setup
C=.cand/cand; S=.cand/shipped
B="--limit 20 --backend cuda --no-plots --no-progress"
job sb_cand_all 560 sb sb_cand_all --head $C                         # all 480, the CLI's defaults, the candidate
job sb_ship_all 560 sb sb_ship_all --head $S                         # all 480, the shipped head, same machine
job gsm8k_cand 90 python3 project/benchmark_gsm8k.py $B --head $C -o $W/gsm8k_cand.jsonl
job math500_cand 100 python3 project/benchmark_limo.py --dataset math500 $B --head $C -o $W/math500_cand.jsonl
job sb_cand_10_t06 300 sb sb_cand_10_t06 --head $C --per-category 10 --temperature 0.6
pack

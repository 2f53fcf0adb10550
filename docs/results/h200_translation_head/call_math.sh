#!/bin/bash
# stop 68, call 5: GSM8K and MATH-500 first 20, the shipped head (defaults) and the new one (MATH-500), same machine
source tools/sitting_lib.sh
setup
heads_from .cand/heads_copy || exit 1
B="--limit 20 --backend cuda --no-plots --no-progress"
job gsm8k_old 90 python3 project/benchmark_gsm8k.py $B -o $W/gsm8k_old.jsonl
job math500_old 100 python3 project/benchmark_limo.py --dataset math500 $B -o $W/math500_old.jsonl
job math500_new 100 python3 project/benchmark_limo.py --dataset math500 $B --head /root/head_int4 -o $W/math500_new.jsonl
pack

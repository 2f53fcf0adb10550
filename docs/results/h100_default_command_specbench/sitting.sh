#!/bin/bash
# stop 66: issue 43's GPU line with the head in heads/ taken by the defaults (no --head): all 480 Spec-Bench
# questions, the README's first command with --backend cuda, GSM8K and MATH-500 first 20, temperature 0.6 (first 10 a
# category). Asked for an H200, ran on an H100. The call that ran: `rm -f /root/done/*; rm -f /root/work/*.jsonl;
# LIMIT=430 bash .cand/sitting3.sh` (it sat in .cand/, carried, as this file). heads/ is hidden while staging: it
# travels in .cand/heads_copy (the same files, diff -r checked) and is copied in. The 0.5B was not staged (device time).
source tools/sitting_lib.sh
setup
ls -la heads heads/* 2>&1 | head; mkdir -p heads && cp -r .cand/heads_copy/. heads/
sha256sum heads/qwen2.5-coder-1.5b-instruct/head.safetensors
B="--limit 20 --backend cuda --no-plots --no-progress"
job sb_head_all 560 sb sb_head_all                                    # all 480, the defaults: the head from heads/
job demo_gpu 120 python3 project/run_spec_decoding.py --backend cuda
job gsm8k_head 90 python3 project/benchmark_gsm8k.py $B -o $W/gsm8k_head.jsonl
job math500_head 100 python3 project/benchmark_limo.py --dataset math500 $B -o $W/math500_head.jsonl
# job sb_model_all 560 sb sb_model_all --drafter model                  # the 0.5B (staged with WITH_DRAFT=1), all 480
job sb_head_10_t06 300 sb sb_head_10_t06 --per-category 10 --temperature 0.6
pack

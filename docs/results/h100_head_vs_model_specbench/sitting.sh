#!/bin/bash
# stop 67: issue 43's GPU line on the H200 (stop 66 got only an H100): the head in heads/ taken by the defaults (no
# --head), all 480 Spec-Bench questions; GSM8K and MATH-500 first 20; the 0.5B beside it (all 480; staged with
# WITH_DRAFT=1). heads/ is hidden while staging: it travels in .cand/heads_copy and goes back by heads_from.
source tools/sitting_lib.sh
setup
heads_from .cand/heads_copy || exit 1
sha256sum heads/qwen2.5-coder-1.5b-instruct/head.safetensors
B="--limit 20 --backend cuda --no-plots --no-progress"
job sb_head_all 560 sb sb_head_all                                    # all 480, the defaults: the head from heads/
job gsm8k_head 90 python3 project/benchmark_gsm8k.py $B -o $W/gsm8k_head.jsonl
job math500_head 100 python3 project/benchmark_limo.py --dataset math500 $B -o $W/math500_head.jsonl
job sb_model_all 560 sb sb_model_all --drafter model                  # the 0.5B, all 480
job demo_gpu 120 python3 project/run_spec_decoding.py --backend cuda
pack
# the third call (the queue above done), the machine still warm:
#   LIMIT=520 bash -c 'source tools/sitting_lib.sh; setup; heads_from .cand/heads_copy || exit 1; job sb_head_10_t06 500 sb sb_head_10_t06 --per-category 10 --temperature 0.6; pack'

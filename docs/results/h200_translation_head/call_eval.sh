#!/bin/bash
# stop 68, call 3: the new head (/root/head_int4) on all 480 Spec-Bench questions and GSM8K first 20
source tools/sitting_lib.sh
setup
[ -f /root/head_int4/head.safetensors ] || { echo "no /root/head_int4"; exit 3; }
sha256sum /root/head_int4/head.safetensors
job sb_new_all 560 sb sb_new_all --head /root/head_int4
job gsm8k_new 90 python3 project/benchmark_gsm8k.py --limit 20 --backend cuda --no-plots --no-progress --head /root/head_int4 -o $W/gsm8k_new.jsonl
pack

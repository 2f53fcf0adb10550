#!/bin/bash
# stop 68, call 2: the shipped head trained on (fine-tuned from its int4 weights) the new translation text first, then
# text it has not seen (data/chat items 2000-3199), text it has (data/texts' second half), a little math; LR 3e-4, one
# pass paced by --time-limit; shipped int4 (project/ship_head.py) into /root/head_int4, back in $OUT
source tools/sitting_lib.sh
setup
GEN_FILES="/root/trans/answers.jsonl data/chat/answers_02000-03199_coder1.5b_greedy.jsonl.gz \
data/texts/answers_1002500-1004999_coder1.5b_greedy.jsonl.gz data/selfmath/answers_0000-0335_coder1.5b_greedy.jsonl \
data/gsm8k/generated/train_first120_coder1.5b_greedy.jsonl" INIT=.cand/heads_copy/qwen2.5-coder-1.5b-instruct \
  LIMIT_PROBLEMS=320 EPOCHS=1 LR=3e-4 TOKENS=4096 TRAIN_LIMIT=470 SHIP=1 EVAL_N=0 NEED=/root/trans/answers.jsonl \
  bash tools/gpu.sh train-head
ls -la $OUT /root/head_int4
if [ ! -f /root/head_int4/head.safetensors ] && [ -f /root/head/checkpoint/head.safetensors ]; then
  echo "no shipped head: shipping the last checkpoint"; python3 project/ship_head.py /root/head/checkpoint -o /root/head_int4 2>&1 | tail -3
  cp /root/head_int4/head.safetensors "$OUT/head_int4.safetensors"; cp /root/head_int4/head.json "$OUT/head_int4.json"
fi

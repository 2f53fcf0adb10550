#!/bin/bash
# stop 68, call 4: the shipped head (heads/, by the defaults: no --head) on all 480, the same machine
source tools/sitting_lib.sh
setup
heads_from .cand/heads_copy || exit 1
sha256sum heads/qwen2.5-coder-1.5b-instruct/head.safetensors
job sb_old_all 560 sb sb_old_all
pack

#!/bin/bash
# stop 68, call 6: the README's first command with --backend cuda and Spec-Bench at temperature 0.6 (first 10 of each
# category), the shipped head by the defaults, same machine
source tools/sitting_lib.sh
setup
heads_from .cand/heads_copy || exit 1
job demo_gpu 80 python3 project/run_spec_decoding.py --backend cuda
job sb_old_10_t06 400 sb sb_old_10_t06 --per-category 10 --temperature 0.6
pack

#!/bin/bash
# stop 68, call 1: the target writes German sentences and translates them (write_chat.py --style texts --kinds
# translation, items 3000000-3019999), batch 256, the target alone
source tools/sitting_lib.sh
setup
START=2000000 STYLES=texts TURNS=1 TEXT_KINDS=translation BATCH=256 GEN_DIR=/root/trans REQ_LIMIT=260 REQ_TOKENS=256 \
  LIMIT=555 bash tools/gpu.sh write-chat 20000
ls -la /root/trans

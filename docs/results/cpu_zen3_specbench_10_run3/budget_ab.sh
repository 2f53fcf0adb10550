#!/bin/bash
# the README's demo, the budget before (main, 01961c5) and after (wt: t_1 at the box's present speed), alternating
source /work/venv/bin/activate
for i in 1 2 3 4; do
  for v in old new; do
    if [ $v = old ]; then cd /work/main; export PYTHONPATH=/work/main; else cd /work/wt; export PYTHONPATH=/work/wt; fi
    echo "== $i $v $(date -u +%T)"
    python project/run_spec_decoding.py --json 2>/dev/null | python -c "
import json,sys; d=json.load(sys.stdin); st=d['spec']['stats']; print(f\"speedup {d['speedup']:.3f} tau {st['tau']:.2f} plain {st.get('plain_rounds')} identical {d['spec']['text']==d['target']['text']}\")"
  done
done

#!/bin/bash
# demo pairs: --draft-lookup 0 vs 3 alternating, default prompt and the seed's prompt
source /work/venv/bin/activate; cd /work/main
for i in 1 2 3; do
  for L in 0 3; do
    for P in default seed; do
      if [ $P = seed ]; then A=(--prompt "Who is better Ronaldo or Messi?"); else A=(); fi
      echo "== pair $i L$L $P $(date -u +%T)"
      python project/run_spec_decoding.py --draft-lookup $L "${A[@]}" --json 2>/dev/null | python -c "
import json,sys; d=json.load(sys.stdin); st=d['spec']['stats']; print(f\"speedup {d['speedup']:.3f} tau {st['tau']:.2f} lookup_rounds {st.get('lookup_rounds')} plain {st.get('plain_rounds')} identical {d['spec']['text']==d['target']['text']}\")" 
    done
  done
done

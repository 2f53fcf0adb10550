#!/bin/bash
# fixed vs cost draft budget on the CPU, real offline pair, 0.5B draft (a fresh clone's default), alternating
cd "$(git rev-parse --show-toplevel)"
. .venv/bin/activate  # the Quickstart's venv
for rep in 1 2; do
  for prompt in "Who is better Ronaldo or Messi?" "Explain how photosynthesis works to a ten-year-old." "DEFAULT"; do
    for budget in fixed cost; do
      if [ "$prompt" = DEFAULT ]; then P=(); else P=(--prompt "$prompt"); fi
      python -m project.run_spec_decoding "${P[@]}" --draft-budget $budget --json 2>/dev/null \
        | python -c "import json,sys; o=json.loads(sys.stdin.read().strip().splitlines()[-1]); s=o['spec']['stats']; print(json.dumps({'prompt': o['prompt'][:30], 'budget': '$budget', 'rep': $rep, 'speedup': round(o['speedup'],3), 'spec_tps': round(s['tokens_per_s'],2), 'target_tps': round(o['target']['stats']['tokens_per_s'],2), 'tau': round(s['tau'],2), 'plain_rounds': s.get('plain_rounds'), 'rounds': s['rounds'], 'same': o['spec']['tokens']==o['target']['tokens']}))"
    done
  done
done

import argparse, time, sys
import numpy as np
from project.settings import add_engine_args, resolve_settings
from project.cli_common import load_models
from minitorch.generation import budget as B
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args(["--drafter", "head"])), progress=False)
text = open('README.md').read()
ids = m.tokenizer.encode(text); ids = [int(x) for x in (ids.ids if hasattr(ids, 'ids') else ids)][:600]
orig = B.CostBudget._choose_gated
def closed(self):
    if self.rounds == 0: return orig(self)
    return 0
spec = m.engine(); alone = spec.alone(); spec.warm_up()
N = int(sys.argv[1]) if len(sys.argv) > 1 else 64
for rep in range(3):
    for name in ('alone', 'spec-closed', 'spec'):
        B.CostBudget._choose_gated = closed if name == 'spec-closed' else orig
        e = alone if name == 'alone' else spec
        r = e.generate(ids, max_new_tokens=N)
        st = r.stats
        dec = st['time_total'] - st['time_prefill']
        print('%-12s prefill %.3f decode %.3f (%.2f ms/token) verify %.3f draft %s sample %.3f fwd %s' % (name, st['time_prefill'], dec, dec / st['new_tokens'] * 1e3, st['time_verify'], st.get('time_draft'), st['time_sample'], st['target_forwards']), flush=True)

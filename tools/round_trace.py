"""Each round of the README's demo with a draft head, in one line: who drafted it (h: the head, l<n>: prompt lookup on
an n-gram of n tokens), how many drafts, how many the target accepted; plain rounds (no drafts) are not listed.

    python tools/round_trace.py [--draft-lookup 2] [any of the CLI's engine flags]

Prints tau, the plain and looked-up rounds, then the rounds as `kind[drafts:accepted]`.
"""
import argparse
import sys

from minitorch.generation import head_drafter
from project.cli_common import encode_prompt, load_models
from project.run_spec_decoding import DEFAULT_PROMPT
from project.settings import add_engine_args, resolve_settings

rounds = []
_propose, _rollback = head_drafter.HeadDrafter.propose, head_drafter.HeadDrafter.rollback


def propose(self, tokens, gamma, cfg, rng, gate=None):
    out = _propose(self, tokens, gamma, cfg, rng, gate=gate)
    kind = f"l{self._round[0]}" if self._round is not None else "h"
    rounds.append([len(tokens), kind, len(out[0]), None])
    return out


def rollback(self, n_tokens):
    if rounds and rounds[-1][3] is None:
        rounds[-1][3] = n_tokens - rounds[-1][0]
    return _rollback(self, n_tokens)


def main() -> None:
    head_drafter.HeadDrafter.propose, head_drafter.HeadDrafter.rollback = propose, rollback
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_engine_args(p)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    args = p.parse_args(sys.argv[1:] + ["--drafter", "head"])
    m = load_models(resolve_settings(args), progress=False)
    s = m.settings
    engine = m.engine()  # the CLI's engine: the head with the settings' gamma, budget and lookup
    engine.warm_up(batch=1)
    rounds.clear()
    r = engine.generate(encode_prompt(m.tokenizer, args.prompt, True), s.max_new_tokens)
    print(f"tau {r.stats.get('tau'):.2f}, plain rounds {r.stats.get('plain_rounds')}, "
          f"looked-up rounds {r.stats.get('lookup_rounds')}")
    print(" ".join(f"{kind}[{g}:{a}]" for _, kind, g, a in rounds))


if __name__ == "__main__":
    main()

"""How often prompt lookup's first draft is the target's next token, by the length of the n-gram matched, on the
target's own answers (data/chat's conversations: training text, not an evaluation set): the priors of
minitorch/generation/head_drafter.py's FIRST_LOOKUP_RATE.

    python tools/lookup_rates.py [--files data/chat/answers_00000-01999_coder1.5b_greedy.jsonl.gz] [--n 400] [--ids 128]

At every answer position of the first --n conversations of each file (the last answer's first --ids ids, after its
conversation under the chat template), lookup_match with n-grams of 1 to 3 tokens proposes GAMMA drafts; a draft is
right where it is the answer's next id (the target's greedy text, so the target's own choice), and judged only while
the drafts before it were right, as a verify judges them.
"""
import argparse
from collections import defaultdict
from pathlib import Path

from minitorch.generation.drafters import LOOKUP_MAX_NGRAM, lookup_match
from minitorch.models import load_model
from project.evaluation.data import read_json_rows

GAMMA = 3  # drafts a match proposes (the CPU head's gamma)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="+", default=["data/chat/answers_00000-01999_coder1.5b_greedy.jsonl.gz"])
    ap.add_argument("--n", type=int, default=400, help="conversations of each file (default 400)")
    ap.add_argument("--ids", type=int, default=128, help="answer ids read a conversation (default 128)")
    args = ap.parse_args()
    _, tok = load_model("qwen2.5-coder-1.5b-instruct", progress=False)
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0] * GAMMA)  # n -> [right, judged] by draft position
    for path in args.files:
        rows = read_json_rows(Path(path))[:args.n]
        for r in rows:
            if not isinstance(r.get("messages"), list):
                continue
            prompt = tok.encode(tok.apply_chat_template(r["messages"], add_generation_prompt=True))
            ids = list(prompt) + list(tok.encode(r["text"]))[:args.ids]
            for t in range(len(prompt), len(ids)):
                found, n = lookup_match(ids[:t], GAMMA, LOOKUP_MAX_NGRAM, 1)
                for i, d in enumerate(found):  # judged while every earlier draft was right
                    counts[n][2 * i + 1] += 1
                    if t + i >= len(ids) or d != ids[t + i]:
                        break
                    counts[n][2 * i] += 1
    for n in sorted(counts):
        c = counts[n]
        rates = " ".join(f"{c[2 * i] / c[2 * i + 1]:.3f} of {c[2 * i + 1]:,}" for i in range(GAMMA) if c[2 * i + 1])
        print(f"n-gram of {n}{' or more' if n == LOOKUP_MAX_NGRAM else ''}: right by draft position, given the "
              f"earlier ones right: {rates}")


if __name__ == "__main__":
    main()

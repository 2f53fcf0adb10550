"""GSM8K benchmark: accuracy, acceptance and speed of speculative vs plain decoding, side by side.

    python project/benchmark_gsm8k.py --limit 20                 # offline pair, greedy, spec and target
    python project/benchmark_gsm8k.py --limit 20 --resume        # continue after Ctrl-C / kill
    python project/benchmark_gsm8k.py --shard 1/4 --limit 200    # one of 4 processes; then 'merge'
    python project/benchmark_gsm8k.py merge -o results/gsm8k/all.jsonl results/gsm8k/test.shard-*.jsonl
    python project/benchmark_gsm8k.py summary results/gsm8k/test.jsonl

Data: data/gsm8k/test.jsonl in the repository (1,319 problems), or --data-file, or --hub (openai/gsm8k).
Writes results/gsm8k/<dataset>.jsonl (one line per problem and mode), <...>.summary.json and
<...>_plots/*.png. Shared code: project/evaluation/ (grading: evaluation/grading.py).
"""
from __future__ import annotations

import sys


from project.evaluation.cli import BenchSpec, main

GSM8K = BenchSpec(
    name="gsm8k",
    datasets=("gsm8k",),
    default_dataset="gsm8k",
    default_max_new_tokens=1024,
    description="GSM8K (test, 1,319 grade-school math problems): accuracy, acceptance and tokens/s of "
                "speculative decoding and the target alone.",
)

if __name__ == "__main__":
    sys.exit(main(GSM8K))

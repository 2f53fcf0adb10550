"""LIMO benchmark: the LIMO evaluation sets (MATH-500, AIME24, AMC23; LIMO's 817 problems from the hub)
with long reasoning outputs: accuracy, acceptance and speed of speculative vs plain decoding.

    python project/benchmark_limo.py --dataset math500 --limit 20
    python project/benchmark_limo.py --dataset aime24 --max-new-tokens 8192 --resume
    python project/benchmark_limo.py --dataset limo --hub          # GAIR/LIMO, needs 'datasets' + network
    python project/benchmark_limo.py merge -o results/limo/all.jsonl results/limo/math500.shard-*.jsonl

Data: data/limo/eval/{math500,aime24,amc23}.jsonl in the repository, or --data-file. Prompts use the model's
chat template with "Please reason step by step, and put your final answer within \\boxed{}."
(--system-prompt puts it in a system turn, as LIMO's own evaluation does).
"""
from __future__ import annotations

import sys


from project.evaluation.cli import BenchSpec, main

LIMO = BenchSpec(
    name="limo",
    datasets=("math500", "aime24", "amc23", "limo"),
    default_dataset="math500",
    default_max_new_tokens=4096,
    description="LIMO evaluation sets (MATH-500, AIME24, AMC23; 'limo' = GAIR/LIMO from the hub): accuracy, "
                "acceptance and tokens/s of speculative decoding and the target alone.",
)

if __name__ == "__main__":
    sys.exit(main(LIMO))

"""Spec-Bench: the standard benchmark of speculative decoding (Xia et al. 2024; 480 questions in 13 categories, the
80 MT-bench ones as two-turn conversations): speedup, tau and acceptance per category and overall, speculative
decoding against the target alone, beside GSM8K and LIMO.

    python project/benchmark_specbench.py                          all 480, greedy, up to 1,024 new tokens a turn
    python project/benchmark_specbench.py --per-category 10        the first 10 of each category (130 questions)
    python project/benchmark_specbench.py --category qa,rag --resume
    python project/benchmark_specbench.py summary results/specbench/spec_bench.jsonl

Data: data/spec_bench/question.jsonl in the repository (data/README.md), or --data-file. Spec-Bench's own settings
are the defaults: greedy, 1,024 new tokens a turn, the model's chat template with no instruction of ours; an
MT-bench question's second turn sees this mode's own answer to the first. No answer is graded: the summary's
accuracy column is empty and the per-category table gives each category's speedup (95% CI), tau, alpha and
whether speculative output equals the target alone's.
"""
from __future__ import annotations

import sys

from project.evaluation.cli import BenchSpec, main

SPEC_BENCH = BenchSpec(
    name="specbench",
    datasets=("spec_bench",),
    default_dataset="spec_bench",
    default_max_new_tokens=1024,
    description="Spec-Bench (MT-bench conversations, translation, summarization, QA, math reasoning, RAG): speedup, "
                "tau and acceptance of speculative decoding over the target alone, per category and overall.",
    categories=True,
)

if __name__ == "__main__":
    sys.exit(main(SPEC_BENCH))

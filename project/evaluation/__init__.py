"""Benchmark evaluation for GSM8K and LIMO (the code behind project/benchmark_gsm8k.py and benchmark_limo.py).

    cli.py       the command line both benchmarks share: run (resumable, sharded), merge, summary
    runner.py    the run loop and its JSONL results (one fsync'ed line per problem and mode; resume, merge)
    data.py      problems: the copies in data/, --data-file, the hub; slicing, shards, the reasoning prompt
    engine.py    model / drafter / sampling flags and the generator each mode runs
    batch.py     generation jobs run one at a time or --batch N at once (the target mode, the text writers)
    grading.py   final-answer extraction and grading (\\boxed{}, ####, last number; math-verify)
    summary.py   accuracy, throughput, speedup with a bootstrap interval, acceptance; table and JSON
    plots.py     PNG plots of a summary (matplotlib, imported only when plotting)
    hf.py        the optional transformers baselines (--compare-hf)

Importing the package imports none of its modules, so `merge` and `summary` start without numba or models.
"""

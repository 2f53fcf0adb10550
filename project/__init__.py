"""The command-line programs (run_spec_decoding.py, the benchmarks, the head's trainer and text writer) and the
code only they use (evaluation/, training/, bench/). A package, so that `python -m project.run_spec_decoding` and
`python project/run_spec_decoding.py` both import it the same way (pip install -e . puts it on the path)."""

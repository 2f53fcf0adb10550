"""Speed benchmarks (programs; each prints its figures and the command that made them):

    ops.py         FastOps against numpy on decode-step sizes, and the per-op dispatch cost (CPU)
    cpu_decode.py  our CPU decode tokens/s against transformers, same GGUF weights
    cpu_spec.py    speculative against target-alone on GSM8K prompts (CPU), optionally against transformers
    throughput.py  GPU decode and verify steps (CudaDecoder), random weights of the real shapes or a model

Run them as `python project/bench/<name>.py`; tests import them as `from bench import throughput`.
"""

"""Device A/B (issue 14): the coder 0.5B draft's one-token step with its LM head over the whole vocabulary and
over the first 32,768 token ids (--draft-vocab 32768), random weights, 32k cache, one process:
    PYTHONPATH=. python3 tools/draft_vocab_step.py"""
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from minitorch.cuda.decoder import CudaDecoder, random_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "project" / "bench"))
import throughput  # noqa: E402  (the bench's shapes and graph timer)


def main() -> None:
    from minitorch.cuda.runtime import cupy_or_exit

    cp = cupy_or_exit("tools/draft_vocab_step.py")

    cfg = SimpleNamespace(**throughput.SHAPES["qwen2.5-coder-0.5b"])
    dec = CudaDecoder(cfg, random_weights(cfg, seed=0), max_len=32768, max_tokens=16, gemv="ours")
    dec.prefill([int(x) for x in np.random.default_rng(0).integers(0, cfg.vocab_size, 256)])
    p = int(dec.pos.get()[0])
    for n in (cfg.vocab_size, 32768, cfg.vocab_size, 32768):
        dec.limit_vocab(n)
        dec.set_position(p)
        print(f"LM head over {n} tokens: step {throughput.time_graph(cp, dec, 1) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

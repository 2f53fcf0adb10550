"""The head's own step over the prompt against the target's prefill, on the CPU with the CLI's settings (int8
activations): random prompt ids of 128, 256, 512 and 917 tokens; the head's embed, fc and whole step in ms and as a
share of the prefill (docs/results/cpu_zen3_prompt_window/), and the kv-only step the drafter now reads the prompt
with (draft_step(kv_only=True): fc, the input norm and the k/v products), alternating with the whole step.

    python tools/cpu_head_prefill.py
"""
import argparse, time
import numpy as np
from project.settings import add_engine_args, resolve_settings
from project.cli_common import load_models
from minitorch import no_grad, nn, from_numpy
from minitorch.generation.head_drafter import HeadDrafter
p = argparse.ArgumentParser(); add_engine_args(p)
m = load_models(resolve_settings(p.parse_args(["--drafter", "head"])), progress=False)
tgt, head = m.target, m.head
print("settings cpu_activations", m.settings.cpu_activations)
rng = np.random.default_rng(0)
with no_grad():
    for T in (128, 256, 512, 917, 917):
        prompt = [int(x) for x in rng.integers(100, 30000, T)]
        c = tgt.new_cache(T + 8); t0 = time.perf_counter(); lg, feats = tgt(prompt, c, last_n=1, return_hidden=True); a = time.perf_counter() - t0
        d = HeadDrafter(head, tgt); d.start(prompt, T + 8, m.vocab_size)
        arr = np.asarray(feats.to_numpy(), dtype=np.float32).reshape(-1, head.config.hidden_size)
        F = from_numpy(arr[:T - 1][None], backend=head.backend)
        t0 = time.perf_counter(); emb = d._embed(prompt[1:T]); t_emb = time.perf_counter() - t0
        t0 = time.perf_counter(); x = head.fc(nn.cat([F, emb], -1)); t_fc = time.perf_counter() - t0
        t_all, t_kv = [], []
        for _ in range(3):  # alternating, each on a fresh cache
            d.cache = head.new_cache(T + 8); t0 = time.perf_counter(); d._step(F, prompt[1:T]); t_all.append(time.perf_counter() - t0)
            d.cache = head.new_cache(T + 8); t0 = time.perf_counter()
            head.draft_step(F, d._embed(prompt[1:T]), d.cache, d._lm, d._rows(), kv_only=True); t_kv.append(time.perf_counter() - t0)
        t_all, t_kv = min(t_all), min(t_kv)
        print(f"T={T} target prefill {a*1e3:.0f} ms; head: embed {t_emb*1e3:.1f} fc {t_fc*1e3:.1f} whole step {t_all*1e3:.1f} ms ({t_all/a:.1%}); "
              f"kv-only {t_kv*1e3:.1f} ms ({t_kv/a:.1%}, {t_all/t_kv:.2f}x less)")

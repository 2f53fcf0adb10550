"""run_spec_decoding.py: output format, --json, interactive commands (in process, with tiny numpy
models), and argument errors through a subprocess (exit 2, one line, no traceback)."""
from __future__ import annotations

import builtins
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from project import cli_common
from project import run_spec_decoding as prog
from minitorch.cuda.runtime import cuda_available
from test_generation_fakes import FakeModel

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "project" / "run_spec_decoding.py"
V = 40


class FakeTokenizer:
    vocab_size = V
    stop_token_ids = {0}

    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % (V - 1) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


@pytest.fixture
def fake_models(monkeypatch):
    target = FakeModel(V, seed=1)
    draft = FakeModel(V, seed=2, like=target, noise=0.1)

    def load(settings, need_draft=None, progress=True):
        s = settings.for_head(None)  # as load_models decides (no head for a fake target: auto is the draft model)
        with_draft = need_draft if need_draft is not None else s.needs_draft
        return cli_common.Models(settings=s, target=target, draft=draft if with_draft else None,
                                 tokenizer=FakeTokenizer(), vocab_size=V, stop_ids={0}, load_seconds=0.0)

    monkeypatch.setattr(prog, "load_models", load)
    monkeypatch.setattr(cli_common, "load_models", load)  # the interactive commands' late loads (with_draft)
    return target, draft


def test_default_output_has_the_seed_format(fake_models, capsys):
    assert prog.main(["--prompt", "two plus two", "--max-new-tokens", "20"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "> two plus two"
    assert out[1] == "========== Speculative =========="
    assert out[2].startswith("Out: ")
    assert out[3].startswith("Acceptance rate: 0.") or out[3] == "Acceptance rate: 1.000"
    assert out[4].startswith("Throughput: ") and out[4].endswith(" tokens/s")
    assert out[5] == "=========== Target AR ==========="
    assert out[6] == out[2]  # greedy: the same text
    assert out[7].startswith("Throughput: ")
    assert any(line.startswith("Speedup: ") for line in out[8:])
    assert any(line.startswith("Mean accepted tokens: ") for line in out[8:])
    assert any(line.startswith("Predicted speedup (Leviathan") and "measured" in line for line in out[8:])


def test_cost_model_line_keeps_sub_millisecond_forwards(capsys):
    """GPU forwards take well under a millisecond: the line shows them with 3 significant digits (it printed
    "draft 1 ms, verify 2 ms ... a 1 ms target step" for 0.7 / 1.7 / 1.4 ms before)."""
    from minitorch.generation.stats import GenerationResult, cost_model_speedup

    spec = dict(accepted=30, rounds=10, tau=4.0, token_acceptance=0.9, mean_gamma=4.0, cost_ratio_c=0.5,
                predicted_speedup=1.7, tokens_per_s=900.0, time_draft=40 * 0.000712, draft_forwards=40,
                time_verify=10 * 0.00166, target_forwards=10)
    target = dict(tokens_per_s=700.0, time_verify=40 * 0.00142, target_forwards=40)
    prog.print_comparison(GenerationResult([1], "length", spec), GenerationResult([1], "length", target))
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("Cost model")][0]
    assert "draft 0.712 ms, verify 1.66 ms = 1.17x a 1.42 ms target step" in line
    assert f"{cost_model_speedup(spec, target):.2f}x | measured: 1.29x" in line


def test_json_is_one_object_with_stats(fake_models, capsys):
    from minitorch.generation import NGramDrafter, SamplingConfig, speculative_generate

    assert prog.main(["--prompt", "hi", "--max-new-tokens", "12", "--json", "--temperature", "0.8",
                      "--drafter", "ngram", "--seed", "5", "--draft-budget", "fixed"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    obj = json.loads(out[0])
    # the library called directly with the same settings: the CLI passes temperature, seed, gamma, drafter,
    # stop ids and vocabulary through (seed 5: 12 tokens, drafts partly accepted)
    tok = FakeTokenizer()
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}]))
    ref = speculative_generate(fake_models[0], NGramDrafter(), ids, 12, SamplingConfig(0.8, seed=5), stop_ids={0},
                               gamma=4, vocab_size=V)
    st = obj["spec"]["stats"]
    assert obj["spec"]["tokens"] == ref.tokens and len(ref.tokens) == 12
    assert (st["drafted"], st["accepted"]) == (ref.stats["drafted"], ref.stats["accepted"]) and 0 < st["accepted"] < st["drafted"]
    assert obj["settings"]["drafter"] == "ngram" and obj["settings"]["draft"] is None
    assert "target" in obj and "speedup" in obj


def test_draft_extend_continues_the_models_drafts_by_lookup(fake_models, capsys):
    """--gamma 3 --draft-extend 3: the library's ExtendedDrafter with the model's 3 tokens and gamma 6, sampled
    (the looked-up tokens' q rows are point masses next to the model's rows)."""
    from minitorch.generation import ExtendedDrafter, ModelDrafter, SamplingConfig, speculative_generate

    assert prog.main(["--prompt", "hi", "--max-new-tokens", "24", "--json", "--gamma", "3", "--draft-extend", "3",
                      "--temperature", "0.8", "--seed", "5", "--draft-budget", "fixed"]) == 0
    obj = json.loads(capsys.readouterr().out)
    tok = FakeTokenizer()
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hi"}]))
    ref = speculative_generate(fake_models[0], ExtendedDrafter(ModelDrafter(fake_models[1], V), 3), ids, 24,
                               SamplingConfig(0.8, seed=5), stop_ids={0}, gamma=6, vocab_size=V)
    st = obj["spec"]["stats"]
    assert obj["spec"]["tokens"] == ref.tokens and len(ref.tokens) == 24
    assert (st["drafted"], st["accepted"], st["draft_forwards"]) == (
        ref.stats["drafted"], ref.stats["accepted"], ref.stats["draft_forwards"])
    assert st["drafted"] > 3 * st["target_forwards"]  # more drafts a round than the model's 3: looked up
    assert obj["settings"]["draft_extend"] == 3 and obj["settings"]["gamma"] == 3


def test_stream_prints_the_same_text(fake_models, capsys):
    prog.main(["--prompt", "abc", "--max-new-tokens", "15", "--stream", "--no-baseline"])
    out = capsys.readouterr().out.splitlines()
    prog.main(["--prompt", "abc", "--max-new-tokens", "15", "--no-baseline"])
    ref = capsys.readouterr().out.splitlines()
    assert out[2] == ref[2]
    assert not any("Target AR" in line for line in out)


def test_interactive_commands(fake_models, capsys, monkeypatch):
    lines = iter(["/gamma 3", "/temperature 0.5", "/top-p 2", "/bogus", "/target", "/draft",
                  "/drafter ngram", "/max 8", "hello", "/quit"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    assert prog.main(["--interactive"]) == 0
    out = capsys.readouterr().out
    assert "gamma 3" in out and "temperature 0.5" in out
    assert "error: top_p must be in (0, 1]" in out
    assert "error: unknown command /bogus" in out
    assert "runs: spec, draft" in out and "drafter ngram" in out
    assert "> hello" in out and "Draft AR" in out and "Target AR" not in out


def test_interactive_ctrl_c_twice_quits(fake_models, capsys, monkeypatch):
    events = iter([KeyboardInterrupt, "/settings", KeyboardInterrupt, KeyboardInterrupt, "never read"])

    def fake_input(prompt=""):
        ev = next(events)
        if ev is KeyboardInterrupt:
            raise KeyboardInterrupt
        return ev

    monkeypatch.setattr(builtins, "input", fake_input)
    assert prog.main(["--interactive"]) == 0
    assert next(events) == "never read"
    assert "Ctrl-C again to quit" in capsys.readouterr().out


def test_interactive_ctrl_c_during_generation_returns_to_prompt(fake_models, capsys, monkeypatch):
    lines = iter(["a prompt", "/quit"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(prog, "run_one", interrupted)
    assert prog.main(["--interactive"]) == 0
    assert "interrupted" in capsys.readouterr().out


def _run(*args: str) -> subprocess.CompletedProcess:
    """The demo as a user runs it; PYTHONPATH names this checkout, so the run needs no install (the GPU machine
    runs the tree as copied, without pip install -e)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)


@pytest.mark.parametrize(
    "args, word",
    [
        (["--gamma", "0"], "--gamma"),
        (["--gamma", "two"], "--gamma"),
        (["--draft-vocab", "-1"], "--draft-vocab"),
        (["--draft-extend", "-1"], "--draft-extend"),
        (["--draft-extend", "2", "--drafter", "ngram"], "--drafter model"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--top-k", "-2"], "top_k"),
        (["--drafter", "bigram"], "--drafter"),
        (["--json", "--interactive"], "--json"),
        (["--no-such-flag"], "unrecognized"),
        (["--cpu-activations", "int8", "--backend", "cuda"], "--cpu-activations"),
        (["--cpu-activations", "int4"], "--cpu-activations"),
        (["--adaptive-gamma", "--draft-budget", "cost"], "choose one"),
        (["--draft-tree", "4,4"], "--draft-tree"),
        (["--draft-tree", "4,4,16"], "N <= 15"),
        (["--draft-tree", "2,3,6", "--drafter", "model"], "--drafter head"),
        (["--draft-tree", "2,3,6", "--temperature", "0.7"], "greedy"),
        (["--draft-extend", "2", "--drafter", "ngram"], "--drafter model or head"),
        (["--draft-extend", "2", "--drafter", "head"], "CUDA-graph engine only"),  # on the CPU: not priced yet
        (["--draft-lookup", "4"], "0 (off) to 3"),
        (["--draft-lookup", "2", "--drafter", "model"], "--drafter head"),
        (["--draft-lookup", "2", "--temperature", "0.7"], "greedy only"),
        (["--draft-lookup", "2", "--draft-tree", "2,3,6"], "choose one"),
    ],
)
def test_flag_errors_exit_2_with_one_line(args, word):
    res = _run(*args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0], res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
@pytest.mark.parametrize("dtype", ["auto", "float32"])  # the CUDA-graph path and the generic CUDA backend
def test_backend_cuda_without_a_gpu_is_one_line(dtype):
    res = _run("--backend", "cuda", "--dtype", dtype)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "cuda" in lines[0], res.stderr


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    """Small random Qwen2 folders: a target, a draft with the same tokenizer, one with another."""
    pytest.importorskip("torch")
    from test_models_util import hf_qwen2, save_hf, tiny_bpe

    root = tmp_path_factory.mktemp("cli_models")
    save_hf(hf_qwen2(seed=0), root / "target", tiny_bpe())
    save_hf(hf_qwen2(seed=1, hidden_size=32, intermediate_size=48, num_hidden_layers=1), root / "draft", tiny_bpe())
    save_hf(hf_qwen2(seed=2, vocab_size=303), root / "other", tiny_bpe(vocab_size=300))
    return root


def test_small_models_end_to_end(model_folders):
    res = _run("--target", str(model_folders / "target"), "--draft", str(model_folders / "draft"),
               "--max-new-tokens", "16", "--prompt", "Tom has 3 apples.", "--json")
    assert res.returncode == 0, res.stderr
    obj = json.loads(res.stdout)
    assert obj["spec"]["tokens"] == obj["target"]["tokens"]  # greedy: lossless


@pytest.mark.parametrize(
    "make_args, word",
    [
        (lambda r: ["--target", str(r / "missing")], "missing"),
        (lambda r: ["--target", "no-such-model-name"], "no-such-model-name"),
        (lambda r: ["--target", str(r / "target"), "--draft", str(r / "other")], "tokenizers differ"),
        (lambda r: ["--target", str(r / "target"), "--draft", str(r / "draft"), "--prompt", "word " * 300],
         "context"),
    ],
)
def test_model_errors_exit_2_with_one_line(model_folders, make_args, word):
    res = _run(*make_args(model_folders), "--max-new-tokens", "8")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0], res.stderr
    assert "Traceback" not in res.stderr


# ----------------------------------------------------------------------------- warm-up coverage

def _record_kernel_calls(monkeypatch) -> set[str]:
    """Replace every numba kernel of the CPU backend's modules by a wrapper that records its name, so a test
    sees which kernels a run calls (the backend looks them up on the module at call time). Private kernels (a
    leading underscore) are called from other kernels' compiled code, not from Python: wrapping one would make
    numba fail to type a caller compiled after the patch, so they stay as they are."""
    import importlib

    from numba.core.registry import CPUDispatcher

    called: set[str] = set()
    for name in ("fused", "kernels", "matmul", "packed"):
        mod = importlib.import_module(f"minitorch.cpu.{name}")
        for attr, fn in list(vars(mod).items()):
            if isinstance(fn, CPUDispatcher) and not attr.startswith("_"):
                def wrapper(*a, _fn=fn, _key=f"{name}.{attr}", **k):
                    called.add(_key)
                    return _fn(*a, **k)
                monkeypatch.setattr(mod, attr, wrapper)
    return called


@pytest.mark.parametrize("warm_tokens", [None, 24])
def test_warm_up_runs_every_kernel_the_timed_runs_call(model_folders, monkeypatch, warm_tokens):
    """The demo times warm code only: every CPU kernel that the timed speculative and target-alone runs call
    (so every numba compilation they could trigger) was already called by warm_up. The threaded attention
    is made to start at a 100-token prefill, as a 1.5B model's does near 74 tokens (PARALLEL_ATTENTION_WORK),
    and the prompt has 110 tokens. With the old 24-token warm-up (warm_tokens=24) the threaded attention
    first runs inside the timed speculative run: a fresh clone's first demo paid its compilation there."""
    from minitorch.cpu import ops as cpu_ops
    from minitorch.generation import engine as engine_mod
    from project.settings import Settings

    settings = Settings(target=str(model_folders / "target"), draft=str(model_folders / "draft"), drafter="model")
    models = cli_common.load_models(settings, progress=False)
    cfg = models.target.config
    d = cfg.hidden_size // cfg.num_attention_heads
    monkeypatch.setattr(cpu_ops, "PARALLEL_ATTENTION_WORK", cfg.num_attention_heads * d * 100 * 100)
    if warm_tokens is not None:
        monkeypatch.setattr(engine_mod, "WARM_PROMPT_TOKENS", warm_tokens)
    called = _record_kernel_calls(monkeypatch)
    prompt = [3 + (7 * i) % 300 for i in range(110)]
    engine = models.engine()
    engine.warm_up(prompt)
    warmed = set(called)
    called.clear()
    engine.generate(prompt, 12)
    engine.alone().generate(prompt, 12)
    assert "fused.attention_parallel" in called  # the timed runs do take the threaded attention
    missed = called - warmed
    if warm_tokens is None:
        assert not missed, f"kernels first called in a timed run: {sorted(missed)}"
    else:
        assert "fused.attention_parallel" in missed


@pytest.mark.parametrize(
    "flags, want",
    [
        ([], (4, 0)),  # the CPU: no lookup (it did not pay there)
        (["--backend", "cuda"], (3, 4)),  # the CUDA-graph path: 3 model tokens + 4 looked up
        (["--backend", "cuda", "--gamma", "5"], (5, 4)),
        (["--backend", "cuda", "--draft-extend", "0"], (4, 0)),
        (["--backend", "cuda", "--draft-extend", "2"], (4, 2)),
        (["--backend", "cuda", "--drafter", "head", "--draft-extend", "3"], (6, 3)),  # the head's gamma, then lookup
        (["--backend", "cuda", "--drafter", "head"], (6, 0)),  # no lookup unless asked
        (["--backend", "cuda", "--gpu-gemv", "ours"], (4, 0)),  # 8 verify rows are dear in our CUDA-core GEMV
        (["--backend", "cuda", "--adaptive-gamma"], (4, 0)),
        (["--backend", "cuda", "--drafter", "ngram"], (4, 0)),
        (["--backend", "cuda", "--dtype", "float32"], (4, 0)),  # not the graph decoders
    ],
)
def test_gamma_and_draft_extend_defaults(flags, want):
    """resolve_settings leaves --gamma / --draft-extend unset until the drafter is decided; for_head then fills them
    per drafter and engine (settings.default_gamma / default_extend), and the namespace is never written."""
    from project.settings import resolve_settings

    args = prog.build_parser().parse_args(flags)
    before = dict(vars(args))
    s = resolve_settings(args)
    assert (s.gamma is None) == ("--gamma" not in flags)  # unset until the drafter is known
    assert vars(args) == before
    r = s.for_head(None)
    assert (r.gamma, r.extend) == want


@pytest.mark.parametrize("flags, word", [
    (["--draft-tree", "9,3,12"], "K <= 8"),  # the GPU's top-k lists
    (["--draft-tree", "3,4,3"], "N >= D"),  # a chain of D, then alternatives
    (["--draft-tree", "3,4,12", "--gpu-gemv", "ours"], "tensor-core"),
    (["--draft-tree", "3,4,12", "--fast-verify"], "tensor-core"),
    (["--draft-tree", "3,4,12", "--drafter", "head", "--draft-extend", "2"], "choose one"),
])
def test_gpu_tree_flags_are_checked_before_loading(flags, word):
    from project.settings import UserError, resolve_settings

    with pytest.raises(UserError, match=word):
        resolve_settings(prog.build_parser().parse_args(["--backend", "cuda", *flags]))
    assert resolve_settings(prog.build_parser().parse_args(["--backend", "cuda", "--draft-tree", "3,4,12"])).tree == (
        3, 4, 12)


@pytest.mark.parametrize("flags, want", [
    ([], "cost"),  # the CPU engine drafts by its measured costs
    (["--draft-budget", "fixed"], False),
    (["--adaptive-gamma"], True),
    (["--backend", "cuda", "--drafter", "head"], "cost"),  # the CUDA-graph engine: measured for a head's chain
    (["--backend", "cuda", "--drafter", "head", "--draft-budget", "fixed"], False),
    (["--backend", "cuda", "--drafter", "head", "--draft-tree", "3,4,12"], False),  # unmeasured shapes: fixed
    (["--backend", "cuda", "--drafter", "head", "--draft-extend", "2"], False),
    (["--backend", "cuda", "--drafter", "model"], False),
    (["--backend", "cuda", "--drafter", "model", "--draft-budget", "cost"], "cost"),  # asked for by name
    (["--backend", "cuda", "--dtype", "float32"], "cost"),  # the eager CUDA backend runs the CPU engine's loop
])
def test_draft_budget_defaults(flags, want):
    from project.settings import resolve_settings

    assert resolve_settings(prog.build_parser().parse_args(flags)).adaptive == want


@pytest.mark.parametrize("flags, head, want", [
    ([], True, "cost"),  # --drafter auto decided for the cache's head
    ([], False, False),  # ... for the draft model: its fixed gamma and looked-up tokens
    (["--draft-budget", "fixed"], True, False),
    (["--adaptive-gamma"], True, True),
])
def test_the_cuda_graph_budget_is_decided_with_the_drafter(flags, head, want, tmp_path):
    from project.settings import resolve_settings

    s = resolve_settings(prog.build_parser().parse_args(["--backend", "cuda", *flags]))
    assert s.adaptive is (True if want is True else False)  # nothing decided before the drafter is known
    s = s.for_head(tmp_path if head else None)
    assert (s.drafter, s.adaptive) == ("head" if head else "model", want)
    assert s.extend == (0 if head or want else 4)


def _fake_packed_loads(monkeypatch) -> list:
    """load_model / check_compatible faked for load_models: each load gives a model of one packed weight, every such
    weight is appended to the list returned, so a test sees the activation mode each model was given."""
    from types import SimpleNamespace

    import minitorch.models as models

    weights = []

    def fake_load(name, **kwargs):
        ws = [SimpleNamespace(activations=None)]
        weights.extend(ws)
        return (SimpleNamespace(packed_weights=lambda: ws, config=SimpleNamespace(vocab_size=10)),
                SimpleNamespace(vocab_size=10, stop_token_ids=[0]))

    monkeypatch.setattr(models, "load_model", fake_load)
    monkeypatch.setattr(models, "check_compatible", lambda a, b: None)
    return weights


@pytest.mark.parametrize("flag, want", [(None, None), ("float32", "float32")])
def test_load_models_sets_the_mode_only_when_asked(monkeypatch, flag, want):
    """Settings without cpu_activations (project/bench/llama_cpp.py, which switches the process-wide mode for its int8
    runs) give models that follow the process's mode; a program's flag gives them their own."""
    from project.settings import Settings

    weights = _fake_packed_loads(monkeypatch)
    s = Settings(target="t", draft="d", drafter="model", dtype="float32", draft_quant="file", cpu_activations=flag)
    cli_common.load_models(s, need_draft=True, progress=False)
    assert [w.activations for w in weights] == [want, want]


@pytest.mark.parametrize("backend, supported, want", [("cpu", True, "int8"), ("cpu", False, "float32"),
                                                       ("cuda", True, "float32")])
def test_auto_activations_are_int8_on_a_cpu_with_the_instructions(monkeypatch, backend, supported, want):
    """--cpu-activations auto (the default): int8 on a CPU with AVX2 or AVX512-VNNI, else float32, and float32 on
    the GPU; the settings say what runs; int8 asked for on the GPU, or on a CPU without the instructions, is refused."""
    from minitorch.cpu import packed as fast_packed
    from project.settings import UserError, resolve_settings

    monkeypatch.setattr(fast_packed, "int8_supported", lambda: supported)
    assert resolve_settings(prog.build_parser().parse_args(["--backend", backend])).cpu_activations == want
    with pytest.raises(UserError, match="for --backend cpu"):
        resolve_settings(prog.build_parser().parse_args(["--backend", "cuda", "--cpu-activations", "int8"]))
    if not supported:
        with pytest.raises(UserError, match="AVX2"):
            resolve_settings(prog.build_parser().parse_args(["--cpu-activations", "int8"]))


def test_the_default_activations_reach_the_models(monkeypatch):
    """No --cpu-activations flag on the command line: the parsed default (auto) reaches the loaded models as the
    mode it resolved to."""
    from minitorch.cpu import packed as fast_packed
    from project.settings import resolve_settings

    monkeypatch.setattr(fast_packed, "int8_supported", lambda: True)
    weights = _fake_packed_loads(monkeypatch)
    s = resolve_settings(prog.build_parser().parse_args(["--drafter", "model", "--dtype", "float32",
                                                         "--draft-quant", "file"]))
    cli_common.load_models(s, need_draft=True, progress=False)
    assert [w.activations for w in weights] == ["int8", "int8"]


def test_cpu_activations_sets_the_models_own_mode():
    """--cpu-activations reaches the loaded models' packed weights (set_weight_activations), not the process-wide
    mode that in-process callers and other models use; no models, no change."""
    from types import SimpleNamespace

    from minitorch import FastBackend
    from minitorch.cpu import packed as fast_packed

    weights = [SimpleNamespace(activations=None) for _ in range(3)]
    model = SimpleNamespace(packed_weights=lambda: weights)
    cli_common.set_cpu_activations("int8", FastBackend)
    assert [w.activations for w in weights] == [None] * 3
    cli_common.set_cpu_activations("int8", FastBackend, [model])
    assert [w.activations for w in weights] == ["int8"] * 3
    assert fast_packed.get_activations() == "float32"
    cli_common.set_cpu_activations("float32", FastBackend, [model])
    assert [w.activations for w in weights] == ["float32"] * 3


@pytest.mark.parametrize("flags, head, want, least", [
    ([], True, 2, 256),  # the CPU's default: in prompts of 256 tokens or more (settings.HEAD_LOOKUP_CPU*)
    (["--backend", "cuda"], True, 2, 0),  # the CUDA-graph engine's (HEAD_LOOKUP_GPU): in every prompt
    (["--backend", "cuda", "--dtype", "float32"], True, 2, 256),  # the eager engine on a GPU: the CPU's default
    (["--backend", "cuda", "--temperature", "0.7"], True, 0, 0),
    (["--backend", "cuda", "--draft-tree", "2,3,6"], True, 0, 0),
    (["--draft-lookup", "2"], True, 2, 0),  # given: in every prompt
    (["--draft-lookup", "0"], True, 0, 0),
    (["--draft-lookup", "3", "--backend", "cuda"], True, 3, 0),
    (["--temperature", "0.7"], True, 0, 0),  # greedy rounds only
    (["--draft-tree", "2,3,6"], True, 0, 0),
    ([], False, 0, 0),  # auto without a head: the draft model, no lookup
])
def test_draft_lookup_is_decided_with_the_drafter_and_recorded(flags, head, want, least, tmp_path):
    """--draft-lookup stays unset until the drafter is known (for_head); a head's chains take it, it is on every
    result line when on (with the shortest prompt it runs in, where the CPU's default limits it), asking for it where
    auto finds no head is one line."""
    from project.settings import UserError, resolve_settings

    s = resolve_settings(prog.build_parser().parse_args(flags))
    assert s.lookup == (int(flags[1]) if flags[:1] == ["--draft-lookup"] else None)
    if not head and flags:
        with pytest.raises(UserError, match="--draft-lookup"):
            s.for_head(None)
        return
    r = s.for_head(tmp_path if head else None)
    assert r.drafter == ("head" if head else "model") and (r.lookup, r.lookup_min_prompt) == (want, least)
    assert r.record().get("draft_lookup") == (want or None)
    assert r.record().get("draft_lookup_min_prompt") == (least or None)


def test_draft_lookup_without_a_head_found_is_one_line(tmp_path):
    from project.settings import UserError, resolve_settings

    s = resolve_settings(prog.build_parser().parse_args(["--draft-lookup", "2"]))
    with pytest.raises(UserError, match="none is found"):
        s.for_head(None)

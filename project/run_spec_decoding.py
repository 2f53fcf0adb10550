"""Speculative decoding demo: the draft proposes, the target verifies, the output is the target's.

    python project/run_spec_decoding.py                      default pair, built-in prompt, then target alone
    python project/run_spec_decoding.py --prompt "..." --gamma 6 --temperature 0.7 --top-p 0.9
    python project/run_spec_decoding.py --drafter ngram      prompt lookup instead of a draft model
    python project/run_spec_decoding.py --interactive        a prompt loop (/help lists the commands)
    python project/run_spec_decoding.py --json               one machine-readable result object

The default pair (Qwen2.5-Coder 1.5B target, 0.5B draft) is fetched and cached the first time.
A user error ends with one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any


from minitorch.generation import GenerationResult, SamplingConfig
from minitorch.generation.autoregressive import check_request
from minitorch.generation.stats import cost_model_speedup, forward_times
from project.cli_common import Models, encode_prompt, load_models, run_cli, with_draft
from project.one_line_parser import OneLineParser
from project.settings import UserError, add_engine_args, resolve_settings

DEFAULT_PROMPT = (
    "A bakery sells muffins for $3 each and cookies for $2 each. On Monday it sold 48 muffins and "
    "twice as many cookies. How much money did the bakery make on Monday? Think step by step."
)
RULES = {
    "spec": "========== Speculative ==========",
    "target": "=========== Target AR ===========",
    "draft": "=========== Draft AR ============",
}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="run_spec_decoding.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the prompt (default: a built-in reasoning problem)")
    add_engine_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--no-baseline", action="store_true", help="skip the target-alone run (and the speedup)")
    o.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap the prompt in the target's chat template (default on)")
    o.add_argument("--stream", action="store_true", help="print tokens as they are accepted")
    o.add_argument("--interactive", action="store_true",
                   help="a prompt loop with commands (/help): toggle speculative/target/draft runs, "
                        "change gamma and sampling, /quit")
    o.add_argument("--json", action="store_true", help="print one JSON object with texts, tokens and statistics")
    return p


@dataclass
class Session:
    """What the demo runs (from the resolved settings); the interactive commands change it."""

    cfg: SamplingConfig
    gamma: int
    adaptive: bool | str  # True: adaptive gamma; "cost": the draft budget (0..gamma a round by measured costs)
    drafter: str
    max_new_tokens: int
    chat: bool
    stream: bool
    runs: dict[str, bool] = field(default_factory=lambda: {"spec": True, "target": True, "draft": False})

    def describe(self) -> str:
        on = ", ".join(k for k, v in self.runs.items() if v) or "nothing"
        c = self.cfg
        return (f"runs: {on} | drafter {self.drafter}, gamma {self.gamma}"
                f"{' (cost budget: up to gamma a round)' if self.adaptive == 'cost' else ' (adaptive)' if self.adaptive else ''}"
                f" | temperature {c.temperature}, top-k {c.top_k}, "
                f"top-p {c.top_p}, seed {c.seed} | max-new-tokens {self.max_new_tokens} | "
                f"chat {'on' if self.chat else 'off'}, stream {'on' if self.stream else 'off'}")


class StreamPrinter:
    """Prints the decoded text as tokens arrive (decoding the whole output keeps multi-byte text right)."""

    def __init__(self, tok: Any, stop_ids: set[int]) -> None:
        self.tok, self.stop_ids = tok, stop_ids
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, new: list[int]) -> None:
        self.ids.extend(new)
        text = decode(self.tok, self.ids, self.stop_ids)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for its next byte
            return
        if text.startswith(self.shown):
            sys.stdout.write(text[len(self.shown):])
            sys.stdout.flush()
            self.shown = text


def decode(tok: Any, ids: list[int], stop_ids: set[int]) -> str:
    """Output text without the stop token."""
    return tok.decode([t for t in ids if t not in stop_ids])


def session_engine(models: Models, s: Session) -> Any:
    """The engine of the session's drafter, gamma and sampling (minitorch/generation/engine.py)."""
    return models.engine(s.drafter, s.gamma, s.cfg, s.adaptive)


def run_one(kind: str, models: Models, s: Session, ids: list[int], on_tokens: Any = None) -> GenerationResult:
    """One generation: "spec" (speculative), "target" or "draft" (autoregressive)."""
    if kind == "draft" and models.draft is None:
        raise UserError("no draft model is loaded: use --drafter model for draft runs")
    engine = models.engine("none" if kind != "spec" else s.drafter, s.gamma, s.cfg, s.adaptive)
    if kind == "draft":
        engine = engine.alone(models.draft)
    return engine.generate(ids, s.max_new_tokens, on_tokens=on_tokens)


def print_section(kind: str, res: GenerationResult, text: str, streamed: bool) -> None:
    if not streamed:
        print(f"Out: {text}")
    st = res.stats
    if kind == "spec":
        print(f"Acceptance rate: {st['alpha']:.3f}")
    print(f"Throughput: {st['tokens_per_s']:.1f} tokens/s")


def print_comparison(spec: GenerationResult, target: GenerationResult | None) -> None:
    st = spec.stats
    mean_acc = st["accepted"] / st["rounds"] if st["rounds"] else 0.0
    print("=================================")
    measured = None
    if target is not None and target.stats["tokens_per_s"] > 0:
        measured = st["tokens_per_s"] / target.stats["tokens_per_s"]
        print(f"Speedup: {measured:.2f}x")
    print(f"Mean accepted tokens: {mean_acc:.2f} per round (tau {st['tau']:.2f} tokens per target forward)")
    line = (f"Predicted speedup (Leviathan: alpha={st['token_acceptance']:.3f}, gamma={st['mean_gamma']:.1f}, "
            f"c={st['cost_ratio_c']:.3f}): {st['predicted_speedup']:.2f}x")
    print(line + (f" | measured: {measured:.2f}x" if measured is not None else ""))
    model_pred = cost_model_speedup(st, target.stats) if target is not None else None
    if model_pred is not None:
        t_draft, t_verify, t_step = forward_times(st, target.stats)
        ms = lambda t: f"{t * 1e3:.3g} ms"  # noqa: E731  (3 significant digits: GPU steps are below 1 ms)
        print(f"Cost model with measured forwards (draft {ms(t_draft)}, verify {ms(t_verify)} = "
              f"{t_verify / t_step:.2f}x a {ms(t_step)} target step): {model_pred:.2f}x | measured: {measured:.2f}x")


def run_prompt(models: Models, s: Session, prompt: str, as_json: bool = False) -> dict[str, Any]:
    """Run the enabled generations on one prompt; print them (seed format) unless as_json."""
    ids = encode_prompt(models.tokenizer, prompt, s.chat)
    results: dict[str, GenerationResult] = {}
    texts: dict[str, str] = {}
    if not as_json:
        print(f"> {prompt}")
    for kind in ("spec", "target", "draft"):
        if not s.runs[kind]:
            continue
        streamer = None
        if not as_json:
            print(RULES[kind])
            if s.stream:
                streamer = StreamPrinter(models.tokenizer, models.stop_ids)
                sys.stdout.write("Out: ")
                sys.stdout.flush()
        res = run_one(kind, models, s, ids, streamer)
        results[kind] = res
        texts[kind] = decode(models.tokenizer, res.tokens, models.stop_ids)
        if not as_json:
            if streamer is not None:
                print()
            print_section(kind, res, texts[kind], streamer is not None)
    if not as_json and "spec" in results:
        print_comparison(results["spec"], results.get("target"))
    out: dict[str, Any] = {"prompt": prompt, "prompt_tokens": len(ids)}
    for kind, res in results.items():
        out[kind] = {"text": texts[kind], "tokens": res.tokens, "stop_reason": res.stop_reason, "stats": res.stats}
    if "spec" in results and "target" in results and results["target"].stats["tokens_per_s"] > 0:
        out["speedup"] = results["spec"].stats["tokens_per_s"] / results["target"].stats["tokens_per_s"]
    return out

HELP = """commands (anything else is a prompt):
  /spec, /target, /draft      toggle the speculative, target-alone and draft-alone runs
  /gamma N   /adaptive        draft length; cycle the draft budget: fixed, adaptive gamma, cost
  /drafter model|ngram        who drafts (the draft model is loaded on first use)
  /temperature X  /top-k K  /top-p P  /seed S  /max N     sampling and length
  /stream  /chat              toggle streaming output and the chat template
  /settings  /help  /quit     (Ctrl-C stops a generation; twice at the prompt quits)"""


def apply_command(line: str, models: Models, s: Session) -> tuple[bool, Models]:
    """Apply one /command to the session; (False, ...) means quit. Bad values raise ValueError. Returns the models
    too: /draft and /drafter model load the draft model on first use."""
    name, _, value = line[1:].strip().partition(" ")
    value = value.strip()
    cfg = s.cfg
    if name in ("quit", "exit", "q"):
        return False, models
    if name in ("spec", "target", "draft"):
        if name == "draft" and models.draft is None and not s.runs["draft"]:
            models = ensure_draft(models, s)
        s.runs[name] = not s.runs[name]
    elif name == "gamma":
        if not value.isdigit() or int(value) < 1:
            raise UserError(f"/gamma needs an integer >= 1, got {value!r}")
        s.gamma = int(value)
    elif name == "adaptive":
        s.adaptive = {False: True, True: "cost", "cost": False}[s.adaptive]
    elif name == "drafter":
        if value not in ("model", "ngram", "head"):
            raise UserError(f"/drafter takes model, ngram or head, got {value!r}")
        if value == "head" and models.head is None:
            raise UserError("/drafter head needs a head loaded at start (--drafter head)")
        if value == "model":
            models = ensure_draft(models, s)
        s.drafter = value
    elif name in ("temperature", "top-k", "top-p", "seed", "max"):
        try:
            num = float(value) if name in ("temperature", "top-p") else int(value)
        except ValueError:
            raise UserError(f"/{name} needs a number, got {value!r}") from None
        if name == "max":
            if num < 1:
                raise UserError(f"/max needs an integer >= 1, got {value}")
            s.max_new_tokens = int(num)
        else:
            key = {"temperature": "temperature", "top-k": "top_k", "top-p": "top_p", "seed": "seed"}[name]
            fields = {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p, "seed": cfg.seed}
            fields[key] = num
            s.cfg = SamplingConfig(**fields)
    elif name == "stream":
        s.stream = not s.stream
    elif name == "chat":
        s.chat = not s.chat
    elif name == "help":
        print(HELP)
        return True, models
    elif name != "settings":
        raise UserError(f"unknown command /{name} (try /help)")
    print(s.describe())
    return True, models


def ensure_draft(models: Models, s: Session) -> Models:
    """The models with the draft model loaded (the first time a command needs it), its paths warmed up."""
    if models.draft is None:
        models = with_draft(models)
        models.engine("model", s.gamma, s.cfg, s.adaptive).warm_up()
    return models


def interactive_loop(models: Models, s: Session) -> int:
    """Prompts in a loop. Ctrl-C during a generation returns to the prompt; twice in a row quits."""
    print(HELP)
    print(s.describe())
    interrupts = 0
    while True:
        try:
            line = input("\n>>> ").strip()
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts >= 2:
                print()
                return 0
            print("\n(Ctrl-C again to quit)")
            continue
        except EOFError:
            print()
            return 0
        interrupts = 0
        if not line:
            continue
        try:
            if line.startswith("/"):
                go_on, models = apply_command(line, models, s)
                if not go_on:
                    return 0
            else:
                run_prompt(models, s, line)
        except KeyboardInterrupt:
            interrupts = 1
            print("\n(interrupted; Ctrl-C again to quit)")
        except ValueError as e:
            print(f"error: {' '.join(str(e).split())}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.json and (args.stream or args.interactive):
        raise UserError("--json cannot be combined with --stream or --interactive")
    models = load_models(resolve_settings(args), progress=not args.json)  # decides --drafter auto, the head's gamma
    st = models.settings
    s = Session(cfg=st.sampling, gamma=st.gamma, adaptive=st.adaptive, drafter=st.drafter,
                max_new_tokens=st.max_new_tokens, chat=args.chat, stream=args.stream)
    s.runs["target"] = not args.no_baseline
    if args.interactive:
        session_engine(models, s).warm_up()
        print(f"[loaded {st.target}" + (f" + {st.draft}" if models.draft is not None else "")
              + f" in {models.load_seconds:.1f} s]")
        return interactive_loop(models, s)
    ids = encode_prompt(models.tokenizer, args.prompt, s.chat)
    check_request(models.target, ids, s.max_new_tokens)  # a prompt too long fails before the warm-up
    warm = session_engine(models, s).warm_up(ids)
    if not args.json:
        print(f"[warm-up {warm:.1f} s: every generation path run once briefly (first-run compilation, weights "
              "paged in), not part of the timings below]", file=sys.stderr)
    out = run_prompt(models, s, args.prompt, as_json=args.json)
    if args.json:
        out["settings"] = {"target": st.target, "draft": st.draft if models.draft is not None else None,
                           "drafter": s.drafter, "gamma": s.gamma, "draft_extend": st.extend,
                           "adaptive_gamma": s.adaptive,
                           "max_new_tokens": s.max_new_tokens, "temperature": s.cfg.temperature,
                           "top_k": s.cfg.top_k, "top_p": s.cfg.top_p, "seed": s.cfg.seed, "chat": s.chat,
                           "backend": st.backend, "dtype": st.dtype,
                           "load_seconds": models.load_seconds, "warmup_seconds": warm}
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    run_cli(main)

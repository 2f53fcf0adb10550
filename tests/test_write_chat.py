"""project/write_chat.py: requests of every category, Magpie's template prefix, what is kept of a request, both steps
end to end on a tiny random target (records, resume, two turns), and the trainer taking the conversations with no
evaluation question among them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
from project import write_chat as wc  # noqa: E402
from test_write_problems import tiny  # noqa: E402,F401  (the tiny random target folder, a fixture)


class Template:
    """The Qwen2.5 chat template's shape: a default system turn, im_start / im_end around each turn."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        if not messages or messages[0]["role"] != "system":
            messages = [{"role": "system", "content": "You are a helpful assistant."}] + list(messages)
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_items_cycle_through_every_category_and_its_topics():
    items = [f for _, f in wc.request_items(3 * len(wc.CATEGORIES))]
    assert [f["category"] for f in items[:len(wc.CATEGORIES)]] == list(wc.CATEGORIES)
    first_writing = [f["topic"] for f in items if f["category"] == "writing"]
    assert first_writing == list(wc.CATEGORIES["writing"][:3])  # a category's next item takes its next topic
    assert list(wc.request_items(2, start=4)) == list(wc.request_items(6))[4:]


def test_text_items_cycle_through_the_text_tasks_with_seeded_subjects():
    items = [f for _, f in wc.text_items(40, start=1000000)]
    kinds = list(wc.TEXT_TASKS)
    assert [f["category"] for f in items] == [kinds[i % len(kinds)] for i in range(1000000, 1000040)]
    assert all(f["topic"] in wc.SUBJECTS and f["words"] in wc.WORDS for f in items)
    assert len({f["topic"] for f in items}) > 20  # drawn, not one subject a kind
    assert list(wc.text_items(3, start=1000005)) == list(wc.text_items(8, start=1000000))[5:]  # by index alone


def test_text_items_of_chosen_kinds_keep_each_index_draws_and_the_default_cycle():
    # --kinds translation: every item a translation; an index draws the same subject and form whatever the kinds
    # (the generator is seeded by the index alone), and the default is the cycle data/texts was written with
    every = list(wc.text_items(10, start=2000000))
    only = list(wc.text_items(10, start=2000000, kinds=["translation"]))
    assert [f["category"] for _, f in only] == ["translation"] * 10
    assert [(i, {k: v for k, v in f.items() if k != "category"}) for i, f in only] == \
        [(i, {k: v for k, v in f.items() if k != "category"}) for i, f in every]
    assert every == list(wc.text_items(10, start=2000000, kinds=list(wc.TEXT_TASKS)))
    two = [f["category"] for _, f in wc.text_items(4, start=7, kinds=["qa", "translation"])]
    assert two == ["translation", "qa", "translation", "qa"]  # kind i mod len(kinds), like the default


@pytest.mark.parametrize("flags, message", [
    (["--kinds", "poetry"], "--kinds takes summarization, translation"),
    (["--kinds", ","], "got none"),
    (["--kinds", "translation", "--style", "topics"], "--kinds chooses among --style texts' tasks"),
])
def test_kinds_flag_errors_are_one_line(tmp_path, flags, message):
    with pytest.raises(wc.UserError, match=message):
        wc.parse_args(["requests", "--style", "texts", "-o", str(tmp_path / "r.jsonl")] + flags)


def test_the_committed_texts_requests_are_the_default_cycle():
    # data/texts was written before --kinds existed: the default must still give its items' kinds and subjects
    from project.evaluation.data import read_json_rows
    data = Path(__file__).resolve().parents[1] / "data/texts"
    rows = read_json_rows(data / "requests_1000000-1004999_coder1.5b_sampled.jsonl.gz")
    first = {r["index"]: r for r in rows if r["index"] < 1000040}
    items = dict(wc.text_items(40, start=1000000))
    assert len(first) == 40
    for i, r in first.items():
        f = items[f"chat-{i}"]
        assert (r["category"], r["topic"], r["sentences"]) == (f["category"], f["topic"], f["sentences"])


class CharTok(Template):
    """A tokenizer of one id a character, with the chat template's shape."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class Res:
    def __init__(self, text, stop_reason="stop"):
        self.tokens, self.stop_reason = [ord(c) for c in text], stop_reason


def _drive(job, answers):
    """Run a job on the given results in turn: (the prompts it asked, its seeds, what it returned)."""
    prompts, seeds = [], []
    try:
        req = next(job)
        for a in answers:
            prompts.append("".join(chr(i) for i in req[0]))
            seeds.append(req[2])
            req = job.send(a)
    except StopIteration as stop:
        return prompts, seeds, stop.value
    raise AssertionError("the job asked for more generations than given")


def test_a_texts_request_is_the_benchmarks_task_around_the_text_the_target_wrote():
    tok = CharTok()
    item = {"index": 7, "category": "summarization", "topic": "glaciers", "words": 250, "sentences": "one sentence",
            "document": "a memo", "instruction": "List the points."}
    article = "Glaciers are retreating across the Alps, scientists said on Monday."
    prompts, seeds, (rec, n) = _drive(wc.text_request_job(tok, item, 700, seed0=3), [Res(article + "<|im_end|>")])
    assert "news article of about 250 words about glaciers" in prompts[0] and prompts[0].endswith("assistant\n")
    assert seeds == [10] and rec["question"] == "Summarize: " + article and rec["style"] == "texts"
    assert n == len(article) + len("<|im_end|>") and "raw" not in rec
    # passages: a second generation asks for a question about them; the request is the passages, then the question
    item = {**item, "category": "passages"}
    passages = "The Danube flows through ten countries.\n\nIt ends in the Black Sea."
    prompts, seeds, (rec, n) = _drive(wc.text_request_job(tok, item, 700), [Res(passages), Res("Where does it end?")])
    assert seeds == [7, 8] and passages in prompts[1] and rec["question"] == passages + "\nWhere does it end?"
    # translation and extraction: their templates
    item = {**item, "category": "translation"}
    _, _, (rec, _) = _drive(wc.text_request_job(tok, item, 700), [Res("Der Zug kommt heute sehr spät an.")])
    assert rec["question"] == "Translate German to English: Der Zug kommt heute sehr spät an."
    item = {**item, "category": "extraction"}
    _, _, (rec, _) = _drive(wc.text_request_job(tok, item, 700), [Res("Meeting on May 3 with Ana and Li.")])
    assert rec["question"] == "List the points.\n\nMeeting on May 3 with Ana and Li."
    # a text cut at the limit, or a question that is an evaluation question word for word, is not kept
    _, _, (rec, _) = _drive(wc.text_request_job(tok, {**item, "category": "qa"}, 700),
                            [Res("who wrote the", "length")])
    assert rec["question"] is None and rec["raw"] == "who wrote the"
    from project.evaluation.data import load_problems
    qa = next(p for p in load_problems("spec_bench") if p.category == "qa").turns[0]
    _, _, (rec, _) = _drive(wc.text_request_job(tok, {**item, "category": "qa"}, 700), [Res(qa)])
    assert rec["question"] is None and rec["raw"] == qa


def test_magpie_prefix_stops_where_the_users_message_starts():
    tok = Template()
    assert wc.user_prefix(tok, []) == "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    assert wc.user_prefix(tok, convo).endswith("<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n")
    assert wc.request_prompt(tok, "magpie", "coding", "x") == wc.user_prefix(tok, [])
    summary = wc.request_prompt(tok, "topics", "summarization", "a news article")
    assert "Kind: summarization" in summary and wc.TEXT_NOTE.strip() in summary and summary.endswith("assistant\n")
    assert wc.TEXT_NOTE.strip() not in wc.request_prompt(tok, "topics", "coding", "a SQL query")


@pytest.mark.parametrize("raw, kept", [
    ('"Can you write a haiku about autumn leaves?"<|im_end|>', "Can you write a haiku about autumn leaves?"),
    ("Explain recursion to a child.<|im_end|><|im_start|>assistant", "Explain recursion to a child."),
    ("Hi", None),
    ("x" * 5000, None),
])
def test_what_is_kept_of_a_request(raw, kept):
    assert wc.clean_request(raw) == kept


def _run(tiny: Path, *argv: str) -> None:
    assert wc.main([*argv, "--target", str(tiny / "t"), "--drafter", "ngram", "--no-progress"]) == 0


def test_requests_then_answers_end_to_end_resume_and_training(tiny, tmp_path, monkeypatch):
    """The real engine on a tiny random target: requests (ids, categories, seeds, resume), then answers. A random
    target's requests rarely end inside the limit, so kept ones are planted in the requests file (as a real target's
    look); the answers step and the trainer then run on them as they would."""
    req = tmp_path / "requests.jsonl"
    _run(tiny, "requests", "--n", "3", "-o", str(req), "--max-new-tokens", "8")
    rows = [json.loads(line) for line in req.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["chat-0", "chat-1", "chat-2"]
    assert [r["category"] for r in rows] == list(wc.CATEGORIES)[:3] and all(r["style"] == "topics" for r in rows)
    assert all(r["seed"] == r["index"] for r in rows)  # --seed 0 + the item's index
    _run(tiny, "requests", "--n", "4", "-o", str(req), "--max-new-tokens", "8", "--resume")
    assert len(req.read_text().splitlines()) == 4  # the three from before are not written again
    # what a real target's kept requests look like (a random one's rarely stop)
    planted = tmp_path / "kept.jsonl"
    planted.write_text("".join(json.dumps({**r, "question": q}) + "\n" for r, q in zip(
        rows, ["Write a limerick about a cat.", "Pretend you are a pirate and greet me.", "Which is heavier, a kilo "
               "of feathers or a kilo of steel?"])))
    ans = tmp_path / "answers.jsonl"
    _run(tiny, "answers", str(planted), "-o", str(ans), "--max-new-tokens", "6", "--turns", "2")
    recs = [json.loads(line) for line in ans.read_text().splitlines()]
    assert [r["question"] for r in recs] == ["Write a limerick about a cat.", "Pretend you are a pirate and greet me.",
                                             "Which is heavier, a kilo of feathers or a kilo of steel?"]
    for r in recs:
        assert r["messages"][0] == {"role": "user", "content": r["question"]} and r["mode"] == "spec"
        assert r["turns"] == (len(r["messages"]) + 1) // 2 and r["generated_tokens"] > 0
    # the trainer takes them as conversations under the plain template (no reasoning instruction)
    from minitorch.models import load_model
    from project.training.data import generated_sequences

    _, tok = load_model(tiny / "t", progress=False)
    seqs = generated_sequences(tok, recs, {}, 512, "chat")
    assert len(seqs) == 3
    prompt = tok.decode(seqs[0].ids[:seqs[0].n_prompt])
    assert "Write a limerick about a cat." in prompt and "Please reason" not in prompt


def test_resume_after_a_kill_mid_write_cuts_the_partial_line(tiny, tmp_path):
    """A run killed while writing a record (SIGKILL, a machine's time limit) leaves a partial last line: --resume cuts
    it and writes that item again, so the file holds each item once, every line whole. A bad line elsewhere stays an
    error (the file is not a writer's)."""
    req = tmp_path / "requests.jsonl"
    _run(tiny, "requests", "--n", "2", "-o", str(req), "--max-new-tokens", "4")
    whole = req.read_text()
    req.write_text(whole + '{"id": "chat-2", "index": 2, "categ')  # cut off mid-record
    _run(tiny, "requests", "--n", "3", "-o", str(req), "--max-new-tokens", "4", "--resume")
    rows = [json.loads(line) for line in req.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["chat-0", "chat-1", "chat-2"] and req.read_text().startswith(whole)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n" + whole)
    with pytest.raises(Exception, match="not a results record"):
        wc.main(["requests", "--n", "3", "-o", str(bad), "--resume", "--target", str(tiny / "t"), "--drafter", "ngram",
                 "--no-progress", "--max-new-tokens", "4"])


def test_the_trainer_drops_a_conversation_holding_an_evaluation_question(tiny):
    from minitorch.models import load_model
    from project.evaluation.data import load_problems
    from project.training.data import generated_sequences

    _, tok = load_model(tiny / "t", progress=False)
    spec_bench = load_problems("spec_bench")[3].turns[1]  # an MT-bench second turn
    ok = {"id": "a", "question": "Write a limerick about a cat.", "text": "A cat...", "stop_reason": "stop",
          "messages": [{"role": "user", "content": "Write a limerick about a cat."}]}
    bad = {**ok, "id": "b", "messages": ok["messages"] + [{"role": "assistant", "content": "A cat..."},
                                                          {"role": "user", "content": spec_bench}]}
    assert [s.source for s in generated_sequences(tok, [ok, bad], {}, 512, "chat")] == ["chat"]


def test_the_trainer_learns_every_answer_of_a_conversation(tiny, monkeypatch):
    """A two-turn record is one sequence, the whole conversation under the template (the last turn's prompt, then
    the last answer, ended by the end of turn), and learns both answers: the loss mask of a training step covers the
    positions that predict each answer's ids (and its end of turn) and no user turn's or template's."""
    import numpy as np

    from minitorch.models import load_model
    from project.training.data import answer_spans, generated_sequences
    from project.training.loop import build_batch, dense_rows

    target, tok = load_model(tiny / "t", progress=False)
    first = [{"role": "user", "content": "Write a limerick about a cat."}]
    two = first + [{"role": "assistant", "content": "A cat sat."}, {"role": "user", "content": "Now a dog."}]
    rec = {"id": "a", "question": first[0]["content"], "text": "A dog ran.", "stop_reason": "stop", "messages": two}
    (seq,) = generated_sequences(tok, [rec], {}, 512, "chat")
    end = [tok.backend.token_to_id(tok.special_tokens["eos_token"])]
    whole = list(tok.encode(tok.apply_chat_template(two, add_generation_prompt=True)))
    assert seq.ids == whole + list(tok.encode("A dog ran.")) + end
    spans = answer_spans(seq)
    assert [tok.decode(seq.ids[a:b], skip_special_tokens=False) for a, b in spans] == [
        "A cat sat." + tok.special_tokens["eos_token"], "A dog ran." + tok.special_tokens["eos_token"]]
    assert seq.ids[:spans[0][0]] == list(tok.encode(tok.apply_chat_template(first, add_generation_prompt=True)))
    # the step's mask: position t's label is the target's features at t + 1, which predict id t + 2
    L = len(seq.ids)

    class Rows:  # the features are not read by the mask
        dims = target.config.hidden_size

        def rows(self, i):
            return np.zeros((L, self.dims), np.float32)

    batch = build_batch([0], [seq], Rows(), target, dense_rows(target.lm_head_weight(), 64, target.backend),
                        target.backend)
    learned = {int(t) + 2 for t in np.flatnonzero(np.asarray(batch.mask.to_numpy())[0])}
    # each answer's ids, and what the target writes after its end of turn (the template's next id, or past the end)
    assert learned == {i for a, b in spans for i in range(a, b + 1)}
    # broken: a mask from the first answer on, as for one answer, learns the second user turn too
    from project.training import loop

    monkeypatch.setattr(loop, "answer_spans", lambda s: ((s.n_prompt, len(s.ids)),))
    broken = build_batch([0], [seq], Rows(), target, dense_rows(target.lm_head_weight(), 64, target.backend),
                         target.backend)
    assert {int(t) + 2 for t in np.flatnonzero(np.asarray(broken.mask.to_numpy())[0])} > learned
    monkeypatch.undo()
    # cut to fit: only what is inside is learned, and an answer whose prompt leaves no room is dropped
    (cut,) = generated_sequences(tok, [rec], {}, spans[1][0] + 3, "chat")
    assert answer_spans(cut) == (spans[0], (spans[1][0], spans[1][0] + 3))
    (short,) = generated_sequences(tok, [rec], {}, spans[1][0] + 1, "chat")
    assert answer_spans(short) == (spans[0],)


class ScriptedTemplate(Template):
    """Template plus one character a token (id = code point; 0 ends a turn)."""

    stop_token_ids = {0}

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i)


def test_two_turns_follow_up_written_by_the_target_from_the_conversation(tmp_path, monkeypatch):
    """--turns 2: the answer, then the user's follow-up sampled from the template's prefix of a user turn after the
    conversation (Magpie), then its answer; the record holds both user turns and the first answer, text the second."""
    from types import SimpleNamespace

    from project.evaluation import engine as engine_mod

    tok = ScriptedTemplate()
    prompts = []

    def gen(ids, max_new_tokens, seed):
        prompt = tok.decode(ids)
        prompts.append(prompt)
        reply = {1: "A cat sat on a mat.", 2: "And now about a dog?", 3: "A dog dug."}[len(prompts)]
        return SimpleNamespace(tokens=tok.encode(reply) + [0], stop_reason="stop")

    monkeypatch.setattr(engine_mod, "load_engine", lambda args, modes: SimpleNamespace(tokenizer=tok, modes={"spec": gen}))
    src = tmp_path / "req.jsonl"
    src.write_text(json.dumps({"id": "chat-0", "question": "Write about a cat.", "category": "writing"}) + "\n")
    out = tmp_path / "ans.jsonl"
    assert wc.main(["answers", str(src), "-o", str(out), "--turns", "2", "--no-progress"]) == 0
    rec = json.loads(out.read_text())
    assert rec["messages"] == [{"role": "user", "content": "Write about a cat."},
                               {"role": "assistant", "content": "A cat sat on a mat."},
                               {"role": "user", "content": "And now about a dog?"}]
    assert rec["text"] == "A dog dug." and rec["turns"] == 2 and rec["stop_reason"] == "stop"
    assert prompts[1] == wc.user_prefix(tok, rec["messages"][:2])  # the follow-up comes from the user turn's prefix
    assert prompts[2] == tok.apply_chat_template(rec["messages"], add_generation_prompt=True)


def test_bad_flags_are_one_line(tiny, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        wc.run_cli(lambda: wc.main(["answers", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "o.jsonl"),
                                    "--turns", "3"]))
    assert e.value.code == 2 and "--turns takes 1 or 2" in capsys.readouterr().err


def test_two_turns_in_a_batch_follow_ups_join_as_answers_finish(tmp_path, monkeypatch):
    """--turns 2 --batch 2: each conversation's follow-up request and second answer enter the batch as the answer
    before them finishes; the records are those of one conversation at a time, in finishing order. The batch here is a
    2-slot stand-in that ends the last admitted sequence first (out of order, as a real batch may)."""
    from types import SimpleNamespace

    from project.evaluation import engine as engine_mod

    tok = ScriptedTemplate()
    answers = {"Write about a cat.": "A cat sat on a mat.", "And now about a dog?": "A dog dug.",
               "Write about a fish.": "A fish swam.", "And what about a bird?": "A bird flew."}

    def reply(prompt: str) -> str:
        if prompt.endswith("<|im_start|>user\n"):  # the user's follow-up, from the template's prefix
            return "And now about a dog?" if "cat" in prompt else "And what about a bird?"
        last_user = prompt.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>")[0]
        return answers[last_user]

    def batch(requests):
        flight, pending = [], iter(requests)
        while True:
            while len(flight) < 2:
                r = next(pending, "end")
                if r is None or r == "end":
                    break
                flight.append(r)
            if not flight:
                return
            key, (ids, n, seed) = flight.pop()
            yield key, SimpleNamespace(tokens=tok.encode(reply(tok.decode(ids))) + [0], stop_reason="stop")

    monkeypatch.setattr(engine_mod, "load_engine",
                        lambda args, modes: SimpleNamespace(tokenizer=tok, modes={}, batch=batch))
    src = tmp_path / "req.jsonl"
    src.write_text("".join(json.dumps({"id": f"chat-{i}", "question": q, "category": "writing"}) + "\n"
                           for i, q in enumerate(["Write about a cat.", "Write about a fish."])))
    out = tmp_path / "ans.jsonl"
    assert wc.main(["answers", str(src), "-o", str(out), "--turns", "2", "--batch", "2", "--no-progress"]) == 0
    recs = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert recs["chat-0"]["messages"][1:] == [{"role": "assistant", "content": "A cat sat on a mat."},
                                              {"role": "user", "content": "And now about a dog?"}]
    assert recs["chat-1"]["messages"][1:] == [{"role": "assistant", "content": "A fish swam."},
                                              {"role": "user", "content": "And what about a bird?"}]
    assert recs["chat-0"]["text"] == "A dog dug." and recs["chat-1"]["text"] == "A bird flew."
    assert [r["turns"] for r in recs.values()] == [2, 2]

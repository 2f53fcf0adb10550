"""Training text for a draft head that covers what users ask, written by the target itself: requests of every kind,
then its own answers to them under the benchmarks' chat template. Two steps, each a separate run, each resumable.

    python project/write_chat.py requests --n 2000 -o requests.jsonl [--style topics|magpie] [--backend cuda]
    python project/write_chat.py answers requests.jsonl -o answers.jsonl [--turns 2] [--backend cuda]
    python project/train_draft_head.py --generated answers.jsonl ...

Why: a head trained on math drafts math (GSM8K 2.2x on the H200) and slows everything else down (the seed's own
"Who is better Ronaldo or Messi?" 0.77x on the CPU). It has to learn the target's answers to the range of requests
users make, and no such prompts can be downloaded here, so the target writes them (issue 43):

- `--style topics` (default): item i asks the target for one request of category i mod 11 (writing, roleplay,
  reasoning, coding, extraction, STEM, humanities, translation, summarization, questions from passages, math; the
  range Spec-Bench covers) on a topic of that category, sampled (temperature 0.9, top-p 0.95, seed --seed + i). The
  kinds that work on a given text (extraction, summarization, passages, translation) ask for the text inside the
  request.
- `--style magpie` (Magpie, arXiv 2406.08464): the chat template up to where a user's message starts, sampled until
  the turn ends, so the request is whatever the target expects users to write.
- `--style texts`: the target first writes a text on one of SUBJECTS (a news article, German sentences, passages as
  from web pages, a document; sampled), and the request is the benchmarks' form of a task around it: "Summarize:
  <article>", "Translate German to English: <sentences>", the passages then a question the target wrote about them,
  an extraction instruction then the document; or a question as typed into a search engine. Asked to write a
  request that carries its own text (`topics`' summarization, translation, passages, extraction), the 1.5B target
  wrote "Can you please summarize the article?" with no article: these are two thirds of Spec-Bench's questions.

A request that is an evaluation question word for word (GSM8K test, MATH-500, AIME, AMC, any Spec-Bench turn;
training/data.py) or too short / long is kept as `question: null` with its raw text. `answers` answers every kept
request greedily under the template with no instruction of ours (the benchmarks' Spec-Bench prompt); `--turns 2`
then lets the target write the user's follow-up (Magpie over the conversation so far) and answers that too. A record
carries its `messages` (the user and assistant turns before the last answer) and the last answer as `text`, which
train_draft_head.py --generated takes as it is. --batch N writes N items at once with the target alone
(training/writer.py; a second turn's requests join the batch as their first answers finish), each record as it
finishes, in whatever order.
"""
from __future__ import annotations

import argparse
import random
from typing import Any, Iterator, Optional, Sequence

from project.cli_common import encode_prompt, run_cli
from project.one_line_parser import OneLineParser
from project.settings import UserError
from project.training.writer import Job, add_step_args, check_output, first_step_rows, kept_question, write_items

CATEGORIES: dict[str, tuple[str, ...]] = {
    "writing": ("a travel blog post", "a persuasive email", "a short story opening", "a product description",
                "a cover letter", "a speech for a wedding", "a poem about the sea", "a restaurant review"),
    "roleplay": ("a job interviewer", "a medieval knight", "a patient tutor", "a detective", "a tour guide in Rome",
                 "a customer support agent", "a chess coach", "a fictional startup founder"),
    "reasoning": ("a logic puzzle", "a riddle about ages", "planning a trip under constraints", "a scheduling problem",
                  "a counterfactual question", "comparing two arguments", "a lateral thinking puzzle"),
    "coding": ("a Python function with tests", "a SQL query", "a regular expression", "explaining a bug in C code",
               "a JavaScript event handler", "a shell script", "refactoring a class", "a data structure in Rust"),
    "extraction": ("names and dates from a news paragraph", "a table from a product listing",
                   "key facts from a meeting note", "JSON from an invoice text", "the main claims of a review"),
    "stem": ("photosynthesis", "black holes", "vaccines", "electric circuits", "plate tectonics", "machine learning",
             "climate change", "the immune system"),
    "humanities": ("the French Revolution", "stoic philosophy", "impressionist painting", "the Silk Road",
                   "linguistic relativity", "the causes of World War I", "Greek tragedy", "economic inequality"),
    "translation": ("a German paragraph about a museum", "a French email about a delay",
                    "a Spanish recipe", "an Italian news sentence", "a German product review"),
    "summarization": ("a news article about a local election", "a paragraph from a science report",
                      "a company's quarterly update", "a long product review", "a blog post about running"),
    "passages": ("a question answered from two given passages about a city",
                 "a question about a historical figure with a retrieved paragraph",
                 "a question with three short search results about a medicine", "a trivia question with context"),
    "math": ("a word problem about percentages", "a probability question", "an algebra exercise",
             "a geometry question", "a unit conversion", "a question about sequences"),
}
WITH_TEXT = ("extraction", "translation", "summarization", "passages")  # requests that carry the text they work on
# --style texts: the target first writes a text on a subject (sampled), then the request is the benchmarks' form of a
# task around it (Spec-Bench's translation, summarization, qa and rag prompts are short instructions around a German
# sentence, a news article, a search-box question, retrieved passages): what --style topics could not make the target
# write (asked for a request carrying its text, a 1.5B target wrote "Can you summarize the article?" with none)
SUBJECTS = (
    "a city's new tram line", "a drought in a farming region", "a museum reopening after renovation", "a marathon",
    "a data breach at a retailer", "a new vaccine trial", "a volcano eruption", "a local bakery's success",
    "a football transfer", "an election for mayor", "a bridge collapse", "rising rents", "a solar power plant",
    "a rescued whale", "a school lunch program", "a chess tournament", "a wildfire", "a space probe's landing",
    "a new smartphone", "a strike by rail workers", "an archaeological find", "a zoo's newborn panda",
    "a film festival", "a recall of baby food", "a heat wave", "a startup raising money", "a flood",
    "a new law on plastic bags", "a record-breaking swimmer", "a hospital's new wing", "a cyberattack on a city",
    "a music festival", "a merger of two banks", "an earthquake", "a community garden", "a missing hiker found",
    "a central bank raising interest rates", "a new species of frog", "a court ruling on privacy", "an air show",
    "a shortage of nurses", "a river cleanup", "the opening of a library", "a tennis final", "a factory closing",
    "electric cars", "honeybees", "the Roman Empire", "black holes", "the human heart", "coffee", "the Amazon rainforest",
    "the printing press", "volcanoes", "the Great Wall of China", "antibiotics", "the internet", "jazz",
    "the Olympic Games", "photosynthesis", "the Moon landing", "tea ceremonies", "glaciers", "the stock market",
    "vaccination", "the Renaissance", "wind energy", "sleep", "dinosaurs", "the Silk Road", "recycling",
    "the immune system", "Mount Everest", "chocolate", "the French Revolution", "tides", "artificial intelligence",
    "the Eiffel Tower", "bicycles", "the water cycle", "ancient Egypt", "sharks", "the Nile", "earthquakes",
    "the piano", "democracy", "rice farming", "the solar system", "typhoons", "the Beatles", "castles",
    "the periodic table", "penguins", "the Industrial Revolution", "cheese making", "coral reefs", "the Vikings",
    "nuclear power", "the Sahara", "yoga", "Shakespeare", "hurricanes", "the Internet of Things", "origami",
    "the Panama Canal", "migraine", "the Aztecs", "3D printing", "wolves", "the violin", "public libraries",
    "the Cold War", "wine making", "the Arctic", "diabetes", "the Mona Lisa", "trains", "mushrooms", "bees and pollination",
    "the Taj Mahal", "cryptocurrency", "the Titanic", "the Alps", "vitamins", "chess", "the Great Barrier Reef",
    "the telephone", "marathon running", "the ozone layer", "Greek mythology", "submarines", "the Mediterranean diet",
    "hydrogen fuel", "the Louvre", "elephants", "cloud computing", "the Maya", "basketball", "lighthouses",
    "the human brain", "pirates", "the Hubble telescope", "bread", "the Berlin Wall", "octopuses", "quantum computers",
    "Antarctica", "the Tour de France", "paper money", "the Colosseum", "allergies", "skyscrapers", "the Danube",
)
WORDS = (250, 400, 600)  # a news article's length, asked for
SENTENCES = ("one sentence", "one sentence", "two sentences")
DOCUMENTS = (  # extraction: (the text the target writes, the instruction put before it)
    ("a short news report that names several people, places and dates",
     "Extract every person, place and date mentioned in the following text. Return them as JSON."),
    ("a customer review of a product", "Rate the following review on a scale of 1 to 5, with 1 being very negative "
     "and 5 very positive, and list its main points."),
    ("a meeting note with decisions and action items",
     "List the decisions and the action items in the following meeting note, with who is responsible for each."),
    ("a product listing with prices and specifications",
     "Turn the following product listing into a table of its specifications and prices."),
)
TEXT_TASKS: dict[str, tuple[str, str]] = {  # kind: (what the target writes first, the request around it)
    "summarization": ("Write a news article of about {words} words about {subject}. Write only the article's text, "
                      "with no title.", "Summarize: {text}"),
    "translation": ("Write {sentences} in German about {subject}, as in a news report. Write only the German text.",
                    "Translate German to English: {text}"),
    "passages": ("Write three short paragraphs about {subject}, each as it might appear on a different web page. "
                 "Write only the paragraphs.", "{text}\n{question}"),
    "qa": ("Write one short question that asks for a fact about {subject}, the way people type questions into a "
           "search engine. Write only the question.", "{text}"),
    "extraction": ("Write {document} about {subject}. Write only the text.", "{instruction}\n\n{text}"),
}
PASSAGE_QUESTION = ("{text}\n\nWrite one question that a reader could answer from the paragraphs above. Write only "
                    "the question.")
MAX_TEXT_CHARS = 8000  # a texts request's length (an article and its instruction: about 2,000 tokens)
REQUEST = ("Write one message that a user might send to an AI assistant. Kind: {category}. About: {topic}.{text}\n"
           "Write only the user's message, exactly as the user would send it, with nothing before or after it.")
TEXT_NOTE = " The message must include the full text it refers to (100 to 300 words), written out."
MIN_CHARS, MAX_CHARS = 15, 4000  # a kept request's length
MARK = "\u0001REQUEST\u0001"  # where a user's message would start in the chat template (Magpie's prefix)


def request_items(n: int, start: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, fields) of items start..start+n-1: category i mod 11, and within it topic (i // 11) mod its count."""
    names = list(CATEGORIES)
    for i in range(start, start + n):
        cat = names[i % len(names)]
        topics = CATEGORIES[cat]
        yield f"chat-{i}", {"index": i, "category": cat, "topic": topics[(i // len(names)) % len(topics)]}


def text_items(n: int, start: int = 0,
               kinds: Optional[Sequence[str]] = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, fields) of --style texts items start..start+n-1: kind i mod len(kinds) (None: all of TEXT_TASKS, in its
    order; --kinds translation: every item a translation), a subject and a form (the article's words, German
    sentences, a document and its instruction) drawn by a generator seeded with the index."""
    kinds = list(kinds or TEXT_TASKS)
    for i in range(start, start + n):
        rng = random.Random(f"texts-{i}")  # a str seed: the same draws in every Python run
        document, instruction = rng.choice(DOCUMENTS)
        yield f"chat-{i}", {"index": i, "category": kinds[i % len(kinds)], "topic": rng.choice(SUBJECTS),
                            "words": rng.choice(WORDS), "sentences": rng.choice(SENTENCES), "document": document,
                            "instruction": instruction}


def text_request(item: dict[str, Any], text: str, question: str | None = None) -> str:
    """The request of a texts item around the text the target wrote (and, for passages, its question)."""
    return TEXT_TASKS[item["category"]][1].format(text=text, question=question, instruction=item["instruction"])


def text_request_job(tok: Any, item: dict[str, Any], max_new_tokens: int, seed0: int = 0) -> Job:
    """A texts item's job (training/writer.py): the text (sampled, seed seed0 + index), for passages a question about it
    (seed + 1), then the record with the request around them, or with `question` None and the `raw` text when the
    text was cut at max_new_tokens, is too short or long, or the request is an evaluation question."""
    seed = seed0 + item["index"]
    ask = TEXT_TASKS[item["category"]][0].format(subject=item["topic"], words=item["words"],
                                                 sentences=item["sentences"], document=item["document"])
    res = yield encode_prompt(tok, ask, chat=True), max_new_tokens, seed
    n, raw = len(res.tokens), tok.decode(list(res.tokens))
    text = clean_request(raw, MAX_TEXT_CHARS) if res.stop_reason == "stop" else None
    question = None
    if text is not None and item["category"] == "passages":
        res = yield encode_prompt(tok, PASSAGE_QUESTION.format(text=text), chat=True), 128, seed + 1
        n += len(res.tokens)
        question = clean_request(tok.decode(list(res.tokens))) if res.stop_reason == "stop" else None
        text = text if question is not None else None
    request = kept_question(None if text is None else text_request(item, text, question))
    rec = {**item, "style": "texts", "question": request, "seed": seed}
    if request is None:
        rec["raw"] = raw
    return {**rec, "generated_tokens": n, "stop_reason": res.stop_reason}, n


def request_prompt(tok: Any, style: str, category: str, topic: str) -> str:
    """What the target continues to write a request: a request for one (topics), or the template's own prefix of a
    user turn (magpie)."""
    if style == "magpie":
        return user_prefix(tok, [])
    text = TEXT_NOTE if category in WITH_TEXT else ""
    msg = REQUEST.format(category=category, topic=topic, text=text)
    return tok.apply_chat_template([{"role": "user", "content": msg}], add_generation_prompt=True)


def user_prefix(tok: Any, messages: list[dict[str, str]]) -> str:
    """The chat template of `messages` followed by the start of a user turn, cut where its content would begin (the
    template's default system turn included): what Magpie samples a user message from."""
    full = tok.apply_chat_template(messages + [{"role": "user", "content": MARK}], add_generation_prompt=False)
    if MARK not in full:
        raise UserError("the chat template does not place the user's message verbatim: --style magpie cannot use it")
    return full[:full.index(MARK)]


def clean_request(text: str, max_chars: int = MAX_CHARS) -> str | None:
    """The request as written: the end-of-turn markers and surrounding quotes dropped; None when too short or long."""
    for stop in ("<|im_end|>", "<|endoftext|>", "<|im_start|>"):
        text = text.split(stop)[0]
    text = text.strip().strip('"').strip()
    return text if MIN_CHARS <= len(text) <= max_chars else None


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(description="The target writes requests of every kind users make, then answers them: "
                      "general training text for a draft head, no evaluation set.")
    sub = p.add_subparsers(dest="step", required=True)
    a = sub.add_parser("requests", help="write --n requests (sampled)")
    a.add_argument("--n", type=int, default=1100, help="requests to ask for (default 1100: 100 of each category)")
    a.add_argument("--start", type=int, default=0, help="the first item's index (default 0): more after an earlier file's")
    a.add_argument("--style", choices=("topics", "magpie", "texts"), default="topics",
                   help="topics (default): ask for a request of each category and topic in turn; magpie: sample the "
                        "user's message from the chat template's own prefix; texts: the target writes a text on a "
                        "subject (an article, German sentences, web passages, a document), the request is a task "
                        "around it (Summarize:, Translate German to English:, passages and a question, extraction) "
                        "or a search-box question")
    a.add_argument("--kinds", default=None, metavar="KIND[,KIND...]",
                   help=f"--style texts: only these tasks, in turn ({', '.join(TEXT_TASKS)}; default all), e.g. "
                        "translation for more of the kind a head drafts worst; give such a run its own --start")
    b = sub.add_parser("answers", help="answer the requests of a `requests` file (greedy)")
    b.add_argument("requests", help="the JSONL file `requests` wrote")
    b.add_argument("--turns", type=int, default=1,
                   help="conversation turns (default 1); 2: the target also writes the user's follow-up and answers it")
    add_step_args(a, 512, 0.9, 0.95)
    add_step_args(b, 1024, 0.0, 1.0)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.step == "requests" and (args.n < 1 or args.start < 0):
        raise UserError(f"--n must be >= 1 and --start >= 0, got {args.n} and {args.start}")
    if args.step == "requests" and args.kinds is not None:
        if args.style != "texts":
            raise UserError(f"--kinds chooses among --style texts' tasks, not --style {args.style}'s")
        args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        unknown = [k for k in args.kinds if k not in TEXT_TASKS]
        if unknown or not args.kinds:
            raise UserError(f"--kinds takes {', '.join(TEXT_TASKS)}, got {unknown[0] if unknown else 'none'}")
    if args.step == "answers" and args.turns not in (1, 2):
        raise UserError(f"--turns takes 1 or 2, got {args.turns}")
    check_output(args)
    return args


def answer(tok: Any, messages: list[dict[str, str]], max_new_tokens: int, seed: int) -> Job:
    """The target's answer to a conversation's last user turn, under the template with no instruction of ours: a
    job (training/writer.py) that returns (text, result)."""
    ids = list(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True)))
    res = yield ids, max_new_tokens, seed
    return tok.decode(list(res.tokens)).replace("<|im_end|>", "").replace("<|endoftext|>", "").strip(), res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    mode = "target" if args.batch > 1 else "spec"  # an answer record's mode: --batch N runs the target alone

    def request(tok: Any, item: dict[str, Any]) -> Job:
        if args.style == "texts":
            return (yield from text_request_job(tok, item, args.max_new_tokens, args.seed))
        seed = args.seed + item["index"]
        res = yield (list(tok.encode(request_prompt(tok, args.style, item["category"], item["topic"]))),
                     args.max_new_tokens, seed)
        text = tok.decode(list(res.tokens))
        question = kept_question(clean_request(text) if res.stop_reason == "stop" else None)
        rec = {**item, "style": args.style, "question": question, "seed": seed}
        if args.style == "magpie":  # the target chose what to ask: the item's category and topic were not used
            rec.update(category=None, topic=None)
        if question is None:
            rec["raw"] = text
        return {**rec, "generated_tokens": len(res.tokens), "stop_reason": res.stop_reason}, len(res.tokens)

    def conversation(tok: Any, item: dict[str, Any]) -> Job:
        messages = [{"role": "user", "content": item["question"]}]
        text, res = yield from answer(tok, messages, args.max_new_tokens, args.seed)
        n = len(res.tokens)
        if args.turns == 2 and res.stop_reason == "stop":  # the user's follow-up, written by the target, answered
            follow = yield (list(tok.encode(user_prefix(tok, messages + [{"role": "assistant", "content": text}]))),
                            256, args.seed + 1)
            n += len(follow.tokens)
            second = kept_question(clean_request(tok.decode(list(follow.tokens)))
                                   if follow.stop_reason == "stop" else None)
            if second is not None:
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": second}]
                text, res = yield from answer(tok, messages, args.max_new_tokens, args.seed)
                n += len(res.tokens)
        rec = {"question": item["question"], "category": item.get("category"), "messages": messages, "mode": mode,
               "text": text, "turns": (len(messages) + 1) // 2}
        return {**rec, "generated_tokens": n, "stop_reason": res.stop_reason}, n

    if args.step == "requests":
        items = (text_items(args.n, args.start, args.kinds) if args.style == "texts" else
                 request_items(args.n, args.start))
        return write_items(args, items, request)
    return write_items(args, [(r["id"], r) for r in first_step_rows(args.requests, "requests")], conversation)


if __name__ == "__main__":
    run_cli(main)

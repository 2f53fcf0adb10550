"""Final-answer extraction and grading for math benchmarks (GSM8K, MATH-500, AIME, AMC, LIMO).

Extraction order (the method used is recorded with the answer):
  1. ``boxed``: the content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces handled),
  2. ``####``: GSM8K's final-answer marker (the text after the last ``####`` on its line),
  3. ``last_number``: the last number in the text (thousands separators removed),
  4. ``none``: nothing found (graded incorrect).

Equivalence is decided by math-verify (Hugging Face), which parses LaTeX / plain expressions with
sympy, so ``\\frac{14}{3}`` equals ``14/3``, ``27.0`` equals ``27`` and ``2,125`` equals ``2125``.
"""
from __future__ import annotations

import math
import re
from typing import Any

EXTRACTION_METHODS = ("boxed", "####", "last_number", "none")

_BOX_COMMANDS = ("\\boxed", "\\fbox", "\\framebox")
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_THOUSANDS_RE = re.compile(r"^-?\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_HASH_RE = re.compile(r"####\s*([^\n]*)")


def _match_braces(text: str, open_pos: int) -> int | None:
    """Index of the '}' closing the '{' at ``open_pos`` (escaped braces skipped), or None."""
    depth = 0
    i = open_pos
    while i < len(text):
        ch = text[i]
        if ch == "\\":  # skip escaped characters such as \{ and \}
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox``/``\\framebox``) in ``text``.

    Also accepts the brace-less form ``\\boxed 5``. Returns None when there is no complete box.
    """
    best: tuple[int, str] | None = None
    for cmd in _BOX_COMMANDS:
        start = 0
        while True:
            pos = text.find(cmd, start)
            if pos < 0:
                break
            start = pos + len(cmd)
            j = start
            if j < len(text) and text[j].isalpha():  # e.g. \boxedfoo is another command
                continue
            while j < len(text) and text[j] == " ":
                j += 1
            if j < len(text) and text[j] == "{":
                end = _match_braces(text, j)
                if end is None:
                    continue
                content = text[j + 1 : end]
            elif j > start:  # "\boxed 5": up to whitespace or '$'
                m = re.match(r"[^\s$]+", text[j:])
                if not m:
                    continue
                content = m.group(0)
            else:
                continue
            if best is None or pos > best[0]:
                best = (pos, content.strip())
    return None if best is None else best[1]


def strip_thousands(answer: str) -> str:
    """Remove thousands separators from a plain number ("2,125" -> "2125"); other text unchanged."""
    s = answer.strip()
    if _THOUSANDS_RE.match(s):
        return s.replace(",", "")
    return answer


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands separators removed ("1,000.5" -> "1000.5")."""
    matches = _NUMBER_RE.findall(text)
    if not matches:
        return None
    return matches[-1].replace(",", "")


def extract_answer(text: str) -> tuple[str | None, str]:
    """Extract the final answer from a model output: returns (answer or None, method)."""
    boxed = extract_boxed(text)
    if boxed is not None and boxed != "":
        return strip_thousands(boxed), "boxed"
    hashes = _HASH_RE.findall(text)
    if hashes:
        ans = hashes[-1].strip()
        if ans:
            return strip_thousands(ans.rstrip(".")), "####"
    num = extract_last_number(text)
    if num is not None:
        return num, "last_number"
    return None, "none"


def gold_answer(record: dict[str, Any]) -> str:
    """The reference answer of one dataset record, as a string.

    GSM8K: the text after ``####`` in ``answer`` (commas removed); MATH-500 / AIME / LIMO: ``answer``;
    AMC23 stores floats (``27.0``), written back as integers when they are whole.
    """
    if "answer" not in record:
        raise ValueError(f"record has no 'answer' field (fields: {sorted(record)})")
    ans = record["answer"]
    if isinstance(ans, bool):
        raise ValueError(f"answer must be a number or a string, got {ans!r}")
    if isinstance(ans, (int, float)):
        if isinstance(ans, float) and math.isfinite(ans) and ans.is_integer():
            return str(int(ans))
        return repr(ans)
    if not isinstance(ans, str):
        raise ValueError(f"answer must be a number or a string, got {type(ans).__name__}")
    if "####" in ans:
        return ans.split("####")[-1].strip().replace(",", "")
    return ans.strip()


def _as_math(answer: str) -> str:
    """Wrap a bare answer in $...$ so math-verify reads it as LaTeX (already wrapped text is kept)."""
    s = answer.strip()
    if s.startswith("$") or s.startswith("\\(") or s.startswith("\\["):
        return s
    return f"${s}$"


def _plain(answer: str) -> str:
    """A loose normal form for the exact-match shortcut and the fallback comparison."""
    s = strip_thousands(answer).strip().strip("$").strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = s.replace("\\!", "").replace("\\,", "").replace(" ", "")
    return s.rstrip(".")


def _float_equal(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    except ValueError:
        return False


def is_correct(predicted: str | None, gold: str) -> bool:
    """True when ``predicted`` is mathematically equal to ``gold`` (math-verify; plain fallback)."""
    if predicted is None or predicted.strip() == "":
        return False
    p, g = _plain(predicted), _plain(gold)
    if p == g or _float_equal(p, g):
        return True
    try:
        from math_verify import parse, verify
    except ImportError:  # math-verify is a requirement; this keeps grading usable without it
        return False
    try:
        gold_parsed = parse(_as_math(strip_thousands(gold)))
        pred_parsed = parse(_as_math(strip_thousands(predicted)))
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed))
    except Exception:  # a parser/timeout failure on odd model output means "not shown equal"
        return False


def grade(text: str, gold: str) -> dict[str, Any]:
    """Extract the answer from ``text`` and grade it: {'extracted', 'extraction', 'correct'}."""
    answer, method = extract_answer(text)
    return {"extracted": answer, "extraction": method, "correct": is_correct(answer, gold)}

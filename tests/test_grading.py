"""Answer extraction and grading (project/evaluation/grading.py) on real GSM8K / MATH-500 / AMC23 answers."""
import json
from pathlib import Path

import pytest

from project.evaluation.grading import extract_answer, extract_boxed, gold_answer, grade, is_correct, strip_thousands

DATA = Path(__file__).resolve().parents[1] / "data"  # the repository's own copy


# ----------------------------------------------------------------------------- extraction

@pytest.mark.parametrize("text, expected", [
    ("so the answer is \\boxed{18}.", "18"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),  # nested braces
    ("$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("first \\boxed{1} then corrected \\boxed{2}", "2"),  # the last box wins
    ("\\boxed{\\text{\\{a, b\\}}}", "\\text{\\{a, b\\}}"),  # escaped braces do not count
    ("\\boxed 5 is it", "5"),
    ("or $\\framebox{204}$ minutes", "204"),
    ("\\fbox{7}", "7"),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize("text", ["no box here", "\\boxed{unclosed", "\\boxedx{1}"])
def test_extract_boxed_none(text):
    assert extract_boxed(text) is None


@pytest.mark.parametrize("text, answer, method", [
    ("<think>9 eggs, 9*2=18</think> She makes \\boxed{18} dollars.", "18", "boxed"),
    ("He made 80,000 and\n#### 70,000", "70000", "####"),
    ("Janet sells 16 - 3 - 4 = 9 duck eggs.\n#### 18\n", "18", "####"),
    ("In total she pays $1,450,000.", "1450000", "last_number"),
    ("the temperature fell to -3 degrees", "-3", "last_number"),
    ("half is 0.5", "0.5", "last_number"),
    ("I cannot solve this.", None, "none"),
    ("\\boxed{2,125}", "2125", "boxed"),
    ("\\boxed{} and later 12", "12", "last_number"),  # an empty box is no answer
])
def test_extract_answer(text, answer, method):
    assert extract_answer(text) == (answer, method)


def test_strip_thousands_leaves_lists_alone():
    assert strip_thousands("1,450,000") == "1450000"
    assert strip_thousands("1,-2") == "1,-2"
    assert strip_thousands("3, 5, 7") == "3, 5, 7"
    assert strip_thousands("(1,234)") == "(1,234)"


# ----------------------------------------------------------------------------- gold answers

def _rows(rel):
    path = DATA / rel
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_gold_gsm8k_real_rows():
    rows = _rows("gsm8k/test.jsonl")
    golds = [gold_answer(r) for r in rows]
    assert golds[0] == "18" and golds[1] == "3"
    assert golds[146] == "2125"  # written "2,125" in the file
    assert golds[611] == "1450000"
    assert golds[489] == "-10"
    assert all(g.lstrip("-").isdigit() for g in golds)  # README: every answer is an integer


def test_gold_amc23_floats_and_math500_latex():
    amc = _rows("limo/eval/amc23.jsonl")
    assert gold_answer(amc[0]) == "27"  # stored as 27.0
    assert "-1" in [gold_answer(r) for r in amc]  # the one negative answer, stored -1.0
    math500 = _rows("limo/eval/math500.jsonl")
    assert gold_answer(math500[0]) == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert gold_answer({"answer": 2.5}) == "2.5"


def test_gold_errors():
    with pytest.raises(ValueError, match="no 'answer'"):
        gold_answer({"question": "q"})
    with pytest.raises(ValueError, match="number or a string"):
        gold_answer({"answer": [1]})


# ----------------------------------------------------------------------------- equivalence

@pytest.mark.parametrize("gold, predicted", [
    # MATH-500 answers (test.jsonl rows 0-36) against equivalent model spellings
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left(3,\\frac{\\pi}{2}\\right)"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("\\frac{14}{3}", "14/3"),
    ("\\frac{14}{3}", "\\dfrac{14}{3}"),
    ("\\text{Evelyn}", "Evelyn"),
    ("p - q", "p-q"),
    ("90^\\circ", "90"),
    ("3\\sqrt{13}", "\\sqrt{117}"),
    ("6 - 5i", "6-5i"),
    ("x=5", "5"),
    ("1,-2", "-2, 1"),
    ("3, 5, 7", "3,5,7"),
    ("11\\sqrt2", "11\\sqrt{2}"),
    ("\\frac{243}{625}", "0.3888"),
    # GSM8K: commas, dollars, trailing zeros
    ("2125", "2,125"),
    ("1450000", "1,450,000"),
    ("18", "\\$18.00"),
    ("18", "18 \\text{ dollars}"),  # units in the box (a common model habit)
    ("1800", "\\$1,800"),
    ("-10", "-10"),
    # AMC23 floats
    ("27", "27.0"),
    ("-1", "-1.0"),
    ("0.5", "\\frac{1}{2}"),
])
def test_equivalent(gold, predicted):
    assert is_correct(predicted, gold)


@pytest.mark.parametrize("gold, predicted", [
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{3})"),
    ("\\frac{14}{3}", "4.67"),
    ("\\text{Evelyn}", "\\text{Bob}"),
    ("p - q", "q - p"),
    ("-50", "50"),
    ("1,-2", "1"),
    ("2125", "212"),
    ("27", "27.5"),
])
def test_not_equivalent(gold, predicted):
    assert not is_correct(predicted, gold)


@pytest.mark.parametrize("predicted", [None, "", "   "])
def test_missing_answer_is_wrong(predicted):
    assert not is_correct(predicted, "18")


def test_grade_records_method():
    assert grade("... so \\boxed{\\frac{14}{3}}", "\\frac{14}{3}") == {
        "extracted": "\\frac{14}{3}", "extraction": "boxed", "correct": True}
    assert grade("The total is 1,800 dollars", "1800") == {
        "extracted": "1800", "extraction": "last_number", "correct": True}
    assert grade("nothing", "5")["extraction"] == "none"


def _check_gsm8k_grading(rows) -> None:
    """Model-like outputs built from each GSM8K reference solution, graded against a gold read by this test's
    own regex (not by gold_answer): the final answer boxed, as the last number of a sentence, after ####
    (all correct), and the same three with the answer + 1 (all wrong; every 10th row, math-verify is slow)."""
    import re

    for i, r in enumerate(rows):
        m = re.search(r"####\s*(-?[\d,]+)\s*$", r["answer"])
        assert m, r["answer"][-40:]
        final = m.group(1).replace(",", "")
        assert gold_answer(r) == final
        body = r["answer"][:m.start()]  # the worked solution: full of other numbers
        outputs = {"boxed": f"{body}So the answer is \\boxed{{{final}}}.",
                   "last_number": f"{body}In total that makes {final}.", "####": r["answer"]}
        for method, text in outputs.items():
            assert grade(text, final) == {"extracted": final, "extraction": method, "correct": True}, (i, method)
        if i % 10 == 0:
            wrong = str(int(final) + 1)
            for method, text in outputs.items():
                text = text[::-1].replace(m.group(1)[::-1] if method == "####" else final[::-1], wrong[::-1], 1)[::-1]
                assert grade(text, final) == {"extracted": wrong, "extraction": method, "correct": False}, (i, method)


def test_gsm8k_reference_solutions_grade_correct():
    _check_gsm8k_grading(_rows("gsm8k/test.jsonl"))


@pytest.mark.parametrize("bug", ["always-correct", "first-number", "thousands-kept"])
def test_gsm8k_grading_check_catches_broken_graders(bug, monkeypatch):
    """The check above fails on a grader that accepts any answer, on one that reads the first number of a text
    instead of the last, and on one that keeps thousands separators ("#### 2,125", row 146)."""
    from project.evaluation import grading

    rows = _rows("gsm8k/test.jsonl")[:150]
    if bug == "always-correct":
        monkeypatch.setattr(grading, "is_correct", lambda p, g: p is not None)
    elif bug == "first-number":
        monkeypatch.setattr(grading, "extract_last_number",
                            lambda t: (grading._NUMBER_RE.findall(t) or [None])[0] and
                            grading._NUMBER_RE.findall(t)[0].replace(",", ""))
    else:
        monkeypatch.setattr(grading, "strip_thousands", lambda a: a)
    with pytest.raises(AssertionError):
        _check_gsm8k_grading(rows)


def test_math500_reference_solutions_grade_correct():
    """MATH-500 reference solutions end in \\boxed{answer}; each must grade correct on `answer`."""
    rows = _rows("limo/eval/math500.jsonl")
    results = [grade(r["solution"], gold_answer(r)) for r in rows]
    assert all(g["extraction"] == "boxed" for g in results)
    assert [i for i, g in enumerate(results) if not g["correct"]] == []

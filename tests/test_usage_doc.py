"""docs/USAGE.md's flag reference is what the parsers say (project/usage_doc.py generates it): a flag added,
removed or re-worded in a parser without regenerating the page fails here."""
from __future__ import annotations

import argparse

from project import usage_doc


def test_usage_reference_matches_the_parsers():
    _, generated = usage_doc.current()
    assert generated, f"{usage_doc.USAGE} has no generated reference (python -m project.usage_doc writes it)"
    assert generated == usage_doc.reference(), "docs/USAGE.md drifted from --help: run python -m project.usage_doc"
    assert usage_doc.main(["--check"]) == 0


def test_a_changed_flag_is_caught(monkeypatch):
    """Power: a parser that grows a flag (or re-words one) no longer matches the committed page."""
    from project import run_spec_decoding

    real = run_spec_decoding.build_parser

    def grown() -> argparse.ArgumentParser:
        p = real()
        p.add_argument("--new-flag", help="a flag the page does not know")
        return p

    monkeypatch.setattr(run_spec_decoding, "build_parser", grown)
    assert "--new-flag" in usage_doc.reference()
    assert usage_doc.main(["--check"]) == 1


def test_every_flag_of_the_demo_is_in_the_reference():
    """An independent count: each option string of the demo's parser appears in the page's generated part."""
    from project import run_spec_decoding

    _, generated = usage_doc.current()
    demo = generated.split("### `python project/run_spec_decoding.py`")[1].split("### `")[0]
    flags = [s for a in run_spec_decoding.build_parser()._actions for s in a.option_strings
             if s.startswith("--") and s != "--help"]
    assert len(flags) > 20 and all(f in demo for f in flags), [f for f in flags if f not in demo]


def test_the_reference_names_no_path_of_this_checkout():
    """Defaults that are paths in the checkout (train_draft_head's --data-file) appear relative to it, so the page
    is the same in every clone (an absolute path made the drift test fail in any other folder)."""
    assert str(usage_doc.ROOT) not in usage_doc.reference()
    assert "`data/gsm8k/train.jsonl.gz`" in usage_doc.reference()

"""argparse whose errors are one line and exit status 2, shared by every program in project/.

Kept free of minitorch imports so that light commands (benchmark merge / summary) start fast."""
from __future__ import annotations

import argparse
import sys

EXIT_USER_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag ends in one line (not the usage block) and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {self.prog}: {message} (see --help)", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)

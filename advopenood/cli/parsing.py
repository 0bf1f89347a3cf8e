"""Argument parsing shared by the CLI and the OpenOOD bridge: one-line errors (exit 2), positive integers."""
from __future__ import annotations

import argparse
import difflib
from typing import Any, Sequence

from advopenood.errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (a UsageError, exit 2) instead of usage + error, and names the
    closest flag of the subcommand for a flag it does not take."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """A UsageError naming the subcommand (the CLI prints ``advopenood: error:`` before it, once)."""
        command = self.prog.removeprefix("advopenood").strip()
        raise UsageError(f"{command}: {message}" if command else message)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: Any = None) -> argparse.Namespace:
        """As argparse's, but an unknown flag is refused naming the closest flag its subcommand takes."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            sub = next((a.choices.get(getattr(parsed, a.dest, None)) for a in self._actions
                        if isinstance(a, argparse._SubParsersAction)), None)
            (sub or self).error(unknown_flag(extra, sub or self))
        return parsed


def unknown_flag(extra: list[str], parser: argparse.ArgumentParser) -> str:
    """``unknown flag --x; did you mean --y? valid flags: ...`` for the first of ``extra`` that looks like a flag."""
    flag = next((a.split("=", 1)[0] for a in extra if a.startswith("-")), None)
    if flag is None:
        return f"unrecognized arguments: {' '.join(extra)}"
    actions = [[s for s in a.option_strings if s.startswith("--")] for a in parser._actions]
    names = {s.lstrip("-"): s for flags in actions for s in flags}  # compared without the dashes they all share
    close = difflib.get_close_matches(flag.lstrip("-"), list(names), n=1)
    hint = f"; did you mean {names[close[0]]}?" if close else ";"
    return f"unknown flag {flag}{hint} valid flags: {', '.join(flags[0] for flags in actions if flags)}"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; valid choices: a positive integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive; valid choices: a positive integer")
    return value

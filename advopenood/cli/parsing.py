"""Argument parsing shared by the CLI and the OpenOOD bridge: one-line errors (exit 2), positive integers."""
from __future__ import annotations

import argparse

from advopenood.errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (a UsageError, exit 2) instead of usage + error."""

    def error(self, message: str) -> None:
        raise UsageError(f"{self.prog}: {message}")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; valid choices: a positive integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive; valid choices: a positive integer")
    return value

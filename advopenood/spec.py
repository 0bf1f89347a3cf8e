"""The base of every typed settings object of a run (the config's sections, the data and model specs)."""
from __future__ import annotations

import difflib

from pydantic import BaseModel, ConfigDict

from advopenood.errors import choice_list


class StrictModel(BaseModel):
    """Strict (an unknown key is an error) and frozen (read by attribute, never changed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def choice_message(what: str, value: str, valid: list[str], listing: str = "") -> str:
    """``unknown <what> 'x'; did you mean 'y'? valid choices: ...`` (the hint only when one is close; a long list is
    cut, pointing at the command ``listing`` that shows it all: :func:`advopenood.errors.choice_list`)."""
    close = difflib.get_close_matches(value, valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    return f"unknown {what} {value!r}{hint} valid choices: {choice_list(valid, listing)}"

"""Errors that the CLI turns into one clear line and exit code 2."""
import difflib


class UsageError(ValueError):
    """Bad input from the user: an unknown name, a value out of range, a missing file.

    The message names the bad value and the valid choices; the CLI prints it on one line
    and exits with code 2, without a traceback.
    """


#: The most names a message lists; longer lists end with a count and where to see them all.
MAX_CHOICES = 20


def choice_list(valid: list[str], listing: str = "") -> str:
    """``valid`` joined by commas; a longer list than :data:`MAX_CHOICES` shows its shortest names (the base plugins:
    generated ones have longer names), then ``... and N more`` and, when given, the command ``listing`` that shows
    them all."""
    if len(valid) <= MAX_CHOICES:
        return ", ".join(valid)
    shown = sorted(sorted(valid, key=lambda n: (len(n), n))[:MAX_CHOICES])
    more = f", ... and {len(valid) - len(shown)} more"
    return ", ".join(shown) + (f"{more}; see `{listing}`" if listing else more)


def choice_message(what: str, value: str, valid: list[str], listing: str = "") -> str:
    """``unknown <what> 'x'; did you mean 'y'? valid choices: ...`` (the hint only when one is close; a long list is
    cut, pointing at the command ``listing`` that shows it all: :func:`choice_list`)."""
    close = difflib.get_close_matches(value, valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    return f"unknown {what} {value!r}{hint} valid choices: {choice_list(valid, listing)}"

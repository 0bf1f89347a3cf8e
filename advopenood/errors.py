"""Errors that the CLI turns into one clear line: bad input (exit code 2) and a file system that takes no more
writes (exit code 3, the run's failure)."""
import difflib
import errno


class UsageError(ValueError):
    """Bad input from the user: an unknown name, a value out of range, a missing file.

    The message names the bad value and the valid choices; the CLI prints it on one line
    and exits with code 2, without a traceback.
    """


#: the errnos of a file system that cannot take the run's writes -> what the one line says
STORAGE_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only",
                  errno.EDQUOT: "the disk quota is exceeded"}


class StorageError(RuntimeError):
    """A write failed because the file system is full, read-only or over quota (:data:`STORAGE_ERRNOS`).

    It is the run's failure, never a plugin's: nothing is committed, the previous outputs stay as they were, and
    the CLI prints the one-line message (what and where) and exits with code 3. A commit that cannot complete for
    any reason, undone, is one too (:class:`advopenood.io.CommitError`)."""


def storage_error(exc: BaseException | None) -> OSError | None:
    """The :class:`OSError` of :data:`STORAGE_ERRNOS` that ``exc`` is or was raised from (its ``__cause__`` or
    ``__context__`` chain, so a plugin that wraps the error does not hide it); None when there is none."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def reraise_storage_error(exc: BaseException) -> None:
    """Raise ``exc`` again when a full, read-only or over-quota file system is behind it (:func:`storage_error`):
    the places that turn a plugin's exception into that plugin's failure call this first."""
    if storage_error(exc) is not None:
        raise exc


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


def shown(value: str) -> str:
    """A name as a message quotes it: whole up to 60 characters, else its ends and its length."""
    return repr(value) if len(value) <= 60 else f"'{value[:32]}...{value[-20:]}' ({len(value)} characters)"


def choice_message(what: str, value: str, valid: list[str], listing: str = "") -> str:
    """``unknown <what> 'x'; did you mean 'y'? valid choices: ...`` (the hint only when one is close, or when the
    value in lower case is valid: names are case-sensitive; a long list is cut, pointing at the command ``listing``
    that shows it all: :func:`choice_list`)."""
    if value.lower() != value and value.lower() in valid:
        hint = f"; did you mean {value.lower()!r} (names are case-sensitive)?"
    else:
        close = difflib.get_close_matches(value, valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ";"
    return f"unknown {what} {shown(value)}{hint} valid choices: {choice_list(valid, listing)}"

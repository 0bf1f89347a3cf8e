"""Errors that the CLI turns into one clear line and exit code 2."""


class UsageError(ValueError):
    """Bad input from the user: an unknown name, a value out of range, a missing file.

    The message names the bad value and the valid choices; the CLI prints it on one line
    and exits with code 2, without a traceback.
    """

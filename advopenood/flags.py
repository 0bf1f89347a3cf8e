"""What a flag's value must be, checked without torch or any plugin (the CLI refuses a bad one at once,
:mod:`advopenood.cli.precheck`; the config schema checks the same values with the same rules)."""
from __future__ import annotations

import math
from fractions import Fraction

from advopenood.errors import UsageError

#: the 95 % interval methods of ``ci.method`` / ``--ci`` (:mod:`advopenood.evaluation.intervals`)
CI_METHODS = ("bootstrap", "delong", "none")
#: the fewest bootstrap resamples per cell (``ci.resamples`` / ``--ci-resamples``)
MIN_RESAMPLES = 100
#: the most resamples a plan may ask for, under any method: 50 times the default, whose Monte Carlo error on the
#: interval's ends is already below the tables' precision; above it the time (the oracle's re-derivation most of
#: all), not the answer, grows (docs/concepts.md, "Intervals")
MAX_RESAMPLES = 100_000


def too_few_resamples(value: int) -> str:
    """Why ``value`` resamples are refused for a bootstrap (the plan's and the CLI's one message)."""
    return (f"{value} resamples are too few for a bootstrap: its percentiles would be too coarse for a 95 % interval; "
            f"valid choices: at least {MIN_RESAMPLES}, or ci.method delong or none, which draw no resamples")


def parse_eps(text: str | float) -> float:
    """``0.03``, ``8/255`` -> float; a UsageError names the bad value."""
    try:
        value = float(Fraction(str(text).strip())) if "/" in str(text) else float(text)
    except ZeroDivisionError:
        raise UsageError(f"eps {text!r} has a zero denominator; valid choices: a float in (0, 1] or a fraction like "
                         "8/255") from None
    except ValueError:
        raise UsageError(f"eps {text!r} is not a number; valid choices: a float in (0, 1] or a fraction like 8/255") from None
    if not math.isfinite(value):  # float("nan"), float("inf"): a saved plan would write them as null
        raise UsageError(f"eps {text!r} is not a finite number; valid choices: a float in (0, 1] or a fraction like "
                         "8/255")
    return value

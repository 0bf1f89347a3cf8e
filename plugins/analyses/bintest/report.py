"""The ``bintest`` analysis's report section: the summary table and one reading per attack and test."""
from __future__ import annotations

from typing import Any

import pandas as pd

from advopenood.plugin import Bullets, Paragraph, Section, Table, eps_label, guarded, join, name as label


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _as_pct(value: Any) -> float:
    v = float(value)
    return 100.0 * v if v <= 1.0 else v


def read_bintest(bintest: pd.DataFrame) -> list[str]:
    """Which attacks pass the binarization test, which fail, which are inconclusive (and why)."""
    passed, failed, unclear = [], [], []
    for r in bintest.to_dict("records"):
        attack = label(r["attack"])
        detail = f"ASR {_as_pct(r['asr']):.0f} % vs random {_as_pct(r['random_asr']):.0f} %"
        if _flag(r["inconclusive"]):
            unclear.append(f"{attack} ({detail})")
        elif _flag(r["passed"]):
            passed.append(f"{attack} ({detail})")
        else:
            failed.append(f"{attack} ({detail})")
    out = []
    if passed:
        out.append(f"{join(passed)} {'passes' if len(passed) == 1 else 'pass'} the binarization test: the attack "
                   "finds adversarial examples that provably exist.")
    if failed:
        out.append(f"{join(failed)} {'fails' if len(failed) == 1 else 'fail'} it (ASR below 95 %): results obtained "
                   "with it may overstate robustness.")
    if unclear:
        out.append(f"The test is inconclusive for {join(unclear)}: the random baseline exceeds 75 %, so the binary "
                   "problem is too easy (raise n_inner).")
    return out


def bintest_section(bintest: pd.DataFrame) -> Section:
    """``Binarization test``: one row per attack (ASR against the random baseline, passed, inconclusive)."""
    table = bintest.copy()
    table["eps"] = [eps_label(e) for e in table["eps"]]
    keep = [c for c in ("attack", "test", "norm", "eps", "n", "n_skipped", "asr", "random_asr", "passed",
                        "inconclusive", "kappa", "n_inner") if c in table]
    return Section("Binarization test", [
        Paragraph("Zimmermann et al.: an attack passes when it reaches ASR >= 0.95 on binary problems where an "
                  "adversarial example provably exists, and the test is conclusive when random points succeed at "
                  "most 75 % of the time."),
        Table(table[keep]), Bullets(read_bintest(bintest))])


def bintest_sections(bintest: pd.DataFrame) -> list[Section]:
    """The report's ``Binarization test`` from ``bintest.csv`` as written (none without a row); the run builds it
    from the table it writes, ``advopenood verify`` from the CSV (``report_sections``)."""
    return guarded("Binarization test", lambda: [bintest_section(bintest)]) if len(bintest) else []

"""The ``transfer`` analysis's report section: its table and one reading per adversary."""
from __future__ import annotations

import pandas as pd

from advopenood.plugin import Bullets, Paragraph, Section, Table, fmt, guarded, name as label


def read_transfer(table: pd.DataFrame) -> list[str]:
    """Per surrogate and data fraction: each attack's transfer ASR and each detector's defense accuracy
    improvement, as the table holds them. None is called the highest or the most: the table has no paired test of
    one attack or detector against another."""
    out = []
    for (surrogate, fraction), part in table.groupby(["surrogate", "data_fraction"], sort=False):
        line = f"{surrogate} surrogate, {fmt(fraction)} % of the training data (up to {int(part['n'].max())} " \
               "attacked test images): "
        asr = part.dropna(subset=["asr"])
        if asr.empty:
            out.append(line + "nothing to attack.")
            continue
        line += "transfer ASR " + ", ".join(f"{r['attack']} {r['asr']:.1f} %" for r in
                                            asr.drop_duplicates("attack").to_dict("records"))
        scored = part.dropna(subset=["improvement"])
        scored = scored[scored["detector"].astype("string").fillna("") != ""]
        gains = [f"{label(r['detector'])} on {r['attack']} {r['improvement']:+.1f} points" for r in
                 scored.to_dict("records")]
        if gains:
            line += "; defense accuracy improvement " + ", ".join(gains)
        out.append(line + ".")
    return out


def transfer_section(table: pd.DataFrame) -> Section:
    """``Black-box transfer``: transfer ASR and defense accuracy per surrogate, attack and detector."""
    protocols = set(table["protocol"].astype(str)) if "protocol" in table else {"strong"}
    adversary = ("the adversary is Mahmood et al.'s CIFAR-10 one as their code runs it (protocol mahmood2021): "
                 "each defense is attacked by its own adversary and compared with the vanilla network attacked by "
                 "its own (rows without a detector), so an improvement can be negative; the deviations column "
                 "lists where it differs from the authors' code" if protocols == {"mahmood2021"} else
                 "the adversary is ours (protocol " + ", ".join(sorted(protocols)) + "), weaker than the paper's, "
                 "and every detector is scored on the same examples; its numbers are not comparable with the paper's")
    return Section("Black-box transfer", [
        Paragraph("Mahmood et al., Beware the Black-Box: adversarial examples crafted on a surrogate (pure: trained on "
                  "the true labels; mixed: labels queried from the target, rejected queries dropped) and submitted to "
                  "the target; " + adversary + ". Every metric is on the n test images the row's adversary attacked. "
                  "asr: transfer success rate; undefended_acc = 100 - asr; defense_acc: share handled correctly "
                  "(right label or rejected); vanilla_acc: the vanilla network's defense accuracy; improvement = "
                  "defense_acc - vanilla_acc; percent."),
        Table(table.drop(columns=["deviations"], errors="ignore")), Bullets(read_transfer(table)),
        *[Paragraph(f"Deviations from the authors' adversary: {text}.") for text in
          (table["deviations"].dropna().astype(str).unique() if "deviations" in table else []) if text]])


def transfer_sections(table: pd.DataFrame) -> list[Section]:
    """The report's ``Black-box transfer`` from ``transfer.csv`` as written (none without a row); the run builds it
    from the table it writes, ``advopenood verify`` from the CSV (``report_sections``)."""
    return guarded("Black-box transfer", lambda: [transfer_section(table)]) if len(table) else []

"""The one spelling of every name the report shows: detector, attack and set names in a shown table as sentences
write them (:func:`displayed`, :func:`advopenood.claims.name`), and the family an attack belongs to
(:func:`attack_family`, what "What ran" groups the adversarial sets by)."""
from __future__ import annotations

import pandas as pd

from advopenood import registry
from advopenood.claims import name


#: the columns of a shown table whose cells are detector, attack or set names (:func:`displayed`)
NAME_COLUMNS = ("detector", "detector_a", "detector_b", "attack", "ood_set", "set", "OOD set", "baseline")


def displayed(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (index kept as the first column when named) with every name spelled as sentences spell it
    (:func:`~advopenood.claims.name`): its column headers, and the cells of its :data:`NAME_COLUMNS`; the report's
    tables and ``tables.tex`` show it."""
    if df.index.name is not None:
        df = df.reset_index()
    df = df.copy()
    for i, c in enumerate(df.columns):
        if str(c) in NAME_COLUMNS:
            df.isetitem(i, [name(v) if isinstance(v, str) else v for v in df.iloc[:, i]])
    df.columns = [name(c) for c in df.columns]
    return df


def attack_family(attack: str) -> str:
    """The family an attack belongs to, as ``What ran`` names it: the pattern of the registered family that
    generates the name (the longest prefix that matches, e.g. ``robust_apgd_id_<detector>``), else the attack's own
    name."""
    found = [f for f in registry.families("attacks").values() if attack.startswith(f.prefix) and attack != f.prefix]
    return max(found, key=lambda f: len(f.prefix)).pattern if found else attack

"""The robust-AUROC table, a product several evaluators read (``robust_auroc`` writes it, ``ood`` and ``levels``
read it): defined in the core, :mod:`advopenood.evaluation.shared`, public through :mod:`advopenood.plugin`
(``from advopenood.plugin import ROBUST_TABLE``); re-exported here for the built-ins that import it from the kit.
"""
from __future__ import annotations

from advopenood.plugin import (  # noqa: F401
    ROBUST_COLUMNS as COLUMNS, ROBUST_METRICS, ROBUST_TABLE, attack_family, cells_of, close_eps, robust_attack,
    robust_intervals, robust_metrics, robust_pairs, robust_table, shared_cells)

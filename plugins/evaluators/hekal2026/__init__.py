"""The ``hekal2026`` evaluator: ROSS's Table 2 (Hekal et al. 2026) from the ``hekal_min`` / ``hekal_max`` sets."""

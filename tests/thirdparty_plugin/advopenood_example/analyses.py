"""An analysis with its own table and report section: the size of the successful perturbations."""
from __future__ import annotations

import pandas as pd

from advopenood.plugin import Paragraph, Results, RunContext, Section, Table

TITLE = "Perturbation size (example plugin)"


class PerturbationSize:
    """Mean L2 and Linf norm of each attack's successful perturbations (example third-party analysis)."""

    def __call__(self, ctx: RunContext) -> Results:
        rows = []
        for name, adv in ctx.adv_sets.items():
            ok = adv.records[adv.records["success"].astype(bool)]
            rows.append({"attack": name, "n_success": len(ok), "n": len(adv.records),
                         "mean_l2": float(ok["l2"].mean()) if len(ok) else float("nan"),
                         "mean_linf": float(ok["linf"].mean()) if len(ok) else float("nan")})
        table = pd.DataFrame(rows, columns=["attack", "n_success", "n", "mean_l2", "mean_linf"])
        text = [Paragraph(f"{r.attack} succeeds on {r.n_success} of {r.n} images" +
                          (f" with a mean L2 of {r.mean_l2:.3f}." if r.n_success else "."))
                for r in table.itertuples()]
        return Results(tables={"pertnorm.csv": table}, sections=[Section(TITLE, [Table(table), *text])])

"""A report that fits a reader, on hand-made tables (no data needed): plots sized to their content, long tables and
lists shortened in report.html with the rest linked, tables.tex with one page per float and budgets as k/255, and
the headline's ranks from the paired tests."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from advopenood.outputs.latex import PAGE_ROWS, latex_table
from advopenood.outputs.plots import chance_mask, plot_auroc_heatmap, plot_roc
from advopenood.outputs.report import MAX_ITEMS, TOP_ROWS, write_report
from advopenood.outputs.results import Bullets, Section, Table, write_sections
from advopenood_plugins.evaluators.ood.headline import rank_ranges, rank_text

DPI = 120  # advopenood.io.save_figure's
PAGE_PX = 1340  # report.html's widest content


def _ood(detectors: list[str], n_natural: int, n_attacks: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for d in detectors:
        for i in range(n_natural + n_attacks):
            a = float(rng.uniform(0, 100))
            natural = i < n_natural
            rows.append({"dataset": "cifar10", "arch": "resnet20", "attack": "none" if natural else
                         f"robust_ood_msp-set{i}", "eps": 8 / 255, "detector": d, "backend": "x", "ood_set": f"set{i}",
                         "auroc": a, "auroc_lo": a - 4, "auroc_hi": a + 4})
    return pd.DataFrame(rows)


def test_a_heatmap_of_three_detectors_and_eighteen_sets_keeps_its_labels_readable():
    """3 x 18 (the run of the issue): the sets become the rows, so the figure is narrower than the page and is shown
    at its own size; every label is 8 pt (13 px at 120 dpi), not scaled down to 5 px."""
    ood = _ood(["msp", "knn", "smoothed_msp"], 2, 16)
    fig = plot_auroc_heatmap(ood, chance_mask(ood))
    ax = fig.axes[0]
    width_px = fig.get_size_inches()[0] * DPI
    assert width_px <= PAGE_PX
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["set0", "set1"] and len(ax.get_yticklabels()) == 18
    assert all(t.get_fontsize() >= 8 for t in [*ax.get_xticklabels(), *ax.get_yticklabels()])
    wide = plot_auroc_heatmap(_ood([f"d{i}" for i in range(19)], 3, 4))  # the demo: detectors stay the rows
    assert len(wide.axes[0].get_yticklabels()) == 19 and wide.get_size_inches()[0] * DPI <= PAGE_PX


def test_the_roc_legend_sits_beside_the_curves_however_many_sets():
    rng = np.random.default_rng(1)
    sets = {f"robust_ood_msp-set{i}": rng.normal(0.1 * i, 1, 60) for i in range(17)}
    fig = plot_roc(rng.normal(1, 1, 60), sets, "msp", list(sets)[2:])
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    ax = fig.axes[0]
    legend, box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert len(ax.get_legend().get_texts()) == 18
    assert legend.x0 >= box.x1  # wholly to the right of the axes: no curve hidden
    assert fig.get_size_inches()[1] * DPI >= legend.height  # the figure is tall enough for it


@pytest.mark.parametrize("eps, shown", [(16 / 255, "16/255"), (8 / 255, "8/255"), (0.05, "0.05"), (math.nan, "")])
def test_tables_tex_writes_budgets_as_grey_levels(eps, shown):
    tex = latex_table(pd.DataFrame({"attack": ["pgd"], "eps": [eps], "asr": [97.5]}), "asr.csv")
    row = re.search(r"\\midrule\n(.*?)\\\\", tex).group(1)
    assert [c.strip() for c in row.split("&")] == ["PGD", shown, "97.50"]  # the one spelling (issue 50)


def test_a_table_wider_than_a_column_is_split_by_columns_never_scaled():
    wide = latex_table(pd.DataFrame({"name": ["a", "b"], **{f"c{i}": [1.5, 2.5] for i in range(18)}}), "asr.csv")
    narrow = latex_table(pd.DataFrame({"name": ["a", "b"], **{f"c{i}": [1.5, 2.5] for i in range(2)}}), "x.csv")
    assert "resizebox" not in wide and wide.count("\\begin{table}") > 1 and "columns 1 of" in wide
    assert all(row.startswith("name &") for row in re.findall(r"\\toprule\n(.*)", wide))  # the key in every float
    assert narrow.count("\\begin{table}") == 1


def test_a_table_longer_than_a_page_is_split_by_rows_never_a_longtable():
    short = latex_table(pd.DataFrame({"x": np.arange(PAGE_ROWS, dtype=float)}), "short.csv")
    long = latex_table(pd.DataFrame({"x": np.arange(PAGE_ROWS + 1, dtype=float)}), "long.csv")
    assert short.count("\\begin{table}") == 1 and "longtable" not in short + long
    assert long.count("\\begin{table}") == 2 and f"rows {PAGE_ROWS + 1}-{PAGE_ROWS + 1} of {PAGE_ROWS + 1}" in long


def test_long_tables_and_lists_are_shortened_in_the_html_and_whole_in_markdown(tmp_path):
    rows = pd.DataFrame({"pair": [f"p{i}" for i in range(200)], "delta": np.linspace(9, -9, 200)})
    rows.to_csv(tmp_path / "pairs.csv", index=False)
    readings = [f"Reading number {i}." for i in range(40)]
    headline = Section("Headline", [Table(rows.head(3), "top")], source="x", headline=True)
    details = Section("Pairs", [Table(rows, "all pairs", whole="pairs.csv"), Bullets(readings)], source="x")
    write_sections(tmp_path, [details, headline])
    md = write_report(tmp_path).read_text()
    page = (tmp_path / "report.html").read_text()
    body = page.split("<body>", 1)[1]
    assert body.index("<h2>Headline</h2>") < body.index("<table>") < body.index('<details class="section">')
    assert re.search(r"<details class=\"section\"><summary><h2>Pairs</h2></summary>", page)
    shown = re.findall(r"<table>(.*?)</table>", page, re.S)[1]
    assert shown.count("<tr>") == TOP_ROWS + 1 and f"the first {TOP_ROWS} of 200 rows; all in pairs.csv" in page
    assert '<a href="pairs.csv">' in page and "[pairs.csv](pairs.csv)" in md
    assert sum(r in page for r in readings) == MAX_ITEMS and f"and {40 - MAX_ITEMS} more" in page
    assert all(f"- {r}" in md for r in readings)
    assert md.index("## Headline") < md.index("## Pairs")


def _pairs(rows: list[tuple[str, str, float, bool | None]]) -> pd.DataFrame:
    """Pairs whose simultaneous test (``p_holm``) shows a difference (True), does not (False) or is missing (None)."""
    return pd.DataFrame([{"detector_a": a, "detector_b": b, "ood_set": "s", "delta_auroc": d, "significant": sig,
                          "p_holm": math.nan if sig is None else (0.01 if sig else 0.5)} for a, b, d, sig in rows])


def test_ranks_come_from_the_paired_tests_not_from_overlapping_intervals():
    aurocs = pd.Series({"a": 90.0, "b": 80.0, "c": 70.0, "d": math.nan})
    # a > b shown, b > c shown, a vs c not shown (tests need not be transitive)
    ranks = rank_ranges(aurocs, _pairs([("a", "b", 10, True), ("b", "c", 10, True), ("a", "c", 20, False)]), "s")
    assert {d: rank_text(r) for d, r in ranks.items()} == {"a": "#1-2", "b": "#2", "c": "#2-3"}
    none = rank_ranges(aurocs, _pairs([("a", "b", 10, None)]), "s")  # no decided test: point estimates, marked
    assert {d: rank_text(r) for d, r in none.items()} == {"a": "#1?", "b": "#2?", "c": "#3?"}
    flipped = rank_ranges(aurocs, _pairs([("b", "a", -10, True)]), "s")  # the sign says who is higher
    assert rank_text(flipped["a"]) == "#1-2" and rank_text(flipped["b"]) == "#2-3"

"""tables.tex compiles into a paper: every float fits the ``\\linewidth`` of a one-column and of a two-column
``article`` (pdflatex's log has no overfull box over 1 pt), numbers in siunitx ``S`` columns, never scaled (issue 50,
item 6). Skipped, with the reason, where pdflatex (with booktabs and siunitx) is not installed."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from advopenood.outputs.latex import flush_floats, latex_table, write_latex

#: what the wrappers need: texlive-latex-recommended (booktabs) and texlive-science (siunitx), e.g. with apt
NEEDS = "pdflatex with booktabs and siunitx (apt-get install texlive-latex-extra texlive-science)"
WRAPPER = ("\\documentclass[{options}]{{article}}\n\\usepackage{{booktabs}}\n\\usepackage{{siunitx}}\n"
           "\\begin{{document}}\n\\input{{{tables}}}\n\\end{{document}}\n")


def _pdflatex() -> str | None:
    """pdflatex's path where it and the packages the wrappers load are installed."""
    exe = shutil.which("pdflatex")
    kpse = shutil.which("kpsewhich")
    if exe is None or kpse is None:
        return None
    found = subprocess.run([kpse, "booktabs.sty", "siunitx.sty"], capture_output=True, text=True).stdout.split()
    return exe if len(found) == 2 else None


def overfull(tables: Path, options: str, tmp: Path) -> list[str]:
    """The overfull boxes over 1 pt in pdflatex's log of ``tables`` in an ``article`` with ``options``."""
    exe = _pdflatex()
    if exe is None:
        pytest.skip(f"needs {NEEDS}")
    doc = tmp / f"wrap-{options or 'onecolumn'}.tex"
    doc.write_text(WRAPPER.format(options=options, tables=tables.resolve().as_posix()))
    done = subprocess.run([exe, "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=tmp,
                          capture_output=True, text=True, timeout=120)
    log = doc.with_suffix(".log").read_text(errors="replace")
    assert done.returncode == 0, log[-3000:]
    return [line for line in log.splitlines() if (m := re.match(r"Overfull \\hbox \(([\d.]+)pt too wide\)", line))
            and float(m.group(1)) > 1.0]


@pytest.mark.parametrize("options", ["", "twocolumn"])
def test_the_demos_tables_fit_a_one_and_a_two_column_article(small_demo_run, options, tmp_path):
    """The (small) demo's tables.tex: the headline (AUROC with intervals and ranks per detector and set) and asr.csv,
    in floats that fit, never scaled (no resizebox) and never a longtable (a two-column document refuses one)."""
    tex = small_demo_run[0] / "tables.tex"
    text = tex.read_text()
    assert "resizebox" not in text and "longtable" not in text and "S[table-format=" in text
    assert overfull(tex, options, tmp_path) == []


def _robust_like(n_detectors: int, n_sets: int) -> pd.DataFrame:
    """A robust run's headline as its evaluator writes it: per detector and OOD set the robust AUROC with both sides
    attacked, the ID side only, the OOD side only and clean, each ``est [lo, hi]`` (the widest values: 100.0)."""
    rows = []
    for d in range(n_detectors):
        for s in range(n_sets):
            rows.append({"detector": f"ROSS_NNGUIDE{d}", "ood_set": f"tinyimagenet{s}",
                         **{k: "100.0 [100.0, 100.0]" for k in ("both", "id_only", "ood_only", "clean")},
                         "masking_suspected": "no", "budget": "8/255"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("options", ["", "twocolumn"])
def test_a_wide_long_table_is_split_into_floats_that_fit(options, tmp_path):
    """A robust-style headline of 17 detectors x 12 sets (204 rows, four interval columns, long names): split by
    rows and columns into floats that each fit, the detector and the set in each, and placed in groups (LaTeX holds
    at most 18 floats it has not placed)."""
    table = _robust_like(17, 12)
    tex = tmp_path / "robust.tex"
    tex.write_text(flush_floats(latex_table(table, "robust_auroc.csv", "Robust AUROC")))
    text = tex.read_text()
    assert text.count("\\begin{table}") > 18 and "\\clearpage" in text and "longtable" not in text
    assert all(row.startswith("detector & ood\\_set &") for row in re.findall(r"\\toprule\n(.*)", text))
    assert overfull(tex, options, tmp_path) == []


def test_an_interval_is_a_two_line_cell_and_a_constant_column_goes_into_the_caption():
    frame = pd.DataFrame({"dataset": ["digits", "digits"], "attack": ["fgsm", "pgd"], "eps": [16 / 255, 16 / 255],
                          "asr": [97.5, 100.0], "asr_lo": [96.0, 99.3], "asr_hi": [98.4, 100.0]})
    tex = latex_table(frame, "asr.csv")
    assert "\\caption{asr.csv (dataset digits; eps 16/255)}" in tex
    assert "FGSM & 97.5 \\\\\n & {\\footnotesize [96.0, 98.4]} \\\\[2pt]" in tex  # one decimals for the three
    assert "{lS[table-format=3.1]}" in tex


def test_write_latex_names_the_packages_it_needs(small_demo_run, tmp_path):
    shutil.copytree(small_demo_run[0], tmp_path / "run")
    assert "\\usepackage{siunitx}" in write_latex(tmp_path / "run").read_text().splitlines()[1]


@pytest.mark.parametrize("options", ["", "twocolumn"])
def test_a_robust_runs_long_set_names_wrap_in_a_column_that_fits(options, tmp_path):
    """asr.csv of a robust run with the standard ensemble: its row key holds names such as
    ``robust_apgd_aux_ood_knn-fashionmnist`` (about 180 pt in ``\\small``, with the eps beside it more than a
    two-column article's 200 pt column): they are set in a ragged-right ``p`` column, broken after ``_`` and ``-``."""
    names = [f"robust_{a}_{side}_{d}" + ("-fashionmnist" if side == "ood" else "")
             for a in ("apgd", "apgd_aux", "square") for side in ("id", "ood") for d in ("msp", "mds", "knn")]
    frame = pd.DataFrame({"dataset": "cifar10", "attack": names, "eps": 8 / 255, "asr": 50.0, "asr_lo": 30.0,
                          "asr_hi": 70.0, "clean_acc": 78.12, "clean_acc_lo": 61.24, "clean_acc_hi": 88.98})
    tex = tmp_path / "asr.tex"
    tex.write_text(latex_table(frame, "asr.csv"))
    assert "p{" in tex.read_text() and "\\_\\allowbreak{}" in tex.read_text()
    assert overfull(tex, options, tmp_path) == []


def test_tables_tex_opens_on_the_section_the_report_leads_with(tmp_path):
    """A robust run's report_sections.json holds the ood headline before the robust one (evaluator order); given
    the report's lead (run.json's ``lead``: the robust table), its floats come first in tables.tex."""
    from advopenood.outputs.results import Section, Table, write_sections

    cell = pd.DataFrame({"detector": ["MSP", "KNN"], "tin": ["83.6 [72.7, 92.6]", "86.0 [75.6, 94.5]"]})
    write_sections(tmp_path, [Section("AUROC per detector and set", [Table(cell, "AUROC")], headline=True),
                              Section("Robust AUROC per detector and OOD set", [Table(cell, "Robust")], headline=True)])
    captions = re.findall(r"\\caption\{([^:]*):", write_latex(tmp_path, lead="Robust AUROC per detector and OOD set")
                          .read_text())
    assert captions == ["Robust AUROC per detector and OOD set", "AUROC per detector and set"]
    assert re.findall(r"\\caption\{([^:]*):", write_latex(tmp_path).read_text())[0] == "AUROC per detector and set"

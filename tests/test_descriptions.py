"""``advopenood list`` descriptions: the first sentence whole (an abbreviation ends none) and reST markup shown as
plain text (issue 30, item 6)."""
from __future__ import annotations

import pytest

from advopenood.cli.main import main
from advopenood.plugin_registry import _first_line


def _with_doc(doc: str) -> type:
    return type("Plugin", (), {"__doc__": doc})


@pytest.mark.parametrize("doc, expected", [
    ("DeepFool-L2 (Moosavi-Dezfooli et al. 2016), minimal perturbation. More text.",
     "DeepFool-L2 (Moosavi-Dezfooli et al. 2016), minimal perturbation."),
    ("Scores the energy (e.g. of the logits), i.e. a log-sum-exp. Second sentence.",
     "Scores the energy (e.g. of the logits), i.e. a log-sum-exp."),
    ("As in Sec. 4 of the paper, cf. Fig. 2. Then more.", "As in Sec. 4 of the paper, cf. Fig. 2."),
    ("GRAM as the paper ran it (see :mod:`advopenood_plugins.gram_legacy`). Details.",
     "GRAM as the paper ran it (see advopenood_plugins.gram_legacy)."),
    ("Wraps :class:`~advopenood.detectors.Postprocessor` with ``n`` copies and `sigma`.",
     "Wraps advopenood.detectors.Postprocessor with n copies and sigma."),
    ("One sentence wrapped\nover two lines. Another.", "One sentence wrapped over two lines."),
    ("A final sentence without a stop", "A final sentence without a stop"),
    ("First paragraph only.\n\nSecond paragraph.", "First paragraph only."),
    ("", ""),
])
def test_first_sentence_whole_and_plain(doc, expected):
    assert _first_line(_with_doc(doc)) == expected


@pytest.mark.parametrize("kind, name, fragment", [
    ("attacks", "df", "DeepFool-L2 (Moosavi-Dezfooli et al. 2016), minimal perturbation; foolbox L2DeepFoolAttack."),
    ("attacks", "pgd", "PGD-Linf (Madry et al. 2018) with foolbox LinfPGD"),
    ("detectors", "gram_legacy", "see advopenood_plugins.detectors.gram_legacy)."),
])
def test_list_shows_the_whole_sentence_without_markup(kind, name, fragment, capsys):
    assert main(["list", kind]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.split(" ", 1)[0] == name)
    assert fragment in line and "`" not in line and ":mod:" not in line

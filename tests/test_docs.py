"""The documents' links resolve, and the core imports no plugin (no data needed)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "ARCHITECTURE.md", "benchmarks/README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    body = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", body, flags=re.M)}


def local_links(doc: str) -> list[str]:
    return [t for t in LINK.findall(_prose((REPO / doc).read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: are not checked


@pytest.mark.parametrize("doc", DOCS)
def test_every_local_link_resolves(doc):
    source = REPO / doc
    assert source.is_file(), doc
    for target in local_links(doc):
        path, _, anchor = target.partition("#")
        file = (source.parent / path).resolve() if path else source
        assert file.exists(), f"{doc}: link to missing {target}"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{doc}: no heading for #{anchor} in {file.relative_to(REPO)}"


@pytest.mark.parametrize("heading, expected", [
    ("Installing OpenOOD (and the imgaug patch for NumPy 2)", "installing-openood-and-the-imgaug-patch-for-numpy-2"),
    ("Detector-adaptive attacks (`--attack adaptive`, `adaptive_<det>`)",
     "detector-adaptive-attacks---attack-adaptive-adaptive_det"),
    ("MEAD: worst-case evaluation over attack objectives", "mead-worst-case-evaluation-over-attack-objectives"),
])
def test_slug_follows_github(heading, expected):
    assert slug(heading) == expected


def test_link_parser_skips_code_and_reads_anchors(tmp_path):
    (tmp_path / "doc.md").write_text("# Top\n\n[ok](#top) [gone](docs/detectors.md) [web](https://example.org)\n"
                                     "`[inline](x.md)`\n```\n[in code](nowhere.md)\n# not a heading\n```\n")
    assert LINK.findall(_prose((tmp_path / "doc.md").read_text())) == ["#top", "docs/detectors.md",
                                                                       "https://example.org"]
    assert anchors(tmp_path / "doc.md") == {"top"}


def test_core_imports_no_plugin():
    for path in sorted((REPO / "advopenood").rglob("*.py")):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+advopenood_plugins\b", text, flags=re.M), path.name
        assert "advopenood_plugins." not in text, path.name


def test_code_names_only_documents_that_exist():
    """Repository documents named in code and tests (``docs/x.md``, ``benchmarks/README.md``) exist."""
    for path in [*(REPO / "advopenood").rglob("*.py"), *(REPO / "plugins").rglob("*.py"), *(REPO / "tests").glob("*.py")]:
        for doc in re.findall(r"\b((?:docs|benchmarks)/[\w./-]+\.md|ARCHITECTURE\.md)\b", path.read_text()):
            if path.name != "test_docs.py":
                assert (REPO / doc).is_file(), f"{path.name} names missing {doc}"

"""The documents: links resolve, every CLI flag and every registered plugin has an entry in the manual, the README
stays short, the manual builds in CI, and the core imports no plugin (no data needed)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from advopenood import plugin_index, registry

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))
DOCS = ["README.md", "ARCHITECTURE.md", "benchmarks/README.md", *PAGES]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: pymdownx.snippets: a line ``--8<-- "path"`` is replaced by the file at ``path`` (relative to the repository root)
SNIPPET = re.compile(r'^[ \t]*--8<--[ \t]+"([^"]+)"[ \t]*$', re.M)
#: the page names the other branches' sections are moved into (issue 25): kept stable
STABLE_PAGES = ["index", "getting-started", "concepts", "attacks", "detectors", "evaluators", "analyses", "openood",
                "plugins", "reproducing", "benchmarks", "troubleshooting", "cli", "architecture"]
README_MAX_LINES = 200


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def body(path: Path) -> str:
    """A page as the site shows it (the files it includes as snippets among it), without fenced code blocks."""
    return re.sub(r"^```.*?^```", "", expanded(path.read_text()), flags=re.S | re.M)


def headings(text: str) -> list[str]:
    """The headings of Markdown ``text``, as written."""
    return re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M)


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings."""
    return {slug(h) for h in headings(body(path))}


def local_links(doc: str) -> list[str]:
    return [t for t in LINK.findall(_prose((REPO / doc).read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: are not checked


def expanded(text: str) -> str:
    """A page as the docs site shows it: every snippet line replaced by the file it names."""
    return SNIPPET.sub(lambda m: (REPO / m.group(1)).read_text(), text)


def manual() -> str:
    """Every page of the manual, snippets included."""
    return "\n".join(expanded((REPO / page).read_text()) for page in PAGES)


def code_tokens(text: str) -> set[str]:
    """The words of every inline code span and fenced code block (``adaptive_<det>`` stays one word)."""
    blocks = re.findall(r"^```.*?^```", text, flags=re.S | re.M)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    return {word for part in blocks + spans for word in re.findall(r"[\w<>]+", part)}


def test_every_local_link_resolves():
    for doc in DOCS:
        source = REPO / doc
        assert source.is_file(), doc
        for target in local_links(doc):
            path, _, anchor = target.partition("#")
            file = (source.parent / path).resolve() if path else source
            assert file.exists(), f"{doc}: link to missing {target}"
            if anchor and file.suffix == ".md":
                assert anchor in anchors(file), f"{doc}: no heading for #{anchor} in {file.relative_to(REPO)}"


def test_pages_link_only_inside_the_manual():
    """A page's relative links stay in ``docs/`` (the site has nothing else; ``mkdocs build --strict`` fails)."""
    for page in PAGES:
        docs = (REPO / "docs").resolve()
        for target in local_links(page):
            path = target.partition("#")[0]
            if path:
                assert docs in (REPO / page).parent.joinpath(path).resolve().parents, f"{page}: {target} leaves docs/"


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
    for path in [*(REPO / "advopenood").rglob("*.py"), *(REPO / "plugins").rglob("*.py"), *(REPO / "tests").glob("*.py"),
                 *(REPO / "tests" / "plugins").rglob("*.py")]:
        for doc in re.findall(r"\b((?:docs|benchmarks)/[\w./-]+\.md|ARCHITECTURE\.md)\b", path.read_text()):
            if path.name != "test_docs.py":
                assert (REPO / doc).is_file(), f"{path.name} names missing {doc}"


#: a section named in code or a config: ``docs/models.md, "Title"``, ``README, 'Title'`` or ``..., section 'Title'``
SECTION_REF = re.compile(r"""\b(docs/[\w./-]+\.md|README)(?:\.md)?,\s*(?:#\s*)?(?:section\s+)?(["'])(.+?)\2"""
                         r"""(?=[),;.\s]|$)""")
SOURCES = ["setup.py", "README.md", "benchmarks/README.md",
           *(p.relative_to(REPO).as_posix() for d in ("advopenood", "plugins", "configs", "tests")
             for p in sorted((REPO / d).rglob("*")) if p.suffix in (".py", ".yaml")
             and not any(part in ("build", "dist") or part.endswith(".egg-info") or part.startswith(".")
                         for part in p.relative_to(REPO).parts))]  # sources, not what an install leaves behind


def sections(page: Path) -> set[str]:
    """A page's headings and bold lead-ins (``**224 px: not the paper's attacks.**``), as written."""
    text = body(page)
    heads = headings(text)
    return {h.strip("`") for h in heads} | set(heads) | {b.rstrip(".") for b in re.findall(r"\*\*(.+?)\*\*", text)}


def section_refs(text: str) -> list[tuple[str, str]]:
    """``(page, title)`` of every section reference in ``text``; comment lines in YAML/Python are joined first."""
    joined = re.sub(r"\n\s*#\s*", " ", re.sub(r'"\s*\n\s*"', "", text))
    return [(page, title) for page, _, title in SECTION_REF.findall(joined)]


def test_sections_named_in_code_exist():
    """Every ``docs/page.md, "Section"`` (or ``README, 'Section'``) in code, configs, tests and the READMEs names a
    heading or bold lead-in of that page: the manual moved out of the README (issue 25), and a pointer to a section
    that is not there sends a user nowhere."""
    for source in SOURCES:
        for page, title in section_refs((REPO / source).read_text()):
            if source == "tests/test_docs.py":
                continue
            path = REPO / ("README.md" if page == "README" else page)
            assert path.is_file() and title.rstrip(".") in sections(path), f"{source} names {page}, {title!r}"


@pytest.mark.parametrize("text, expected", [
    ("see docs/models.md, 'Installing robustbench'", [("docs/models.md", "Installing robustbench")]),
    ('(README, "Speed at 224 px")', [("README", "Speed at 224 px")]),
    ('# Needs robustbench: docs/models.md,\n# "Robust backbones".', [("docs/models.md", "Robust backbones")]),
    ('"(docs/concepts.md, "\n  "\'224 px: not the paper\'s attacks\')"',
     [("docs/concepts.md", "224 px: not the paper's attacks")]),
    ("docs/openood.md, section 'Installing OpenOOD'", [("docs/openood.md", "Installing OpenOOD")]),
    ("the manual, docs/models.md", []),
])
def test_section_refs_are_read(text, expected):
    assert section_refs(text) == expected


# ------------------------------------------------------------------------------------------- the manual itself


def test_readme_stays_short():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the manual (docs/) holds the rest"


def test_stable_page_exists():
    for page in STABLE_PAGES:
        assert (REPO / "docs" / f"{page}.md").is_file()


def _nav_pages(nav) -> list[str]:
    """The page files a mkdocs nav names, depth first."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return [p for item in nav for p in _nav_pages(item)]


def test_nav_names_every_page_and_only_pages():
    nav = _nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    assert sorted(nav) == sorted(p.removeprefix("docs/") for p in PAGES)


def test_snippets_name_files_that_exist():
    for page in PAGES:
        for path in SNIPPET.findall((REPO / page).read_text()):
            assert (REPO / path).is_file(), f"{page} includes missing {path}"


def test_ci_builds_the_manual_strictly():
    ci = (REPO / ".ci" / "run").read_text()
    assert "pip install -q -e '.[docs]'" in ci and re.search(r"mkdocs build --strict\b", ci)
    assert ci.index("pytest") < ci.index("mkdocs build")


# ------------------------------------------------------------------------------ every flag has an entry


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from advopenood.cli.eval_ood import build_parser as eval_ood_parser
    from advopenood.cli.main import build_parser

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    parsers = {"(top level)": top, **sub.choices}
    parsers["eval-ood"] = eval_ood_parser()  # the bridge parses its own flags (its subparser has add_help=False)
    return parsers


def cli_flags() -> list[tuple[str, str]]:
    """``(subcommand, flag)`` for every option of every subcommand of ``advopenood`` and of ``eval-ood``."""
    return sorted({(name, flag) for name, parser in _subparsers().items() for action in parser._actions
                   for flag in action.option_strings if flag.startswith("--") and flag != "--help"})


def documented_flags() -> set[tuple[str, str]]:
    """``(subcommand, flag)`` pairs of docs/cli.md: a row's first cell names the flags, its ``subcommands`` cell
    (last column) the subcommands; rows of the ``advopenood eval-ood`` section belong to ``eval-ood``."""
    pairs = set()
    section = ""
    for line in (REPO / "docs" / "cli.md").read_text().splitlines():
        if line.startswith("## "):
            section = line
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        commands = ["eval-ood"] if "eval-ood" in section else [c.strip() for c in cells[-1].split(",")]
        pairs |= {(command, flag) for flag in re.findall(r"--[a-z][a-z-]*", cells[0]) for command in commands}
    return pairs


def test_every_cli_flag_has_an_entry():
    rows = documented_flags()
    assert [f"{flag} of advopenood {command}" for command, flag in cli_flags() if (command, flag) not in rows] == [], \
        "docs/cli.md has no row for these"


def test_every_documented_flag_exists():
    assert documented_flags() <= set(cli_flags())


# --------------------------------------------------------------------------- every plugin has an entry


def plugin_names(kind: str) -> list[str]:
    """Every registered plugin of ``kind`` and every family as ``<prefix><det>`` (the plugin index: built-ins and
    third parties'), each once: a family's members are documented by its pattern (issue 51, item 4)."""
    index = plugin_index.index()
    return sorted(index[kind]) + sorted(pattern.split("<")[0] + "<det>" for pattern in index["families"][kind])


def documented(name: str, tokens: set[str]) -> bool:
    """A name is documented when it appears as code in the manual (a family's as its pattern, ``adaptive_<det>``)."""
    return name in tokens


@pytest.mark.parametrize("kind", registry.KINDS)
def test_every_registered_plugin_and_family_has_an_entry(kind):
    tokens = code_tokens(manual())
    assert [name for name in plugin_names(kind) if not documented(name, tokens)] == [], \
        f"the manual (docs/) never names these {kind}"


def test_a_family_counts_only_through_its_documented_pattern():
    tokens = code_tokens("`adaptive_<det>` and `fgsm`, and\n```\nadaptive_ood_<det>\n```\n")
    assert {"adaptive_<det>", "fgsm", "adaptive_ood_<det>"} <= tokens
    assert documented("adaptive_ood_<det>", tokens) and documented("fgsm", tokens)
    assert not documented("adaptive_apgd_<det>", tokens) and not documented("pgd", tokens)
    assert "adaptive_apgd_<det>" in plugin_names("attacks") and "adaptive_apgd_msp" not in plugin_names("attacks")


@pytest.mark.parametrize("page", ["docs/index.md", "README.md", "docs/cli.md"])
def test_every_built_in_evaluator_is_in_the_contents_and_the_cli_page(page):
    """The manual's contents, the README's table and the CLI page's --evaluator row name every built-in
    evaluator (issue 30, item 10: `smoothed` was missing)."""
    built_in = [n for n, e in registry.entries("evaluators").items() if e.source.startswith("advopenood_plugins")]
    text = (REPO / page).read_text()
    line = next(s for s in text.splitlines() if ("--evaluator" if page.endswith("cli.md") else "evaluators.md)") in s)
    assert {"ood", "smoothed"} <= set(built_in)
    assert [n for n in built_in if f"`{n}`" not in line] == []


def test_the_plugin_guide_example_takes_no_registered_name():
    """Copying the guide's inline example must not silently replace a plugin the example package or we ship."""
    guide = (REPO / "docs" / "plugins.md").read_text()
    example = re.search(r"```python\n(.*?)```", guide, re.S).group(1)
    kind, name = re.search(r'@register\("(\w+)", "(\w+)"\)', example).groups()
    assert name not in registry.names(kind), f"the guide's first example registers the taken name {name!r}"


def test_detector_counts_say_what_the_tables_hold():
    """Pages that say '16 detectors' of a run's tables also name gram_legacy (17 rows), and the README says how to
    install CPU-only torch wheels."""
    for page in ("docs/index.md", "docs/getting-started.md", "README.md"):
        text = " ".join((REPO / page).read_text().split())
        for hit in re.finditer(r"16 (?:post-hoc )?detectors", text):
            near = text[hit.start():hit.end() + 120]
            assert "gram_legacy" in near or "OpenOOD" in text[max(0, hit.start() - 20):hit.start()], (page, near)
    assert "download.pytorch.org/whl/cpu" in (REPO / "README.md").read_text()


def test_the_demo_time_is_one_figure_everywhere():
    """The demo's wall time has one source (``advopenood.cli.main.DEMO_TIME``): the CLI's help, docs/cli.md, the README
    and getting-started quote it, and it is the figure benchmarks/README.md's demo row measured."""
    from advopenood.cli.main import COMMANDS, DEMO_TIME

    bench = next(line for line in (REPO / "benchmarks" / "README.md").read_text().splitlines()
                 if line.startswith("| `advopenood demo"))
    assert f"**{DEMO_TIME}**" in bench
    assert DEMO_TIME in COMMANDS["demo"]
    for page in ("README.md", "docs/getting-started.md", "docs/cli.md"):
        text = " ".join((REPO / page).read_text().split())
        assert DEMO_TIME in text, page
        assert not re.search(r"demo[^.]*about 20 s\b", text), page


def test_getting_started_installs_and_tests_as_the_readme():
    """The one-line install and test command of getting-started is the README's (the robustbench line included)."""
    command = [line for line in (REPO / "README.md").read_text().splitlines()
               if line.startswith("python3 -m venv") and "pytest" in line]
    assert len(command) == 1 and "robustbench" in command[0]
    assert command[0] in (REPO / "docs" / "getting-started.md").read_text().splitlines()


def test_no_page_counts_16_built_in_detectors():
    """The demo scores 17 built-in detectors (OpenOOD's 16 and gram_legacy): no page says '16 built-in detectors'."""
    for doc in DOCS:
        text = " ".join((REPO / doc).read_text().split())
        assert not re.search(r"\b16 built-in detectors", text), doc


def test_the_plugin_guide_imports_from_the_public_api():
    """The guide's examples import plugin names from ``advopenood.plugin``, as its checklist asks."""
    guide = (REPO / "docs" / "plugins.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", guide, re.S))
    assert not re.search(r"^from advopenood\.(detectors|registry) import", code, re.M)


def test_the_ross_audit_states_one_number_of_seeds():
    """ross-audit.md's seed count for the findings is the benchmark's (three), the default named as such."""
    text = " ".join((REPO / "docs" / "ross-audit.md").read_text().split())
    assert "over five evaluation-noise seeds" not in text and "three evaluation-noise seeds" in text


def test_the_demo_labels_its_ood_sets_far():
    """The demo's natural OOD sets are far-OOD (the leaderboard's far columns), not 'other'."""
    from advopenood.config.loading import load_config

    plan, _ = load_config("demo")
    assert [entry.group for entry in plan.data.ood] == ["far", "far", "far"]

"""The readable run report: ``report.md`` and a self-contained ``report.html`` (plots inline as base64).

The core knows no plugin: :func:`write_report` renders ``run.json`` (the run's facts, config, timings) and the
sections that the run's evaluators and analyses returned, saved in ``report_sections.json``
(:mod:`advopenood.outputs.results`), followed by any plot under ``plots/`` that no section shows. The first section is
the core's own, the attack success rates of ``asr.csv`` (:func:`asr_section`). Every plugin generates its
sections' text from its numbers; the helpers here (:func:`name`, :func:`eps_label`, :func:`fmt`, :func:`join`,
:func:`pct`) keep their wording uniform. The report is built once as a list of blocks and rendered twice, to
Markdown and to HTML.
"""
from __future__ import annotations

import base64
import html
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import yaml

from advopenood import io as aio
from advopenood.claims import Claim, eps_label, name, where_asr  # one rule for the report and its claims
from advopenood.outputs.names import attack_family, displayed
from advopenood.outputs.plots import PLOT_DIR
from advopenood.outputs.results import (
    Bullets,
    Figure,
    Paragraph,
    Section,
    Table,
    read_sections,
)

CHANCE = 50.0


#: a table with a ``whole`` file and more rows than this is shown as its first :data:`TOP_ROWS` rows and a link to the CSV
MAX_ROWS = 25
TOP_ROWS = 10
#: a list with more items than this shows its first :data:`MAX_ITEMS` and folds the rest
MAX_ITEMS = 12


@dataclass(frozen=True)
class Block:
    """One report element: ``kind`` is ``h1``, ``h2``, ``h3``, ``p``, ``ul``, ``table``, ``code``, ``img`` (a PNG
    path), ``fold`` (a section: its blocks, folded in the HTML under ``caption``) or ``more`` (the rest of a long
    list); ``caption`` labels tables and images; ``link`` is the file that holds all of a table shown in part."""

    kind: str
    content: Any
    caption: str = ""
    link: str = ""


# ----------------------------------------------------------------------------------------------- formatting

def fmt(value: Any) -> str:
    """A table cell: NaN empty, floats to 3 significant digits below 1 and 1-2 decimals above."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:.1f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def decimals(values: list[Any]) -> int | None:
    """The one number of decimals of a column's floats, from its largest magnitude as :func:`fmt` shows it (1 from
    100 up, 2 from 1, else 3 significant digits; 0 when every float is whole); None without a float."""
    floats = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v)]
    if not floats:
        return None
    top = max(floats)
    if all(v.is_integer() for v in floats):
        return 0
    if top >= 100:
        return 1
    if top >= 1:
        return 2
    return min(6, 2 - math.floor(math.log10(top)))


def format_column(values: list[Any]) -> list[str]:
    """A column's cells as strings, every float with the column's :func:`decimals` (NaN empty)."""
    places = decimals(values)
    return [("" if math.isnan(v) else f"{v:.{places}f}") if isinstance(v, float) and places is not None else fmt(v)
            for v in values]


def _cells(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every cell formatted as a string, a fixed number of decimals per column and every name
    :func:`displayed`."""
    df = displayed(df)
    return pd.DataFrame({str(c): format_column(df.iloc[:, i].tolist()) for i, c in enumerate(df.columns)})


def join(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def pct(value: float) -> str:
    """A percentage to one decimal: ``12.5 %``."""
    return f"{value:.1f} %"


# ------------------------------------------------------------------------------------------------- readings

def read_asr(asr: pd.DataFrame) -> list[str | Claim]:
    """Clean accuracy, and per budget each attack's success rate as a ``value`` claim with its Wilson interval as
    asr.csv holds it. No attack is called the strongest: the rates are not compared by a paired test on the same
    images, so none is ranked (issue 40)."""
    out: list[str | Claim] = []
    acc = asr["clean_acc"].dropna()
    if len(acc):
        n = int(asr["n"].iloc[0])
        out.append(f"The classifier's clean accuracy is {pct(float(acc.iloc[0]))} on {n} ID images.")
    rows = asr.dropna(subset=["asr"])
    for r in rows.to_dict("records"):
        key = tuple((k, _key(r[k])) for k in ("attack", "eps") if k in r)
        out.append(Claim("value", "asr.csv", key, ("asr", "asr_lo", "asr_hi"), where_asr(r["attack"], r.get("eps")),
                         float(r["asr"]), _float(r.get("asr_lo")), _float(r.get("asr_hi")), _key(r.get("ci")),
                         about="asr"))
    if len(rows) > 1:
        out.append("The attacks are not ranked: their success rates are not compared by a paired test on the same "
                   "images, and overlapping or separate intervals are no such test.")
    return out


def _key(value: Any) -> str:
    """A cell as the CSV reads back as text (``""`` for a missing one)."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _float(value: Any) -> float:
    """A cell as a float (NaN for a missing one)."""
    return math.nan if value is None or pd.isna(value) else float(value)


# ------------------------------------------------------------------------------------------------- sections

def _ci_fact(ci: dict[str, Any] | None) -> str | None:
    """The run's interval method as the report's run table states it (None for a run written before intervals)."""
    if not ci:
        return None
    method = str(ci.get("method"))
    return {"bootstrap": f"stratified percentile bootstrap, {ci.get('resamples')} resamples, seeded per cell",
            "delong": "DeLong (AUROC only)", "none": "none"}.get(method, method)


def _run_section(info: dict[str, Any]) -> list[Block]:
    blocks = [Block("h2", "Run")]
    settings = info.get("config") or {}
    facts = {"seed": info.get("seed"), "dataset": (settings.get("data") or {}).get("dataset"),
             "model": (info.get("model") or {}).get("arch"),
             "weights sha256": str((info.get("model") or {}).get("weights_sha256", ""))[:16],
             "ID images": ((info.get("data") or {}).get("id") or {}).get("n"),
             "clean accuracy (%)": info.get("clean_acc"), "detector backend": info.get("detector_backend"),
             "95 % intervals": _ci_fact(settings.get("ci")),
             "attack shards generated / reused": " / ".join(str((info.get("attack_work") or {}).get(k, "?"))
                                                            for k in ("shards_generated", "shards_reused"))
             if info.get("attack_work") else None}
    facts = {k: v for k, v in facts.items() if v not in (None, "")}
    if facts:
        blocks.append(Block("table", pd.DataFrame({"item": list(facts), "value": [fmt(v) for v in facts.values()]})))
    if info.get("versions"):
        blocks.append(Block("table", pd.DataFrame({"package": list(info["versions"]),
                                                   "version": [str(v) for v in info["versions"].values()]}),
                            "versions"))
    if info.get("attacks"):
        rows = [{"set": k, "attack": v.get("attack"), "cache key": str(v.get("key", ""))[:16],
                 "params": json.dumps(v.get("params", {}), sort_keys=True, default=str),
                 "generated": v.get("generated"), "reused": v.get("reused")} for k, v in info["attacks"].items()]
        sets = pd.DataFrame(rows)
        sets = sets[[c for c in sets.columns if sets[c].map(lambda v: v not in (None, "")).any()]]
        blocks.append(Block("table", sets, "adversarial sets (cache keys)"))
    timings = info.get("timings_s") or info.get("timings")
    if timings:
        seconds = [float(v) for v in timings.values()]
        blocks.append(Block("table", pd.DataFrame({"stage": list(timings), "seconds": seconds}), "timings"))
    failed = [f"detector {name(k)}: {v}" for k, v in (info.get("detector_errors") or {}).items()]
    failed += [f"{k.replace(':', ' ', 1)}: {v}" for k, v in (info.get("plugin_errors") or {}).items()]
    if failed:
        blocks.append(Block("p", "Plugins that failed (a detector's rows are empty, an evaluator's or analysis' "
                                 "outputs are missing; the tracebacks are in errors.log):"))
        blocks.append(Block("ul", failed))
    if info.get("warnings"):
        blocks.append(Block("p", "Warnings (the run went ahead; check these inputs):"))
        blocks.append(Block("ul", [str(w) for w in info["warnings"]]))
    replaced = [f"{o['kind']} {o['name']}: {o['plugin']} replaces {o['replaces']}"
                for o in info.get("plugin_overrides") or []]
    if replaced:
        blocks.append(Block("p", "Plugins that replace another of the same name on purpose (overrides = True):"))
        blocks.append(Block("ul", replaced))
    if settings:
        blocks.append(Block("code", yaml.safe_dump(settings, sort_keys=False, default_flow_style=None), "config"))
    return blocks


def asr_section(asr: pd.DataFrame) -> Section:
    """The core's section on ``asr.csv``: the attack success rates and their readings."""
    table = asr.copy()
    table["eps"] = [eps_label(e) or "none" for e in table["eps"]]  # none: a minimal attack, no budget
    keep = [c for c in ("attack", "eps", "n", "clean_acc", "clean_acc_lo", "clean_acc_hi", "asr", "asr_lo", "asr_hi",
                        "asr_all", "asr_all_lo", "asr_all_hi", "ci", "mean_linf", "mean_l2") if c in table]
    return Section("Attack success rates", [
        Paragraph("asr: share of correctly classified images whose attack succeeded; asr_all: share of all images "
                  "misclassified after the attack (the paper's Table 3); accuracy and ASR in percent, each with its "
                  "95 % interval (_lo, _hi; Wilson's, as asr.csv holds them); mean_linf and mean_l2 are "
                  "perturbation norms averaged over successful adversarial examples."),
        Table(table[keep]), Bullets(read_asr(asr))], source="core")


def section_blocks(section: Section) -> list[Block]:
    """A section's blocks: its title as ``h2``, then its items in order."""
    blocks = [Block("h2", section.title)]
    for item in section.items:
        if isinstance(item, Paragraph):
            blocks.append(Block("p", item.text))
        elif isinstance(item, Bullets):
            blocks += _bullet_blocks(list(item.items), item.caption)
        elif isinstance(item, Table):
            blocks.append(_table_block(item))
        elif isinstance(item, Figure):
            if not Path(item.path).is_file():
                raise FileNotFoundError(f"figure {item.path} is missing")
            blocks.append(Block("img", Path(item.path), item.label))
    return blocks


def _table_block(item: Table) -> Block:
    """A table's block: whole, or, with a ``whole`` file and over :data:`MAX_ROWS` rows, its first :data:`TOP_ROWS`
    rows with that file as its link."""
    n = len(item.frame)
    if not item.whole or n <= MAX_ROWS:
        return Block("table", item.frame, item.caption)
    caption = f"{item.caption}: " if item.caption else ""
    return Block("table", item.frame.head(TOP_ROWS), f"{caption}the first {TOP_ROWS} of {n} rows; all in {item.whole}",
                 item.whole)


def _bullet_blocks(items: list[str], caption: str) -> list[Block]:
    """A list's blocks: over :data:`MAX_ITEMS` items, the first ones and the rest as a ``more`` block (in
    ``report.md`` whole, in ``report.html`` a link to ``report.md``)."""
    if len(items) <= MAX_ITEMS:
        return [Block("ul", items, caption)]
    return [Block("ul", items[:MAX_ITEMS], caption), Block("more", items[MAX_ITEMS:])]


def _guarded(section: Section) -> list[Block]:
    """A section's blocks; one that cannot be shown gives a one-line note (and a warning) instead of losing the
    whole report."""
    try:
        return section_blocks(section)
    except (KeyError, ValueError, TypeError, IndexError, OSError) as exc:
        warnings.warn(f"advopenood: report section {section.title!r} left out: {exc!r}", stacklevel=2)
        return [Block("h2", section.title), Block("p", f"This section could not be rendered: {exc!r}.")]


def _other_plots(out_dir: Path, used: set[Path]) -> list[Block]:
    return [Block("img", path, path.stem.replace("_", " ")) for path in sorted((out_dir / PLOT_DIR).glob("*.png"))
            if path.resolve() not in used]


def _attacks_ran(attacks: dict[str, Any]) -> str:
    """The adversarial sets by budget and family (:func:`attack_family`): ``fgsm, pgd and robust_id_<detector> (2
    sets) at eps 16/255; df without a budget``."""
    by: dict[str, dict[str, int]] = {}
    for set_name, a in attacks.items():
        budget = eps_label((a.get("params") or {}).get("eps"))
        families = by.setdefault(f"at eps {budget}" if budget else "without a budget", {})
        kin = attack_family(str(a.get("attack") or set_name))
        families[kin] = families.get(kin, 0) + 1
    return "; ".join(join([f if n == 1 and not f.endswith(">") else f"{f} ({n} set{'s' if n != 1 else ''})"
                           for f, n in families.items()]) + f" {budget}" for budget, families in by.items())


def what_ran(info: dict[str, Any]) -> str:
    """One paragraph on what the run did, from ``run.json``: data, model, attacks, detectors, plugins, intervals,
    time."""
    config = info.get("config") or {}
    n_id = ((info.get("data") or {}).get("id") or {}).get("n")
    parts = [f"{config.get('dataset') or ((info.get('data') or {}).get('id') or {}).get('name', 'the ID set')}"
             + (f" ({n_id} ID images" + (f", clean accuracy {pct(float(info['clean_acc']))}" if
                                       info.get("clean_acc") is not None else "") + ")" if n_id else "")]
    if (info.get("model") or {}).get("arch"):
        parts.append(f"model {info['model']['arch']}")
    if info.get("attacks"):
        parts.append(f"adversarial sets {_attacks_ran(info['attacks'])}")
    if config.get("detectors"):
        parts.append(f"{len(config['detectors'])} detector{'s' if len(config['detectors']) != 1 else ''}")
    plugins = [*(config.get("evaluators") or []), *(config.get("analyses") or [])]
    if plugins:
        parts.append(f"evaluators and analyses {join([str(p) for p in plugins])}")
    ci = _ci_fact(config.get("ci"))
    if ci:
        parts.append(f"95 % intervals: {ci}")
    total = (info.get("timings_s") or {}).get("total")
    time = f" in {float(total):.0f} s" if total is not None else ""
    return f"What ran{time}: " + "; ".join(parts) + "."


def _sample_note(sample: dict[str, Any]) -> list[Block]:
    if sample.get("conclusive") is not False:
        return []
    return [Block("p", f"Too few images to conclude: {sample['n_id']} ID images and as few as {sample['n_ood']} OOD "
                       f"images in a set, fewer than {sample['min_conclusive']} per side; a 95 % interval on an AUROC "
                       f"near chance spans about +-{sample['auroc_halfwidth_at_chance']:.0f} points at these sizes. "
                       "Every reading below describes this sample only.")]


def _run_blocks(info: dict[str, Any]) -> list[Block]:
    try:
        return _run_section(info)
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        warnings.warn(f"advopenood: report section 'Run' left out: {exc!r}", stacklevel=2)
        return [Block("h2", "Run"), Block("p", f"This section could not be rendered: {exc!r}.")]


def _fold(blocks: list[Block]) -> Block:
    """A section's blocks (its ``h2`` first) as one ``fold`` block: folded in the HTML, a section in Markdown."""
    return Block("fold", blocks[1:], blocks[0].content)


def _guarded_paragraph(make: Callable[[], list[Block]], what: str) -> list[Block]:
    """``make()``'s blocks; run.json's facts that cannot be shown give a one-line note (and a warning) instead."""
    try:
        return make()
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        warnings.warn(f"advopenood: report {what} left out: {exc!r}", stacklevel=2)
        return [Block("p", f"The {what} could not be rendered: {exc!r}.")]


def first_screen(sections: list[Section], lead: dict[str, str] | None) -> tuple[list[Section], list[Block]]:
    """The sections of the report's first screen, in order: the lead evaluator's headline (run.json's ``lead``: its
    ``evaluator`` and headline ``section``), then every other headline section; and a note when the lead's headline
    is missing (the evaluator failed or had nothing to compute)."""
    heads = [s for s in sections if s.headline]
    if not lead:
        return heads, []
    is_lead = lambda s: s.source == lead["evaluator"] and s.title == lead["section"]  # noqa: E731
    own = [s for s in sections if is_lead(s)]
    note = [] if own else [Block("p", f"The run's lead evaluator, {lead['evaluator']}, wrote no headline "
                                      f"({lead['section']!r}); its sections, if any, are under Details.")]
    return own + [s for s in heads if not is_lead(s)], note


def build_report(out_dir: Path, info: dict[str, Any] | None = None, sections: list[Section] | None = None
                 ) -> list[Block]:
    """The report's blocks: the first screen (what ran, from ``run.json``, and the headline sections), then every
    other section folded: the run's details, the saved sections (``report_sections.json``) and the plots that no
    section shows. ``info`` and ``sections`` default to the folder's ``run.json`` and ``report_sections.json``
    (``advopenood verify`` renders the report again from what it read and re-derived)."""
    out_dir = Path(out_dir)
    if info is None:
        info = json.loads((out_dir / "run.json").read_text()) if (out_dir / "run.json").is_file() else {}
    title = (info.get("config") or {}).get("name") or out_dir.name
    blocks = [Block("h1", f"advopenood report: {title}"),
              *_guarded_paragraph(lambda: _sample_note(info.get("sample") or {}), "note on the sample")]
    if info.get("notes"):  # what the run's settings left out or ignored (run.json's notes)
        blocks.append(Block("ul", [str(n) for n in info["notes"]], "Notes on this run's settings"))
    if info:
        blocks += _guarded_paragraph(lambda: [Block("p", what_ran(info))], "summary of what ran")
    sections = read_sections(out_dir) if sections is None else sections
    used: set[Path] = {Path(p).resolve() for s in sections for p in s.figures}
    first, missing = first_screen(sections, info.get("lead"))
    blocks += missing
    for section in first:
        blocks += _guarded(section)
    folds = [_fold(_run_blocks(info))] if info else []
    shown = {id(s) for s in first}
    folds += [_fold(_guarded(s)) for s in sections if id(s) not in shown]
    rest = _other_plots(out_dir, used)
    if rest:
        folds.append(Block("fold", rest, "Other plots"))
    if folds:
        blocks += [Block("h2", "Details"), Block("p", "Each section below opens on a click (in report.html); long "
                                                       "tables show their first rows and link their CSV."), *folds]
    if len(blocks) == 1:
        blocks.append(Block("p", "This folder holds no run results yet."))
    return blocks


# ------------------------------------------------------------------------------------------------ rendering

def _md_block(b: Block, out_dir: Path) -> str:
    """One block as Markdown (a fold as its section, a ``details`` block as its content)."""
    if b.kind in ("h1", "h2", "h3"):
        return "#" * int(b.kind[1]) + " " + b.content
    if b.kind == "p":
        return b.content
    if b.kind == "ul":
        body = "\n".join(f"- {s}" for s in b.content)
        return ((f"{b.caption}:\n\n" if b.caption else "") + body) if b.content else ""
    if b.kind == "table":
        caption = f"**{b.caption}**\n\n" if b.caption else ""
        link = f"\n\n[{b.link}]({b.link})" if b.link else ""
        return caption + aio.markdown_table(_cells(b.content)).rstrip() + link
    if b.kind == "code":
        return f"<details><summary>{b.caption}</summary>\n\n```yaml\n{b.content.rstrip()}\n```\n\n</details>"
    if b.kind == "img":
        return f"![{b.caption}]({Path(b.content).relative_to(out_dir).as_posix()})\n\n*{b.caption}*"
    if b.kind == "more":
        return "\n".join(f"- {s}" for s in b.content)
    inner = [_md_block(c, out_dir) for c in b.content]
    return "\n\n".join(([f"## {b.caption}"] if b.kind == "fold" else []) + [p for p in inner if p])


def to_markdown(blocks: list[Block], out_dir: Path) -> str:
    """GitHub Markdown; images as relative links; every section open."""
    return "\n\n".join(p for p in (_md_block(b, out_dir) for b in blocks) if p) + "\n"


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1340px;margin:1em auto;
padding:0 1.2em;color:#222;line-height:1.4}table{border-collapse:collapse;margin:.4em 0 1em;font-size:.8em}
th,td{border:1px solid #ccc;padding:.1em .4em;text-align:right}th{background:#f2f2f2}td:first-child,th:first-child
{text-align:left}caption{font-weight:600;text-align:left;padding:.3em 0}img{display:block;margin:.5em 0}
figure{margin:1em 0;overflow-x:auto}figcaption{color:#555;font-size:.85em}pre{background:#f6f6f6;padding:.8em;overflow:auto}
.scroll{overflow-x:auto;max-width:100%}.scroll td,.scroll th{white-space:nowrap}h1{margin:.3em 0 .4em;font-size:1.6em}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.2em}details.section>summary h2{display:inline;
border:0}details.section{border-bottom:1px solid #ddd;margin:.3em 0}details.section>summary{cursor:pointer;
padding:.3em 0}ul{margin:.3em 0}"""


def _html_table(df: pd.DataFrame, caption: str, link: str = "") -> str:
    """A table in a box that scrolls sideways: a table wider than the page scrolls instead of being cut; ``link``
    (a CSV beside the report that holds all of a table shown in part) linked under it."""
    cells = _cells(df)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cells.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
                   for row in cells.itertuples(index=False))
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    more = f'<p>All rows: <a href="{html.escape(link)}">{html.escape(link)}</a></p>' if link else ""
    return f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{more}'


def _html_block(b: Block) -> str:
    """One block as HTML (a fold as a closed ``details`` element with its title as summary)."""
    if b.kind in ("h1", "h2", "h3"):
        return f"<{b.kind}>{html.escape(b.content)}</{b.kind}>"
    if b.kind == "p":
        return f"<p>{html.escape(b.content)}</p>"
    if b.kind == "ul":
        if not b.content:
            return ""
        cap = f"<p>{html.escape(b.caption)}:</p>" if b.caption else ""
        return cap + "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in b.content) + "</ul>"
    if b.kind == "table":
        return _html_table(b.content, b.caption, b.link)
    if b.kind == "code":
        return f"<details><summary>{html.escape(b.caption)}</summary><pre>{html.escape(b.content)}</pre></details>"
    if b.kind == "img":
        data = base64.b64encode(Path(b.content).read_bytes()).decode()
        return (f'<figure><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(b.caption)}</figcaption></figure>")
    if b.kind == "more":
        return f'<p>and {len(b.content)} more: <a href="report.md">report.md</a> lists every one.</p>'
    inner = "\n".join(_html_block(c) for c in b.content)
    if b.kind == "fold":
        return f'<details class="section"><summary><h2>{html.escape(b.caption)}</h2></summary>\n{inner}\n</details>'
    return f"<details><summary>{html.escape(b.caption)}</summary>\n{inner}\n</details>"


def to_html(blocks: list[Block]) -> str:
    """A self-contained HTML page (inline CSS, plots as base64 data URIs, no network resources except the links to
    the CSVs beside it); every section after the first screen folded."""
    title = next((b.content for b in blocks if b.kind == "h1"), "advopenood report")
    parts = [_html_block(b) for b in blocks]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(p for p in parts if p) + "\n</body></html>\n")


def write_report(out_dir: Path) -> Path:
    """Write ``report.md`` and ``report.html`` (atomically) into ``out_dir``; returns the Markdown path."""
    out_dir = Path(out_dir)
    blocks = build_report(out_dir)
    md_path = out_dir / "report.md"
    aio.write_text(md_path, to_markdown(blocks, out_dir))
    aio.write_text(out_dir / "report.html", to_html(blocks))
    return md_path

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
from typing import Any

import pandas as pd
import yaml

from advopenood import io as aio
from advopenood.claims import name  # noqa: F401  (display names: one rule for the report and its claims)
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


@dataclass(frozen=True)
class Block:
    """One report element: ``kind`` is ``h1``, ``h2``, ``h3``, ``p``, ``ul``, ``table``, ``code`` or ``img``
    (a PNG path); ``caption`` labels tables and images."""

    kind: str
    content: Any
    caption: str = ""


# ----------------------------------------------------------------------------------------------- formatting

def eps_label(eps: Any) -> str:
    """``8/255`` for budgets that are a whole number of grey values, ``0.05`` otherwise, ``""`` for none."""
    try:
        value = float(eps)
    except (TypeError, ValueError):
        return ""
    if math.isnan(value):
        return ""
    grey = value * 255
    if abs(grey - round(grey)) < 1e-3 and 0 < round(grey) < 255:
        return f"{int(round(grey))}/255"
    return f"{value:.3g}"


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
    """``df`` with every cell formatted as a string, a fixed number of decimals per column (index kept as the first
    column when named)."""
    if df.index.name is not None:
        df = df.reset_index()
    return pd.DataFrame({str(c): format_column(df.iloc[:, i].tolist()) for i, c in enumerate(df.columns)})


def join(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def pct(value: float) -> str:
    """A percentage to one decimal: ``12.5 %``."""
    return f"{value:.1f} %"


# ------------------------------------------------------------------------------------------------- readings

def _ranked(labels: list[str], which: str) -> str:
    """``"A is the strongest attack"`` or, on a tie, ``"A and B are the strongest attacks"``."""
    if len(labels) == 1:
        return f"{labels[0]} is the {which} attack"
    return f"{join(labels)} are the {which} attacks"


def read_asr(asr: pd.DataFrame) -> list[str]:
    """Clean accuracy, and the strongest and weakest attack by ASR (ties named together), compared only among sets
    of one budget: with several budgets in the table, one sentence per budget, which it names."""
    out = []
    acc = asr["clean_acc"].dropna()
    if len(acc):
        n = int(asr["n"].iloc[0])
        out.append(f"The classifier's clean accuracy is {pct(float(acc.iloc[0]))} on {n} ID images.")
    rows = asr.dropna(subset=["asr"])
    budgets = [eps_label(e) or "none" for e in rows["eps"]] if "eps" in rows else ["none"] * len(rows)
    groups = list(dict.fromkeys(budgets))
    for budget in groups:
        part = rows[[b == budget for b in budgets]]
        labels, values = [name(a) for a in part["attack"]], [float(v) for v in part["asr"]]
        at = "" if len(groups) == 1 else ("Without a budget (minimal perturbation), " if budget == "none" else
                                          f"At eps {budget}, ")
        if len(part) == 1:
            out.append(_sentence(at, f"{labels[0]} succeeds on {pct(values[0])} of the correctly classified images."))
            continue
        hi, lo = max(values), min(values)
        if hi == lo:
            out.append(_sentence(at, f"Every attack ({join(labels)}) succeeds on {pct(hi)} of the correctly classified "
                                     "images."))
        else:
            top = [a for a, v in zip(labels, values) if v == hi]
            bottom = [a for a, v in zip(labels, values) if v == lo]
            out.append(_sentence(at, f"{_ranked(top, 'strongest')} (ASR {pct(hi)} of correctly classified images) and "
                                     f"{_ranked(bottom, 'weakest')} ({pct(lo)})."))
    return out


def _sentence(lead: str, text: str) -> str:
    """``text`` after a leading clause (``At eps 8/255, ``); a sentence that opens with ``Every`` is lowered (the
    others open with an attack's name)."""
    return lead + ("e" + text[1:] if lead and text.startswith("Every") else text)


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
            blocks.append(Block("ul", list(item.items), item.caption))
        elif isinstance(item, Table):
            blocks.append(Block("table", item.frame, item.caption))
        elif isinstance(item, Figure):
            if not Path(item.path).is_file():
                raise FileNotFoundError(f"figure {item.path} is missing")
            blocks.append(Block("img", Path(item.path), item.label))
    return blocks


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


def build_report(out_dir: Path) -> list[Block]:
    """The report's blocks: the run (``run.json``), the saved sections (``report_sections.json``) and the plots
    that no section shows."""
    out_dir = Path(out_dir)
    info = json.loads((out_dir / "run.json").read_text()) if (out_dir / "run.json").is_file() else {}
    title = (info.get("config") or {}).get("name") or out_dir.name
    blocks = [Block("h1", f"advopenood report: {title}")]
    sample = info.get("sample") or {}
    if sample.get("conclusive") is False:
        blocks.append(Block("p", f"Too few images to conclude: {sample['n_id']} ID images and as few as "
                                 f"{sample['n_ood']} OOD images in a set, fewer than {sample['min_conclusive']} per "
                                 f"side; a 95 % interval on an AUROC near chance spans about "
                                 f"+-{sample['auroc_halfwidth_at_chance']:.0f} points at these sizes. Every reading "
                                 "below describes this sample only."))
    if info:
        try:
            blocks += _run_section(info)
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
            warnings.warn(f"advopenood: report section 'Run' left out: {exc!r}", stacklevel=2)
            blocks += [Block("h2", "Run"), Block("p", f"This section could not be rendered: {exc!r}.")]
    used: set[Path] = set()
    for section in read_sections(out_dir):
        blocks += _guarded(section)
        used.update(Path(p).resolve() for p in section.figures)
    rest = _other_plots(out_dir, used)
    if rest:
        blocks += [Block("h2", "Other plots"), *rest]
    if len(blocks) == 1:
        blocks.append(Block("p", "This folder holds no run results yet."))
    return blocks


# ------------------------------------------------------------------------------------------------ rendering

def to_markdown(blocks: list[Block], out_dir: Path) -> str:
    """GitHub Markdown; images as relative links."""
    parts = []
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            parts.append("#" * int(b.kind[1]) + " " + b.content)
        elif b.kind == "p":
            parts.append(b.content)
        elif b.kind == "ul":
            if b.content:
                parts.append((f"{b.caption}:\n\n" if b.caption else "") + "\n".join(f"- {s}" for s in b.content))
        elif b.kind == "table":
            parts.append((f"**{b.caption}**\n\n" if b.caption else "") + aio.markdown_table(_cells(b.content)).rstrip())
        elif b.kind == "code":
            parts.append(f"<details><summary>{b.caption}</summary>\n\n```yaml\n{b.content.rstrip()}\n```\n\n</details>")
        elif b.kind == "img":
            parts.append(f"![{b.caption}]({Path(b.content).relative_to(out_dir).as_posix()})\n\n*{b.caption}*")
    return "\n\n".join(parts) + "\n"


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f2f2f2}td:first-child,th:first-child
{text-align:left}caption{font-weight:600;text-align:left;padding:.3em 0}img{max-width:100%;display:block;margin:.5em 0}
figure{margin:1em 0}figcaption{color:#555;font-size:.85em}pre{background:#f6f6f6;padding:.8em;overflow:auto}
.scroll{overflow-x:auto;max-width:100%}.scroll td,.scroll th{white-space:nowrap}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}"""


def _html_table(df: pd.DataFrame, caption: str) -> str:
    """A table in a box that scrolls sideways: a table wider than the page scrolls instead of being cut."""
    cells = _cells(df)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cells.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
                   for row in cells.itertuples(index=False))
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<div class="scroll"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def to_html(blocks: list[Block]) -> str:
    """A self-contained HTML page (inline CSS, plots as base64 data URIs, no network resources)."""
    title = next((b.content for b in blocks if b.kind == "h1"), "advopenood report")
    parts = []
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            parts.append(f"<{b.kind}>{html.escape(b.content)}</{b.kind}>")
        elif b.kind == "p":
            parts.append(f"<p>{html.escape(b.content)}</p>")
        elif b.kind == "ul":
            if b.content:
                cap = f"<p>{html.escape(b.caption)}:</p>" if b.caption else ""
                parts.append(cap + "<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in b.content) + "</ul>")
        elif b.kind == "table":
            parts.append(_html_table(b.content, b.caption))
        elif b.kind == "code":
            parts.append(f"<details><summary>{html.escape(b.caption)}</summary><pre>{html.escape(b.content)}</pre></details>")
        elif b.kind == "img":
            data = base64.b64encode(Path(b.content).read_bytes()).decode()
            parts.append(f'<figure><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                         f"<figcaption>{html.escape(b.caption)}</figcaption></figure>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def write_report(out_dir: Path) -> Path:
    """Write ``report.md`` and ``report.html`` (atomically) into ``out_dir``; returns the Markdown path."""
    out_dir = Path(out_dir)
    blocks = build_report(out_dir)
    md_path = out_dir / "report.md"
    aio.write_text(md_path, to_markdown(blocks, out_dir))
    aio.write_text(out_dir / "report.html", to_html(blocks))
    return md_path

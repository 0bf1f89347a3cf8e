"""The readable run report: ``report.md`` and a self-contained ``report.html`` (plots inline as base64).

:func:`write_report` reads whatever a run left in its output folder (``run.json``, ``asr.csv``,
``ood.csv`` / ``table_ood.md``, ``table_adaptive.csv``, ``mead.csv``, ``bintest.csv``, ``gradcam_summary.csv``,
``transfer.csv``, ``plots/*.png``);
a section whose file is absent is left out. Every table comes with one-sentence readings generated from
its numbers (``read_*`` functions), e.g. which detectors fall below chance on an attack.
The report is built once as a list of blocks and rendered twice, to Markdown and to HTML.
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
from advopenood.plots import PLOT_DIR, ood_matrix, safe_name

CHANCE = 50.0


@dataclass(frozen=True)
class Block:
    """One report element: ``kind`` is ``h1``, ``h2``, ``h3``, ``p``, ``ul``, ``table``, ``md`` (raw Markdown),
    ``code`` or ``img`` (a PNG path); ``caption`` labels tables and images."""

    kind: str
    content: Any
    caption: str = ""


# ----------------------------------------------------------------------------------------------- formatting

def name(text: Any) -> str:
    """Display name of a detector or attack: short names upper-cased (``msp`` -> ``MSP``), others as given."""
    s = str(text)
    return s.upper() if s.isalnum() and len(s) <= 8 else s


def eps_label(eps: Any) -> str:
    """``8/255`` for budgets that are a whole number of grey levels, ``0.05`` otherwise, ``""`` for none."""
    try:
        value = float(eps)
    except (TypeError, ValueError):
        return ""
    if math.isnan(value):
        return ""
    levels = value * 255
    if abs(levels - round(levels)) < 1e-3 and 0 < round(levels) < 255:
        return f"{int(round(levels))}/255"
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


def _cells(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every cell formatted as a string (index kept as the first column when named)."""
    if df.index.name is not None:
        df = df.reset_index()
    return pd.DataFrame({str(c): [fmt(v) for v in df[c].tolist()] for c in df.columns})


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _pct(value: float) -> str:
    return f"{value:.1f} %"


# ------------------------------------------------------------------------------------------------- readings

def _ranked(labels: list[str], which: str) -> str:
    """``"A is the strongest attack"`` or, on a tie, ``"A and B are the strongest attacks"``."""
    if len(labels) == 1:
        return f"{labels[0]} is the {which} attack"
    return f"{_join(labels)} are the {which} attacks"


def read_asr(asr: pd.DataFrame) -> list[str]:
    """Clean accuracy, and the strongest and weakest attack by ASR (ties named together)."""
    out = []
    acc = asr["clean_acc"].dropna()
    if len(acc):
        n = int(asr["n"].iloc[0])
        out.append(f"The classifier's clean accuracy is {_pct(float(acc.iloc[0]))} on {n} ID images.")
    rows = asr.dropna(subset=["asr"])
    labels, values = [name(a) for a in rows["attack"]], [float(v) for v in rows["asr"]]
    if len(rows) == 1:
        out.append(f"{labels[0]} succeeds on {_pct(values[0])} of the correctly classified images.")
    elif len(rows) > 1:
        hi, lo = max(values), min(values)
        if hi == lo:
            out.append(f"Every attack ({_join(labels)}) succeeds on {_pct(hi)} of the correctly classified images.")
        else:
            top = [a for a, v in zip(labels, values) if v == hi]
            bottom = [a for a, v in zip(labels, values) if v == lo]
            out.append(f"{_ranked(top, 'strongest')} (ASR {_pct(hi)} of correctly classified images) and "
                       f"{_ranked(bottom, 'weakest')} ({_pct(lo)}).")
    return out


def compare_natural_adversarial(nat: float, adv: float) -> str:
    """The sentence comparing mean AUROC on natural OOD sets (``nat``) with that under attack (``adv``); its
    verb and reading follow the sign of the difference (as shown, to one decimal)."""
    nat_s, adv_s = f"{nat:.1f}", f"{adv:.1f}"
    if nat_s == adv_s:
        return (f"Averaged over detectors, AUROC is {nat_s} both on natural OOD sets and under attack: the attacks "
                "are as hard to detect as natural OOD.")
    if adv < nat:
        return (f"Averaged over detectors, AUROC falls from {nat_s} on natural OOD sets to {adv_s} under attack: "
                "adversarial examples evade the detectors more than natural OOD does.")
    return (f"Averaged over detectors, AUROC rises from {nat_s} on natural OOD sets to {adv_s} under attack: here "
            "the detectors flag adversarial examples more readily than natural OOD.")


def read_ood(ood: pd.DataFrame) -> list[str]:
    """Natural sets: the best and worst detector by mean AUROC and any below chance; per attack: which
    detectors fall below chance (AUROC < 50), or the best and worst; and the mean AUROC from natural OOD sets
    to adversarial sets (:func:`compare_natural_adversarial`)."""
    table = ood_matrix(ood, "auroc")
    if table.empty:
        return []
    n_nat = table.attrs["n_natural"]
    natural, attacks = table.iloc[:, :n_nat], table.iloc[:, n_nat:]
    out = []
    if natural.shape[1]:
        mean = natural.mean(axis=1, skipna=False).dropna()
        sets = ", ".join(map(str, natural.columns))
        if len(mean) == 1:
            out.append(f"On natural OOD sets ({sets}), {name(mean.index[0])} reaches a mean AUROC of {mean.iloc[0]:.1f}.")
        elif len(mean):
            best, worst = mean.idxmax(), mean.idxmin()
            out.append(f"On natural OOD sets ({sets}), {name(best)} is the best detector (mean AUROC {mean[best]:.1f}) "
                       f"and {name(worst)} the worst ({mean[worst]:.1f}).")
        below = [name(d) for d in mean.index if mean[d] < CHANCE]
        if below:
            verb = "scores" if len(below) == 1 else "score"
            out.append(f"{_join(below)} {verb} below chance on natural OOD (mean AUROC < 50): OOD images look more "
                       "in-distribution to them than ID images.")
    for col in attacks.columns:
        scores = attacks[col].dropna()
        if not len(scores):
            continue
        below = [name(d) for d in scores.index if scores[d] < CHANCE]
        best = scores.idxmax()
        if len(below) == len(scores):
            out.append(f"On {name(col)} every detector falls below chance (AUROC < 50): adversarial examples look "
                       f"more in-distribution than clean images; the best is {name(best)} ({scores[best]:.1f}).")
        elif below:
            verb = "falls" if len(below) == 1 else "fall"
            out.append(f"{_join(below)} {verb} below chance (AUROC < 50) on {name(col)}; the best is {name(best)} "
                       f"(AUROC {scores[best]:.1f}).")
        else:
            worst = scores.idxmin()
            out.append(f"No detector falls below chance on {name(col)}; the best is {name(best)} (AUROC "
                       f"{scores[best]:.1f}) and the worst {name(worst)} ({scores[worst]:.1f}).")
    if natural.shape[1] and attacks.shape[1]:
        nat, adv = natural.stack().mean(), attacks.stack().mean()
        if not (math.isnan(nat) or math.isnan(adv)):
            out.append(compare_natural_adversarial(float(nat), float(adv)))
    return out


def read_mead(mead: pd.DataFrame) -> list[str]:
    """Per (norm, eps) group of MEAD's all-attack worst case: detectors below chance, else the best one."""
    out = []
    worst = mead[mead["setting"] == "mead"] if (mead["setting"] == "mead").any() else mead
    for (norm, eps), part in worst.groupby(["norm", worst["eps"].fillna(-1.0)], sort=False):
        part = part.dropna(subset=["auroc"])
        if part.empty:
            continue
        group = f"{norm}" + (f", eps {eps_label(eps)}" if eps >= 0 else ", unbounded")
        below = [name(d) for d, a in zip(part["detector"], part["auroc"]) if a < CHANCE]
        best = part.loc[part["auroc"].idxmax()]
        top = f"the best is {name(best['detector'])} (AUROC {best['auroc']:.1f})"
        if below:
            out.append(f"Under MEAD's worst case over all attacks ({group}), {len(below)} of {len(part)} detectors "
                       f"fall below chance ({_join(below)}); {top}.")
        else:
            out.append(f"Under MEAD's worst case over all attacks ({group}) no detector falls below chance; {top}.")
    return out


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _as_pct(value: Any) -> float:
    v = float(value)
    return 100.0 * v if v <= 1.0 else v


def read_bintest(bintest: pd.DataFrame) -> list[str]:
    """Which attacks pass the binarization test, which fail, which are inconclusive (and why)."""
    passed, failed, unclear = [], [], []
    for r in bintest.to_dict("records"):
        label = name(r["attack"])
        detail = f"ASR {_as_pct(r['asr']):.0f} % vs random {_as_pct(r['random_asr']):.0f} %"
        if _flag(r["inconclusive"]):
            unclear.append(f"{label} ({detail})")
        elif _flag(r["passed"]):
            passed.append(f"{label} ({detail})")
        else:
            failed.append(f"{label} ({detail})")
    out = []
    if passed:
        out.append(f"{_join(passed)} {'passes' if len(passed) == 1 else 'pass'} the binarization test: the attack "
                   "finds adversarial examples that provably exist.")
    if failed:
        out.append(f"{_join(failed)} {'fails' if len(failed) == 1 else 'fail'} it (ASR below 95 %): results obtained "
                   "with it may overstate robustness.")
    if unclear:
        out.append(f"The test is inconclusive for {_join(unclear)}: the random baseline exceeds 75 %, so the binary "
                   "problem is too easy (raise n_inner).")
    return out


def read_gradcam(summary: pd.DataFrame) -> list[str]:
    """Per attack: the regime shares of the successful attacks (and how unsuccessful ones compare)."""
    out = []
    for attack, part in summary.groupby("attack", sort=False):
        by = {r["subset"]: r for r in part.to_dict("records")}
        main = by.get("successful") if by.get("successful", {}).get("n", 0) else by.get("all")
        if not main or not main.get("n"):
            continue
        who = "successful attacks" if main is by.get("successful") else "samples"
        text = (f"Under {name(attack)}, Grad-CAM attention changed (high L2, low SSIM) for "
                f"{_pct(main['pct_changed'])} of {int(main['n'])} {who}, moved with its structure kept for "
                f"{_pct(main['pct_moved'])} and stayed unchanged for {_pct(main['pct_unchanged'])} "
                f"(median L2 {fmt(main['l2_median'])}, median SSIM {fmt(main['ssim_median'])})")
        miss = by.get("unsuccessful")
        if miss and miss.get("n"):
            text += (f"; of the {int(miss['n'])} unsuccessful attacks, {_pct(miss['pct_unchanged'])} left it "
                     "unchanged")
        out.append(text + ".")
    full = summary[summary["subset"] == "all"].dropna(subset=["pct_unchanged"])
    if len(full) > 1:
        keep = full.loc[full["pct_unchanged"].idxmax()]
        shift = full.loc[full["pct_changed"].idxmax()]
        out.append(f"{name(keep['attack'])} preserves attention most ({_pct(keep['pct_unchanged'])} unchanged); "
                   f"{name(shift['attack'])} changes it most ({_pct(shift['pct_changed'])} changed).")
    return out


# ------------------------------------------------------------------------------------------------- sections

def _read_csv(path: Path) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def _plots(out_dir: Path, pattern: str, used: set[Path]) -> list[Block]:
    blocks = []
    for path in sorted((out_dir / PLOT_DIR).glob(pattern)):
        if path not in used:
            used.add(path)
            blocks.append(Block("img", path, path.stem.replace("_", " ")))
    return blocks


def _run_section(info: dict[str, Any]) -> list[Block]:
    blocks = [Block("h2", "Run")]
    cfg = info.get("config") or {}
    facts = {"seed": info.get("seed"), "dataset": (cfg.get("data") or {}).get("dataset"),
             "model": (info.get("model") or {}).get("arch"),
             "weights sha256": str((info.get("model") or {}).get("weights_sha256", ""))[:16],
             "ID images": ((info.get("data") or {}).get("id") or {}).get("n"),
             "clean accuracy (%)": info.get("clean_acc"), "detector backend": info.get("detector_backend"),
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
    errors = info.get("detector_errors") or {}
    if errors:
        blocks.append(Block("p", "Detectors that failed (their rows are empty):"))
        blocks.append(Block("ul", [f"{name(k)}: {v}" for k, v in errors.items()]))
    if cfg:
        blocks.append(Block("code", yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None), "config"))
    return blocks


def _asr_section(asr: pd.DataFrame) -> list[Block]:
    table = asr.copy()
    table["eps"] = [eps_label(e) for e in table["eps"]]
    keep = [c for c in ("attack", "eps", "n", "clean_acc", "asr", "asr_all", "mean_linf", "mean_l2") if c in table]
    return [Block("h2", "Attack success rates"),
            Block("p", "asr: share of correctly classified images whose attack succeeded; asr_all: share of all "
                       "images misclassified after the attack (the paper's Table 3); accuracy and ASR in percent; "
                       "mean_linf and mean_l2 are perturbation norms averaged over successful adversarial examples."),
            Block("table", table[keep]), Block("ul", read_asr(asr))]


def _ood_section(out_dir: Path, ood: pd.DataFrame | None, used: set[Path]) -> list[Block]:
    blocks = [Block("h2", "OOD detection"),
              Block("p", "Adversarial examples count as OOD (the positives are the successful attacks); AUROC and "
                         "FPR95 in percent, OpenOOD's conventions. AUROC below 50 means the detector rates adversarial "
                         "examples as more in-distribution than clean images.")]
    if ood is not None and not ood.empty:
        blocks.append(Block("table", ood_matrix(ood, "auroc"), "AUROC (%)"))
        blocks.append(Block("table", ood_matrix(ood, "fpr95"), "FPR95 (%)"))
        blocks.append(Block("ul", read_ood(ood)))
        errors = ood[ood["error"].astype("string").fillna("") != ""] if "error" in ood else ood.iloc[:0]
        if len(errors):
            blocks.append(Block("ul", [f"{name(r['detector'])} on {name(r['ood_set'])}: {r['error']}"
                                       for r in errors.to_dict("records")], "metrics left empty"))
    elif (out_dir / "table_ood.md").is_file():
        blocks.append(Block("md", (out_dir / "table_ood.md").read_text()))
    return blocks + _plots(out_dir, "auroc_heatmap.png", used) + _plots(out_dir, "roc_*.png", used)


def read_adaptive(table: pd.DataFrame) -> list[str]:
    """One reading per detector-adaptive set: its detector's AUROC against the classifier-only baseline."""
    out = []
    for r in table.to_dict("records"):
        if pd.isna(r["auroc_baseline"]):
            out.append(f"{r['attack']}: {name(r['detector'])} reaches AUROC {r['auroc_adaptive']:.1f} "
                       "(no classifier-only baseline in this run).")
        else:
            out.append(f"{r['attack']}: {name(r['detector'])}'s AUROC goes from {r['auroc_baseline']:.1f} "
                       f"({name(r['baseline'])}) to {r['auroc_adaptive']:.1f} when the attack adapts to it "
                       f"({r['delta_auroc']:+.1f} points).")
    return out


def _adaptive_section(table: pd.DataFrame) -> list[Block]:
    return [Block("h2", "Detector-adaptive attacks"),
            Block("p", "Each adaptive set attacks one detector through its differentiable score (BPDA where needed); "
                       "its AUROC/FPR95 (%) sit next to the classifier-only baseline: PGD at the same eps for ID->ID "
                       "evasion, the clean natural OOD set for OOD->ID."),
            Block("table", table), Block("ul", read_adaptive(table))]


def read_transfer(table: pd.DataFrame) -> list[str]:
    """Per surrogate and data fraction: the attack with the highest transfer ASR (or that none fools the target),
    and the detector that adds the most defense accuracy (or that none adds any), on ``n`` clean-correct rows."""
    out = []
    for (surrogate, fraction), part in table.groupby(["surrogate", "data_fraction"], sort=False):
        line = (f"{surrogate} surrogate, {fmt(fraction)} % of the training data "
                f"({int(part['n'].max())} clean-correct test images): ")
        asr = part.dropna(subset=["asr"])
        if asr.empty:
            out.append(line + "nothing to attack.")
            continue
        best = asr.loc[asr["asr"].idxmax()]
        line += (f"the highest transfer ASR is {best['asr']:.1f} % ({best['attack']})" if best["asr"] > 0
                 else "no transferred example fools the target")
        scored = part.dropna(subset=["improvement"])
        scored = scored[scored["detector"].astype("string").fillna("") != ""]
        if len(scored):
            top = scored.loc[scored["improvement"].idxmax()]
            line += (f"; {name(top['detector'])} adds the most defense accuracy, {top['improvement']:+.1f} points on "
                     f"{top['attack']} ({top['undefended_acc']:.1f} % -> {top['defense_acc']:.1f} %)"
                     if top["improvement"] > 0 else "; no detector adds defense accuracy")
        out.append(line + ".")
    return out


def _transfer_section(table: pd.DataFrame) -> list[Block]:
    protocols = set(table["protocol"].astype(str)) if "protocol" in table else {"strong"}
    adversary = ("the adversary is Mahmood et al.'s CIFAR-10 one (protocol mahmood2021); the deviations column "
                 "lists where it differs from the paper's" if protocols == {"mahmood2021"} else
                 "the adversary is ours (protocol " + ", ".join(sorted(protocols)) + "), weaker than the paper's; "
                 "its numbers are not comparable with the paper's")
    return [Block("h2", "Black-box transfer"),
            Block("p", "Mahmood et al., Beware the Black-Box: adversarial examples crafted on a surrogate (pure: trained "
                       "on the true labels; mixed: labels queried from the target, rejected queries dropped) and "
                       "submitted to the target; " + adversary + ". Every metric is on the n test images the target "
                       "classifies correctly when clean, as in the paper. asr: transfer success rate; "
                       "undefended_acc = 100 - asr; defense_acc: share handled correctly (right label or rejected); "
                       "percent."),
            Block("table", table.drop(columns=["deviations"], errors="ignore")), Block("ul", read_transfer(table)),
            *[Block("p", f"Deviations from the paper's adversary: {text}.") for text in
              (table["deviations"].dropna().astype(str).unique() if "deviations" in table else []) if text]]


def _mead_section(mead: pd.DataFrame) -> list[Block]:
    table = mead.copy()
    table["group"] = [f"{s} {n} {eps_label(e) or 'unbounded'}"
                      for s, n, e in zip(table["setting"], table["norm"], table["eps"])]
    wide = table.pivot_table(index="detector", columns="group", values="auroc", aggfunc="mean", sort=False)
    wide = wide.reindex(index=list(dict.fromkeys(table["detector"])), columns=list(dict.fromkeys(table["group"])))
    wide.columns.name = None
    protocol = f" Protocol: {mead['protocol'].iloc[0]}." if "protocol" in mead and len(mead) else ""
    return [Block("h2", "MEAD worst case"),
            Block("p", "AUROC (%) per detector when a clean image counts as detected only if every successful "
                       "attack on it is detected (Granese et al.); columns: setting, group (norm l1, l2 or linf; "
                       "patch for patch attacks such as mPGD, kept out of the norm groups), eps." + protocol),
            Block("table", wide, "MEAD AUROC (%)"), Block("ul", read_mead(mead))]


def _bintest_section(bintest: pd.DataFrame) -> list[Block]:
    table = bintest.copy()
    table["eps"] = [eps_label(e) for e in table["eps"]]
    keep = [c for c in ("attack", "test", "norm", "eps", "n", "n_skipped", "asr", "random_asr", "passed",
                        "inconclusive", "kappa", "n_inner") if c in table]
    return [Block("h2", "Binarization test"),
            Block("p", "Zimmermann et al.: an attack passes when it reaches ASR >= 0.95 on binary problems where an "
                       "adversarial example provably exists, and the test is conclusive when random points succeed "
                       "at most 75 % of the time."),
            Block("table", table[keep]), Block("ul", read_bintest(bintest))]


def _gradcam_section(out_dir: Path, summary: pd.DataFrame, used: set[Path]) -> list[Block]:
    table = summary.copy()
    if "eps" in table:
        table["eps"] = [eps_label(e) for e in table["eps"]]
    keep = [c for c in ("attack", "eps", "subset", "n", "l2_mean", "l2_median", "ssim_mean", "ssim_median",
                        "pct_changed", "pct_moved", "pct_unchanged", "pct_low_l2_low_ssim") if c in table]
    rules = {"prediction": "each map explains its own image's top prediction (the clean map the clean prediction, "
                           "the adversarial map the adversarial prediction; the paper's rule)",
             "clean": "both maps explain the clean prediction (advopenood's variant, not the paper's rule)"}
    rule = str(summary["target_rule"].iloc[0]) if "target_rule" in summary and len(summary) else ""
    target = f"; {rules.get(rule, f'target rule {rule}')}" if rule else ""
    thresholds = ""
    if {"l2_threshold", "ssim_threshold"} <= set(summary.columns) and len(summary):
        thresholds = (f" Thresholds: L2 >= {fmt(float(summary['l2_threshold'].iloc[0]))} is high, "
                      f"SSIM >= {fmt(float(summary['ssim_threshold'].iloc[0]))} is high; the paper gives no numeric "
                      "thresholds, these are advopenood's.")
    protocol = f" Protocol: {summary['protocol'].iloc[0]}." if "protocol" in summary and len(summary) else ""
    blocks = [Block("h2", "Grad-CAM attention shift"),
              Block("p", "Grad-CAM maps of each clean image and its adversarial counterpart on the last convolutional "
                         f"block{target}. L2 is the mean squared difference of the maps (in [0, 1]), SSIM their "
                         "structural similarity. Regimes (paper, section 4.2): changed = high L2 and low SSIM, moved "
                         "= high L2 and high SSIM, unchanged = low L2 and high SSIM; shares in percent."
                         + thresholds + protocol),
              Block("table", table[keep]), Block("ul", read_gradcam(summary))]
    for attack in dict.fromkeys(summary["attack"]):
        stem = safe_name(str(attack))
        blocks += _plots(out_dir, f"gradcam_{stem}.png", used) + _plots(out_dir, f"gradcam_examples_{stem}.png", used)
    return blocks + _plots(out_dir, "gradcam_*.png", used)


def _guarded(title: str, make: Callable[[], list[Block]]) -> list[Block]:
    """A section's blocks; a file with unexpected content gives a one-line note (and a warning) instead of
    losing the whole report at the end of a run."""
    try:
        return make()
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        warnings.warn(f"advopenood: report section {title!r} left out: {exc!r}", stacklevel=2)
        return [Block("h2", title), Block("p", f"This section could not be rendered: {exc!r}.")]


def build_report(out_dir: Path) -> list[Block]:
    """The report's blocks from the files in ``out_dir`` (sections whose file is absent are left out)."""
    out_dir = Path(out_dir)
    used: set[Path] = set()
    info = json.loads((out_dir / "run.json").read_text()) if (out_dir / "run.json").is_file() else {}
    title = (info.get("config") or {}).get("name") or out_dir.name
    blocks = [Block("h1", f"advopenood report: {title}")]
    if info:
        blocks += _guarded("Run", lambda: _run_section(info))
    asr = _read_csv(out_dir / "asr.csv")
    if asr is not None and not asr.empty:
        blocks += _guarded("Attack success rates", lambda: _asr_section(asr))
    ood = _read_csv(out_dir / "ood.csv")
    if ood is not None or (out_dir / "table_ood.md").is_file():
        blocks += _guarded("OOD detection", lambda: _ood_section(out_dir, ood, used))
    adaptive = _read_csv(out_dir / "table_adaptive.csv")
    if adaptive is not None and not adaptive.empty:
        blocks += _guarded("Detector-adaptive attacks", lambda: _adaptive_section(adaptive))
    mead = _read_csv(out_dir / "mead.csv")
    if mead is not None and not mead.empty:
        blocks += _guarded("MEAD worst case", lambda: _mead_section(mead))
    bintest = _read_csv(out_dir / "bintest.csv")
    if bintest is not None and not bintest.empty:
        blocks += _guarded("Binarization test", lambda: _bintest_section(bintest))
    gradcam = _read_csv(out_dir / "gradcam_summary.csv")
    if gradcam is not None and not gradcam.empty:
        blocks += _guarded("Grad-CAM attention shift", lambda: _gradcam_section(out_dir, gradcam, used))
    transfer = _read_csv(out_dir / "transfer.csv")
    if transfer is not None and not transfer.empty:
        blocks += _guarded("Black-box transfer", lambda: _transfer_section(transfer))
    rest = _plots(out_dir, "*.png", used)
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
        elif b.kind == "md":
            parts.append(b.content.rstrip())
        elif b.kind == "code":
            parts.append(f"<details><summary>{b.caption}</summary>\n\n```yaml\n{b.content.rstrip()}\n```\n\n</details>")
        elif b.kind == "img":
            parts.append(f"![{b.caption}]({Path(b.content).relative_to(out_dir).as_posix()})")
    return "\n\n".join(parts) + "\n"


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f2f2f2}td:first-child,th:first-child
{text-align:left}caption{font-weight:600;text-align:left;padding:.3em 0}img{max-width:100%;display:block;margin:.5em 0}
figure{margin:1em 0}figcaption{color:#555;font-size:.85em}pre{background:#f6f6f6;padding:.8em;overflow:auto}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}"""


def _html_table(df: pd.DataFrame, caption: str) -> str:
    cells = _cells(df)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cells.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>"
                   for row in cells.itertuples(index=False))
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _md_table_to_html(text: str) -> str:
    rows = [line.strip().strip("|").split("|") for line in text.strip().splitlines() if line.strip().startswith("|")]
    if len(rows) < 2:
        return f"<pre>{html.escape(text)}</pre>"
    body = pd.DataFrame([[c.strip() for c in r] for r in rows[2:]], columns=[c.strip() for c in rows[0]])
    return _html_table(body, "")


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
        elif b.kind == "md":
            parts.append(_md_table_to_html(b.content))
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

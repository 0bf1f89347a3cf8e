"""The independent checker (:mod:`advopenood.evaluation.oracle`): it agrees with the writers on real scores and with
hand-computed cases, no verify hook imports the code it checks, and ``advopenood verify`` in a fresh process
re-derives every table of every evaluator with a hook (one edited number of any of them is a difference)."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from advopenood.evaluation import intervals, metrics, oracle

# ------------------------------------------------------------------------------------------------ hand-computed

#: (ID confidences, OOD confidences, expected metrics in percent), worked by hand
HAND = [
    ([3, 4], [1, 2], {"auroc": 100.0, "fpr95": 0.0, "aupr_in": 100.0, "aupr_out": 100.0}),
    # one tie group: ROC (0, 0) -> (1, 1); PR points (recall 1, precision 1/2) after (0, 1): area 3/4
    ([1, 1], [1, 1], {"auroc": 50.0, "fpr95": 100.0, "aupr_in": 75.0, "aupr_out": 75.0}),
    # ID 2 > OOD 1 and ID 0 < OOD 1: half the pairs; the first point reaching TPR 95 % is (FPR 1/2, TPR 1)
    ([2, 0], [1], {"auroc": 50.0, "fpr95": 50.0}),
    # OOD 0..19, ID 10.5..29.5: TPR 19/20 first at conf <= 18, which flags ID 10.5..17.5: FPR95 = 8/20
    (list(np.arange(10.5, 30.0)), list(np.arange(20.0)), {"fpr95": 40.0}),
    # OOD 0..17, then ties (18: 1 ID + 1 OOD), (19: 1 ID + 1 OOD), then ID 20..27: the point (FPR 1/10, TPR 19/20) lies
    # on the line from (0, 18/20) to (2/10, 20/20), so sklearn's roc_curve drops it and FPR95 is 2/10, not 1/10;
    # AUROC = (18.5 + 19.5 + 8 * 20) / 200
    ([18, 19, *range(20, 28)], [*range(18), 18, 19], {"auroc": 99.0, "fpr95": 20.0}),
]


@pytest.mark.parametrize("conf_id, conf_ood, want", HAND)
def test_hand_computed_metrics(conf_id, conf_ood, want):
    conf_id, conf_ood = np.array(conf_id, float), np.array(conf_ood, float)
    got = oracle.ood_metrics(conf_id, conf_ood, want)
    assert got == pytest.approx(want, abs=1e-12)
    assert {m: metrics.ood_metrics(conf_id, conf_ood)[m] for m in want} == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("conf_id, conf_ood", [([], [1.0]), ([1.0], []), ([np.nan, 1.0], [0.0])])
def test_an_empty_side_or_a_nan_gives_nan(conf_id, conf_ood):
    assert all(np.isnan(v) for v in oracle.ood_metrics(np.array(conf_id), np.array(conf_ood)).values())


@pytest.mark.parametrize("successes, n, want", [(0, 10, (0.0, 27.753)), (10, 10, (72.247, 100.0)),
                                                (5, 10, (23.659, 76.341)), (0, 0, (np.nan, np.nan))])
def test_wilson_by_hand(successes, n, want):
    """Wilson's interval for 0, 5 and 10 of 10 (Newcombe 1998, Table I: 0 of 10 -> 0 to 0.2775)."""
    assert oracle.wilson(successes, n) == pytest.approx(want, abs=1e-3, nan_ok=True)


def test_the_percentile_interval_is_the_linear_quantile():
    """Of 0..100: the 2.5 % quantile at position 2.5 and the 97.5 % one at 97.5."""
    assert oracle.percentile_interval(np.arange(101.0)) == pytest.approx((2.5, 97.5))


def test_the_cell_seed_follows_its_definition():
    """The first 8 bytes of SHA-256 of ``"0\\0ood|msp|textures"``, little-endian (:mod:`hashlib`, not ``struct``)."""
    import hashlib

    digest = hashlib.sha256(b"0\x00ood|msp|textures").digest()
    assert oracle.cell_seed(0, "ood|msp|textures") == int.from_bytes(digest[:8], "little")


# ------------------------------------------------------------------------------------ agreement on real scores


@pytest.fixture(scope="module")
def real_cells(cifar_model, cifar_test, pack_set) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Real confidences of the CIFAR-10 ResNet-20 on 40 CIFAR-10 test images (ID) and 40 Textures images (OOD):
    MSP, energy, and both rounded to 2 decimals (many ties); MSP saturates at 1 on confident images."""
    from advopenood.data.datasets import stack

    out = {}
    with torch.no_grad():
        logits = {side: cifar_model(stack(ds, list(range(40)))[0]).double()
                  for side, ds in (("id", cifar_test), ("ood", pack_set("texture", "texture_test.npz", 40)))}
    for name, fn in (("msp", lambda z: torch.softmax(z, 1).amax(1)), ("energy", lambda z: torch.logsumexp(z, 1))):
        conf = {side: fn(z).numpy() for side, z in logits.items()}
        out[name] = (conf["id"], conf["ood"])
        out[f"{name}_rounded"] = (np.round(conf["id"], 2), np.round(conf["ood"], 2))
    return out


CELLS = ["msp", "energy", "msp_rounded", "energy_rounded"]


@pytest.mark.parametrize("cell", CELLS)
def test_the_oracle_agrees_with_the_writers_metrics(real_cells, cell):
    conf_id, conf_ood = real_cells[cell]
    assert oracle.ood_metrics(conf_id, conf_ood) == pytest.approx(metrics.ood_metrics(conf_id, conf_ood), abs=1e-9)
    assert oracle.delong_interval(conf_id, conf_ood) == \
        pytest.approx([100 * b for b in metrics.auroc_interval(conf_id, conf_ood)], abs=1e-9)


@pytest.mark.parametrize("cell", CELLS)
def test_the_oracle_agrees_with_the_writers_seeded_bootstrap(real_cells, cell):
    conf_id, conf_ood = real_cells[cell]
    bounds, reps, _ = intervals.metric_intervals(conf_id, conf_ood, "bootstrap", 3, f"ood|{cell}|textures", 300)
    got, own = oracle.bootstrap_interval(conf_id, conf_ood, 3, f"ood|{cell}|textures", 300)
    for m in oracle.METRICS:
        np.testing.assert_allclose(own[m], reps[m], rtol=0, atol=1e-9)
        assert got[m] == pytest.approx(intervals.percentile(reps[m]), abs=1e-6)  # before the rule at a bound
        want = oracle.bounded(m, oracle.ood_metrics(conf_id, conf_ood)[m], *got[m], len(conf_id), len(conf_ood))
        assert want[:2] == pytest.approx((bounds[f"{m}_lo"], bounds[f"{m}_hi"]), abs=1e-6, nan_ok=True)


@pytest.mark.parametrize("a, b", [("msp", "energy"), ("msp_rounded", "energy_rounded")])
def test_the_oracle_agrees_on_paired_differences(real_cells, a, b):
    """The paired bootstrap (both detectors on the same draws) and DeLong's interval on the difference."""
    writer = intervals.paired_replicates([real_cells[a], real_cells[b]], 5, "paired|textures", 300)
    own = [r["auroc"] for r in oracle.seeded_replicates([real_cells[a], real_cells[b]], 5, "paired|textures", 300,
                                                         ("auroc",))]
    assert oracle.percentile_interval(own[0] - own[1]) == \
        pytest.approx(intervals.percentile(writer[0]["auroc"] - writer[1]["auroc"]), abs=1e-6)
    want = metrics.auroc_difference_interval(*real_cells[a], *real_cells[b])
    assert oracle.delong_difference(real_cells[a], real_cells[b]) == pytest.approx([100 * w for w in want], abs=1e-9)


@pytest.mark.parametrize("n", [1, 7, 16, 80])
def test_the_oracle_agrees_with_the_writers_wilson(n):
    for k in range(n + 1):
        assert oracle.wilson(k, n) == pytest.approx(intervals.wilson(k, n), abs=1e-6)


# ---------------------------------------------------------------------------------------- no shared code path

#: writer modules of the core that no checker may import (``advopenood.plugin`` re-exports the metrics: a name read
#: from it counts as an import of the module it comes from, :func:`_public_sources`; the module itself is a writer)
CORE_WRITERS = {"advopenood.evaluation.metrics", "advopenood.evaluation.intervals", "advopenood.plugin"}


def _public_sources() -> dict[str, str]:
    """``advopenood.plugin``'s names -> the module each is imported from there (its own imports and its lazy names)."""
    from advopenood import plugin

    sources = dict(plugin._LAZY)
    for node in ast.parse(Path(plugin.__file__).read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module.startswith("advopenood"):
            sources.update({a.asname or a.name: node.module for a in node.names})
    return sources


def _imports(module: str) -> set[str]:
    """Every module a module's source imports (at any depth of its code), relative imports resolved; for
    ``from X import y`` both ``X`` and ``X.y``, and for ``from advopenood.plugin import y`` the module ``y`` comes
    from (and ``advopenood.plugin.y``) instead: the built-in checkers read the core through the public API."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            if base == "advopenood.plugin":
                sources = _public_sources()
                found |= {f"{base}.{a.name}" for a in node.names}
                found |= {m for a in node.names for m in (sources[a.name], f"{sources[a.name]}.{a.name}")}
            else:
                found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return found


def _module(name: str) -> bool:
    """Whether a dotted name is an importable module (not a name inside one)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, AttributeError, ValueError):
        return False


def _checkers() -> tuple[dict[str, set[str]], set[str]]:
    """``({checker module: its imports}, writer modules)``: the checkers are the modules of the built-in verify
    hooks, the plugin modules named ``verify*`` they import (transitively), the oracle and the core's verify; the
    writers are the modules that define a registered plugin, the core's metrics and intervals, and every other
    plugin module."""
    from advopenood import registry
    from advopenood.capabilities import is_verifiable

    writers = set(CORE_WRITERS)
    todo = ["advopenood.evaluation.oracle", "advopenood.evaluation.verify"]
    for kind in registry.KINDS:
        for entry in registry.entries(kind).values():
            writers.add(getattr(entry.obj, "__module__", ""))
            if is_verifiable(entry.obj) and entry.obj.verify.__module__.startswith("advopenood_plugins"):
                todo.append(entry.obj.verify.__module__)
    seen: dict[str, set[str]] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen[module] = _imports(module)
        for name in seen[module]:
            if name.startswith("advopenood_plugins.") and _module(name):
                if name.rpartition(".")[2].startswith("verify") and name not in writers:
                    todo.append(name)
                else:
                    writers.add(name)
    return seen, writers


def test_no_checker_imports_the_code_it_checks():
    """A verify hook (and every checker it reads from) imports neither the core's metrics and intervals nor a plugin
    module other than a checker (so not the plugin it checks): one bug cannot hide in a table and in its check."""
    checkers, writers = _checkers()
    hooks = [m for m in checkers if m.startswith("advopenood_plugins")]
    assert len(hooks) >= 8, hooks  # ood, paired, robust, robust_paired, smoothed, mead, multiattack, transfer
    bad = {m: sorted(i & writers) for m, i in checkers.items() if i & writers}
    assert bad == {}


def test_the_import_check_sees_a_writer_import(tmp_path, monkeypatch):
    """The check above parses nested imports too (a hook once imported the bootstrap's draws inside a function), and
    sees a metric read through the public API."""
    nested = ("def verify(run):\n    from advopenood.evaluation.intervals import draw\n"
              "    from advopenood.plugin import auroc, compare\n")
    (tmp_path / "fake_checker.py").write_text(nested)
    monkeypatch.syspath_prepend(str(tmp_path))
    writers = {"advopenood.evaluation.intervals", "advopenood.evaluation.metrics"}
    assert _imports("fake_checker") & CORE_WRITERS == writers


# ------------------------------------------------------------------ advopenood verify of every evaluator's tables


@pytest.fixture(scope="module")
def every_run(session_cache, tmp_path_factory) -> Path:
    """A demo run (16 images) with every evaluator that has a verify hook but ``transfer`` (it trains surrogate
    models): ood (with paired.csv), smoothed, robust_auroc (with robust_paired.csv), levels, mead, multiattack; MSP,
    energy and smoothed MSP; FGSM, PGD, the adaptive attacks and their EOT twin; 100 bootstrap resamples."""
    from advopenood.cli.main import main

    cfg = yaml.safe_load((resources.files("advopenood.configs") / "demo.yaml").read_text())
    steps = {"steps": 3, "eps": "16/255"}
    cfg.update(attacks=["fgsm", "pgd", "adaptive", "adaptive_eot"], detectors=["msp", "ebo", "smoothed_msp"],
               evaluators=["ood", "smoothed", "robust_auroc", "levels", "mead", "multiattack"], analyses=[],
               ci={"method": "bootstrap", "resamples": 100},
               attack_params={"pgd": steps, "adaptive": {**steps, "lam": [1.0]},
                              "adaptive_eot": {**steps, "lam": [1.0]}, "robust_id": {"steps": 3},
                              "robust_ood": {"steps": 3}},
               evaluator_params={"robust_auroc": {"ood_sets": ["textures"], "eot": 2}},
               detector_params={"smoothed_msp": {"n": 4, "sigma": 0.1}})
    folder = tmp_path_factory.mktemp("every")
    (folder / "every.yaml").write_text(yaml.safe_dump(cfg))
    out = folder / "run"
    assert main(["run", "--config", str(folder / "every.yaml"), "--out", str(out), "--quiet", "--limit", "16"]) == 0
    return out


def _verify(run: Path) -> subprocess.CompletedProcess:
    """``advopenood verify RUN`` in a new Python process."""
    return subprocess.run([sys.executable, "-m", "advopenood.cli", "verify", str(run)], capture_output=True, text=True,
                          env=os.environ.copy())


#: one number of each table a hook re-derives: (table, column); the first row where the column holds a number
EDITS = [("asr.csv", "asr"), ("ood.csv", "auroc"), ("ood.csv", "aupr_in_hi"), ("leaderboard.csv", "adv_auroc"),
         ("paired.csv", "delta_auroc_lo"), ("table_smoothed.csv", "auroc_plain"), ("robust_auroc.csv", "robust_fpr95"),
         ("robust_paired.csv", "delta_robust_auroc"), ("levels.csv", "auroc"), ("mead.csv", "auroc"),
         ("mead_summary.csv", "fpr95"), ("multiattack_curves.csv", "auroc_hi"), ("multiattack.csv", "avg"),
         ("table_ood.csv", "digits fgsm AUROC"), ("table_ood.csv", "digits none FPR95"),
         ("table_adaptive.csv", "auroc_adaptive"), ("table_adaptive.csv", "delta_auroc"),
         ("table_adaptive.csv", "fpr95_baseline")]


def test_every_evaluator_ran_and_an_untouched_run_verifies_in_a_fresh_process(every_run):
    info = json.loads((every_run / "run.json").read_text())
    assert not info["plugin_errors"] and not info["detector_errors"]
    tables = {(e.values if hasattr(e, "marks") else e)[0] for e in EDITS}
    assert tables <= {p.name for p in every_run.iterdir()}
    done = _verify(every_run)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 difference(s)" in done.stdout


def test_one_edited_number_of_any_table_fails_verify(every_run, tmp_path, capsys):
    """One number of each table in :data:`EDITS` edited, all in one copy verified once in this process (the
    untouched run's test above checks a fresh one; one verify instead of one a table: each took the whole
    re-derivation): every edit is a difference of its table and column, and every difference is one of the edits
    (an edit that spilled into another table's or column's check would be a difference of none)."""
    run = tmp_path / "run"
    shutil.copytree(every_run, run)
    for table, column in EDITS:
        frame = pd.read_csv(run / table)
        frame[column] = frame[column].astype(float)
        row = int(np.flatnonzero(frame[column].notna().to_numpy())[0])
        frame.loc[row, column] += 0.5
        frame.to_csv(run / table, index=False, float_format="%.6g")
    from advopenood.cli.main import main

    code = main(["verify", str(run)])
    out = capsys.readouterr().out
    lines = [line.split("DIFFERENCE: ", 1)[1] for line in out.splitlines() if "DIFFERENCE: " in line]
    assert code == 1, out

    def names(line: str, table: str, column: str) -> bool:  # table_ood.csv is compared in long form (column, value)
        return line.startswith(f"{table}: ") and (f" {column}: " in line or f"'column': '{column}'}} value: " in line)

    def quotes(line: str) -> bool:  # a claim quoting an edited cell disagrees with its table too
        return line.startswith("claims.json: ") and any(f"is not {table}'s" in line for table, _ in EDITS)

    assert [e for e in EDITS if not any(names(line, *e) for line in lines)] == [], lines
    assert [line for line in lines if not (quotes(line) or any(names(line, *e) for e in EDITS))] == [], lines


@pytest.mark.parametrize("seed", range(4))
def test_the_oracle_agrees_with_sklearn_on_tied_resampled_scores(seed):
    """The checker's metrics and bootstrap replicates against sklearn's roc_curve / precision_recall_curve, on scores
    with many ties, drawn with repeats as a bootstrap draws them (values a resample does not hold left out)."""
    from sklearn.metrics import auc, precision_recall_curve, roc_auc_score, roc_curve

    def sk(conf_id, conf_ood):
        y, score = np.r_[np.zeros(len(conf_id)), np.ones(len(conf_ood))], -np.r_[conf_id, conf_ood]
        fpr, tpr, _ = roc_curve(y, score)
        p_out, r_out, _ = precision_recall_curve(y, score)
        p_in, r_in, _ = precision_recall_curve(1 - y, -score)
        return {"auroc": 100 * roc_auc_score(y, score), "fpr95": 100 * fpr[np.argmax(tpr >= 0.95)],
                "aupr_out": 100 * auc(r_out, p_out), "aupr_in": 100 * auc(r_in, p_in)}

    rng = np.random.default_rng(seed)
    for _ in range(40):
        n, m = rng.integers(2, 50, 2)
        grid = rng.choice([2, 4, 50])
        conf_id, conf_ood = np.round(rng.normal(0.4, 1, n) * grid) / grid, np.round(rng.normal(0, 1, m) * grid) / grid
        assert oracle.ood_metrics(conf_id, conf_ood) == pytest.approx(sk(conf_id, conf_ood), abs=1e-9)
        idx_id, idx_ood = rng.integers(0, n, (3, n)), rng.integers(0, m, (3, m))
        reps = oracle.replicates(conf_id, conf_ood, idx_id, idx_ood)
        for b in range(3):
            want = sk(conf_id[idx_id[b]], conf_ood[idx_ood[b]])
            assert {k: v[b] for k, v in reps.items()} == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("grid", [1, 37, 1000])
def test_the_oracles_replicates_do_not_depend_on_how_the_resamples_are_blocked(monkeypatch, grid):
    """Each resample's metrics are read off its own sorted row, whatever other rows share its block: one resample per
    block (``GRID`` 1), blocks that split the rows unevenly, and all rows in one block give the same numbers."""
    rng = np.random.default_rng(5)
    conf_id, conf_ood = np.round(rng.normal(0.5, 1, 23) * 3) / 3, np.round(rng.normal(0, 1, 31) * 3) / 3
    idx_id, idx_ood = rng.integers(0, 23, (40, 23)), rng.integers(0, 31, (40, 31))
    whole = oracle.replicates(conf_id, conf_ood, idx_id, idx_ood)
    monkeypatch.setattr(oracle, "GRID", grid)
    blocked = oracle.replicates(conf_id, conf_ood, idx_id, idx_ood)
    for metric, values in whole.items():
        np.testing.assert_array_equal(blocked[metric], values, err_msg=metric)

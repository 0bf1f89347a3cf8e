"""``advopenood`` command line: run, attack, demo, list, eval-ood, and one subcommand per analysis that declares
one (:class:`advopenood.capabilities.CommandAnalysis`).

Bad input exits with code 2 and one line naming the bad value and the valid choices, no traceback. A run in which
a plugin (detector, evaluator or analysis) failed writes every other output and exits with code 3; a run that a full,
read-only or over-quota file system stopped commits nothing and exits with code 3 too, in one line.
"""
from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning (set before torch loads): on a loaded machine a spinning pool
# makes a run several times slower. The user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import errno  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from typing import TYPE_CHECKING, Any, Callable, Sequence  # noqa: E402

from advopenood import __version__, plugin_index, registry  # noqa: E402
from advopenood.cli.parsing import OneLineParser, positive_int  # noqa: E402
from advopenood.cli.precheck import precheck  # noqa: E402
from advopenood.errors import STORAGE_ERRNOS, StorageError, UsageError, storage_error  # noqa: E402

if TYPE_CHECKING:
    from advopenood.config.plan import RunPlan

#: The demo's wall time, the one figure --help, README.md and the docs quote (measured: benchmarks/README.md's demo
#: row; tests/test_docs.py checks that every page quotes this one)
DEMO_TIME = "about 45 s on 2 idle CPU cores, about 2 min on 2 busy ones"
#: The core's subcommands; analyses add theirs between ``demo`` and ``list`` (:func:`commands`).
COMMANDS = {
    "run": "attacks, detectors, evaluators and analyses of a config; writes CSVs, plots and a report",
    "attack": "generate (or reuse) the adversarial sets of a config and write asr.csv only",
    "demo": f"the embedded demo (no download; {DEMO_TIME}): every stage on built-in data",
    "list": "registered plugins of a kind (attacks, detectors, evaluators, analyses), one line each",
    "verify": "re-derive every table of a run folder from its saved scores, masks and run.json; exit 1 on a difference",
    "leaderboard": "build the robust-OOD leaderboard (HTML, CSV, Markdown, LaTeX) from benchmark entries or run "
                   "folders; --verify re-derives every cell",
    "eval-ood": "OpenOOD's scripts/eval_ood.py with adversarial splits (needs OpenOOD)",
}
#: Settings each core subcommand forces over the config.
FORCED = {"attack": {"analysis": "", "evaluator": "", "detectors": ""}}


def analysis_commands() -> dict[str, type]:
    """``command -> analysis class`` for every registered analysis declaring a subcommand (imports them)."""
    from advopenood.capabilities import CommandAnalysis

    out: dict[str, type] = {}
    for entry in registry.entries("analyses").values():
        obj = entry.obj
        if isinstance(obj, type) and issubclass(obj, CommandAnalysis) and obj.command:
            if obj.command in COMMANDS or obj.command in out:
                raise UsageError(f"analysis {entry.name!r} declares subcommand {obj.command!r}, which is taken; "
                                 f"valid choices: a name not in {', '.join([*COMMANDS, *out])}")
            out[obj.command] = obj
    return out


def commands(store_index: bool = True) -> dict[str, str]:
    """Every subcommand with its help line, in help order (the analyses' from the plugin index: no import). A
    command that runs work passes ``store_index=False``: a run refused by its checks writes nothing."""
    core = list(COMMANDS.items())
    extra = list(plugin_index.index(store=store_index)["commands"].items())
    taken = [name for name, _ in extra if name in COMMANDS]
    if taken:
        raise UsageError(f"an analysis declares subcommand {taken[0]!r}, which is taken; valid choices: a name not in "
                         f"{', '.join(COMMANDS)}")
    return dict(core[:3] + extra + core[3:])


def _cores(text: str) -> int:
    value = positive_int(text) if text != "0" else 0
    cores = os.cpu_count() or 1
    if value > cores:
        raise argparse.ArgumentTypeError(f"{value} exceeds the {cores} cores of this machine; valid choices: 0..{cores}")
    return value


#: ``--protocol hekal2026``'s help in a subcommand that writes tables: the command of protocols.HEKAL_COMMAND (not
#: imported: ``--help`` imports no stage)
HEKAL_TABLE = ("ROSS's Table 2, which runs as: advopenood run --config cifar10_resnet20 --protocol hekal2026 --attack "
               "hekal_min,hekal_max --eps 2/255,4/255,8/255,16/255 --detectors gen,ross_gen --evaluator ood,hekal2026")


def _common_flags(p: argparse.ArgumentParser, config_required: bool, tables: bool = False) -> None:
    from advopenood.config.packaged import packaged_configs

    p.add_argument("--config", required=config_required,
                   help=f"YAML path or packaged name: {', '.join(packaged_configs())}")
    p.add_argument("--data-root", help="folder the config's data files and checkpoint are relative to "
                                       "(for OpenOOD data, its data/ folder)")
    p.add_argument("--out", help="output folder (default runs/<config name>); it holds only this run's files")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an output folder that holds files advopenood did not write (they are kept)")
    p.add_argument("--protocol", help="strong (default, ours) | lorenz2024 | mahmood2021 | hekal2026 ("
                                      + (HEKAL_TABLE if tables else "ROSS's Table 2: see advopenood run --help")
                                      + "); see docs/concepts.md, 'Protocols'")
    p.add_argument("--limit", type=positive_int,
                   help="evaluate the first N images of a seeded permutation of each test set (ID and natural OOD)")
    p.add_argument("--device", help="cpu | cuda | cuda:N")
    p.add_argument("--seed", type=int, help="seed of every random choice (default 0); written into every result")
    p.add_argument("--cache-dir", help="attack store and model cache (default $ADVOPENOOD_CACHE or ~/.cache/advopenood)")
    p.add_argument("--num-workers", type=_cores, help="data-loading worker processes (default 0; at most the cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--amp", action="store_const", const=True,
                   help="mixed precision (bfloat16 autocast) and channels-last on a GPU; a no-op on the CPU (run.json says so)")


def _attack_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attack", "--attacks", dest="attack",
                   help="comma-separated attacks, e.g. pgd,fgsm,df,mpgd (advopenood list attacks)")
    p.add_argument("--eps", help="budget(s) for bounded attacks, e.g. 8/255 or 0.01,0.03 (a sweep)")
    p.add_argument("--shard-size", type=positive_int, help="images per stored shard (default 256)")
    p.add_argument("--recompute", help="attack sets and/or detectors (comma-separated, or all) whose stored work is "
                                       "computed again and replaced, e.g. after changing a plugin's code in place")
    p.add_argument("--export-png", action="store_true",
                   help="also export adversarial sets as PNG + OpenOOD image lists under OUT/openood/")


def _detection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--detectors", "--detector", dest="detectors",
                   help="all, or comma-separated detector names (advopenood list detectors)")
    p.add_argument("--detector-backend", help="auto | openood | pytorch-ood")
    p.add_argument("--evaluator", "--evaluators", dest="evaluator", help="comma-separated evaluators (default: ood)")
    p.add_argument("--analysis", "--analyses", dest="analysis",
                   help="comma-separated analyses (advopenood list analyses)")
    p.add_argument("--ci", help="95 %% interval beside every metric: bootstrap (default) | delong | none")
    p.add_argument("--ci-resamples", type=int,
                   help="bootstrap resamples per cell (default 2000; 100 to 100000; no effect under --ci delong or "
                        "none)")
    p.add_argument("--latex", choices=("headline", "all"), default="headline",
                   help="tables.tex: headline (default: the report's headline tables and asr.csv) | all (every CSV "
                        "too; longtable where long)")


SUBCOMMAND_FLAGS: dict[str, list[Callable[[argparse.ArgumentParser], None]]] = {
    "run": [lambda p: _common_flags(p, True, tables=True), _attack_flags, _detection_flags],
    "attack": [lambda p: _common_flags(p, True), _attack_flags],
    "demo": [lambda p: _common_flags(p, False, tables=True), _attack_flags, _detection_flags],
}
#: The flags of an analysis' own subcommand: a config and its attacks (the analysis fixes the rest).
ANALYSIS_FLAGS: list[Callable[[argparse.ArgumentParser], None]] = [lambda p: _common_flags(p, True), _attack_flags]


def build_parser(store_index: bool = True) -> argparse.ArgumentParser:
    """The top-level parser; each subcommand has its own parser with only its own flags."""
    parser = OneLineParser(prog="advopenood", description="Adversarial robustness of OpenOOD's post-hoc OOD detectors.",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"advopenood {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    listed = commands(store_index)
    analyses = [name for name in listed if name not in COMMANDS]
    for name, help_text in listed.items():
        if name == "eval-ood":
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == "list":
            p.add_argument("kind", help=" | ".join([*registry.KINDS, "benchmarks"]))
            p.add_argument("--all", action="store_true", dest="every",
                           help="every name that resolves, one per line (the families' names too)")
            p.add_argument("--filter", dest="pattern", metavar="PATTERN",
                           help="only the names (of every one, as --all) that match the shell-style PATTERN, "
                                "e.g. '*ross*'")
        if name == "verify":
            p.add_argument("run", help="a run's output folder (the --out of advopenood run)")
            p.add_argument("--quiet", action="store_true", help="no progress bar (stderr)")
        if name == "leaderboard":
            p.add_argument("paths", nargs="+", metavar="ENTRY_OR_RUN",
                           help="entries (entries/<detector>.json of a benchmark run) or benchmark run folders")
            p.add_argument("--out", help="the site's folder (default site/): an HTML page and exports per benchmark")
            p.add_argument("--verify", action="store_true",
                           help="re-derive every entry from its run folder (as advopenood verify); exit 1 naming the "
                                "cell that differs")
        if name == "run":
            p.add_argument("--benchmark", help="a standard benchmark (advopenood list benchmarks): it fixes the data, "
                                               "threat model and evaluation; the config gives the model")
        for add in ANALYSIS_FLAGS if name in analyses else SUBCOMMAND_FLAGS.get(name, []):
            add(p)
    return parser


def plan_flags(args: argparse.Namespace, **forced: Any) -> dict[str, Any]:
    """The keywords of :func:`advopenood.config.loading.load_plan` that a subcommand's flags set (``forced`` values
    replace flags)."""
    names = ("data_root", "out", "protocol", "attack", "eps", "detectors", "detector_backend", "evaluator", "analysis",
             "limit", "device", "seed", "cache_dir", "shard_size", "num_workers", "amp", "recompute", "ci",
             "ci_resamples")
    flags = {k: getattr(args, k, None) for k in names}
    flags["channels_last"] = flags["amp"]
    flags.update({k: v for k, v in forced.items() if v is not None})
    return flags


def _plan(args: argparse.Namespace, benchmark: Any = None, **forced: Any) -> RunPlan:
    """The run plan of a subcommand's config and flags (``forced`` values replace flags), validated once
    (:func:`advopenood.config.loading.load_plan`)."""
    from advopenood.config.loading import load_plan

    return load_plan(args.config or "demo", benchmark=benchmark, **plan_flags(args, **forced))


def cmd_list(kind: str, every: bool = False, pattern: str | None = None) -> int:
    """One line per registered plugin of ``kind`` and one per family (its pattern, what it does and takes, and its
    shorthand), from the plugin index; with ``every`` one line per name that resolves, the name first, then its
    description, printed as each is made (:func:`advopenood.registry.iter_entries`); with ``pattern`` (shell-style,
    :mod:`fnmatch`, as timm's ``list_models(filter)``) only the names, of every one, that match it. A name or family
    that a clash makes unusable is listed as ``UNUSABLE`` with the clash's line. A UsageError when a plugin package
    failed to load."""
    if kind == "benchmarks":
        from advopenood.config.benchmarks import benchmarks

        for bench in benchmarks().values():
            print(f"{bench.name}  {bench.summary()}")
        return 0
    if kind not in registry.KINDS:
        raise UsageError(f"unknown plugin kind {kind!r}; valid choices: {', '.join([*registry.KINDS, 'benchmarks'])}")
    listing = plugin_index.index()
    if listing.get("failed"):  # a list without the failed package's plugins would look complete
        raise UsageError(f"{listing['failed']} (advopenood list {kind} would lack its plugins)")
    unusable = {name: f"UNUSABLE: {line}" for name, line in (listing.get("clashes") or {}).get(kind, {}).items()}
    if every or pattern is not None:
        return _stream(kind, unusable, pattern)
    rows = {name: description for name, (description, *_) in listing[kind].items()}
    families = listing["families"][kind]
    folded = {row[3] for row in families.values() if row[3]}
    rows = {name: text for name, text in rows.items() if name not in folded}
    for family_pattern, (description, _, takes, shorthand, *_) in families.items():
        rows[family_pattern] = " ".join([description, f"For {takes}." if takes else "",
                                         f"'{shorthand}' selects one per selected detector." if shorthand else ""]
                                        ).strip()
    rows = dict(sorted({**rows, **unusable}.items()))
    width = max((len(n) for n in rows), default=0)
    return _print_rows(((name, text) for name, text in rows.items()), width)


def _stream(kind: str, unusable: dict[str, str], pattern: str | None) -> int:
    """``list --all`` / ``--filter``: every name that resolves (and matches ``pattern``), in order, each printed as
    it is made; the column width is that of the longest name the grammar allows, known before any is made."""
    import fnmatch
    import heapq

    def keep(name: str) -> bool:
        return pattern is None or fnmatch.fnmatchcase(name, pattern)

    width = max((len(n) for n in registry.default().names_by_grammar(kind) if keep(n)), default=0)
    made = ((name, entry.description) for name, entry in registry.iter_entries(kind) if keep(name))
    return _print_rows(heapq.merge(made, sorted((n, t) for n, t in unusable.items() if keep(n))), width)


def _print_rows(rows: Any, width: int) -> int:
    """Print ``(name, text)`` rows as they come, the names padded to ``width``; quiet when the reader left."""
    try:
        for name, description in rows:
            print(f"{name:<{width}}  {description}", flush=True)
    except BrokenPipeError:  # `advopenood list attacks | head -1`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit is quiet too
    return 0


def cmd_verify(run: str, progress: bool = True) -> int:
    """Print every difference between a run's tables and their re-derivation, and every file that differs from its
    recorded digest; 1 if there is one, else 0."""
    from advopenood.evaluation.runfiles import RunFiles

    RunFiles.open(run)  # a folder that is not a run's is refused before torch loads
    from advopenood.evaluation.verify import verify_run

    found = verify_run(run, progress)
    for line in found.notes:
        print(f"advopenood verify: note: {line}")
    for line in found.files:
        print(f"advopenood verify: FILE: {line}")
    for line in found.differences:
        print(f"advopenood verify: DIFFERENCE: {line}")
    print(f"advopenood verify: {run}: {len(found.differences)} difference(s), {len(found.files)} file finding(s)"
          + (f", {len(found.notes)} note(s)" if found.notes else ""))
    return 1 if found.differences or found.files else 0


def _benchmark(args: argparse.Namespace) -> Any:
    """The benchmark of ``run --benchmark`` (None without): a flag that would change what it fixes, an unknown
    name, or a data file without its images is refused in one line, before any work."""
    if getattr(args, "benchmark", None) is None:
        return None
    from advopenood.config.benchmarks import benchmark, check_flags

    check_flags(args)
    return benchmark(args.benchmark)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that a run cleans up as on Ctrl-C (its staging folder is
    removed) and the CLI exits with 143 and one line."""


def _terminate(signum: int, frame: object) -> None:
    """The SIGTERM handler: a second SIGTERM during the clean-up ends the process at once."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns the exit code (0, 1 from verify, 2 bad input, 3 a plugin failed or the file system took no
    more writes, 130 Ctrl-C, 143 SIGTERM)."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def warn_clashes(listing: dict[str, Any]) -> None:
    """One warning line on stderr per clash of the installed plugins (:func:`advopenood.registry.clashes`, from the
    plugin index): every clash at once, each naming the plugins, the fix and the names it makes unusable. ``--help``,
    ``list`` and ``verify`` warn first; a run once its plan passed its checks (a run that asks for a clashing name is
    refused in the clash's one line)."""
    for line in registry.clash_lines(listing.get("clashes") or {}):
        print(f"advopenood: warning: {line}", file=sys.stderr)


def _finished(ctx: Any, args: argparse.Namespace) -> int:
    """Print what a finished run did (summary, notes, failures); its exit code: 3 when a plugin failed, else 0."""
    for line in ctx.outcome.export:
        print(line)
    for rel, aside in ctx.outcome.kept.items():
        print(f"advopenood: note: {rel!r} in {str(ctx.out)!r} was not the previous run's (changed since, or not "
              f"written by advopenood); kept as {aside!r}", file=sys.stderr)
    if ctx.rank != 0:
        return 0
    from advopenood.run.summary import summary

    for line in summary(ctx):
        print(f"advopenood: {line}")
    for label, reason in ctx.nothing_computed.items():
        print(f"advopenood: {label} had nothing to compute: {reason}", file=sys.stderr)
    unbudgeted = [repr(name) for name, adv in ctx.adv_sets.items() if adv.eps is None]
    if getattr(args, "eps", None) is not None and unbudgeted:
        print(f"advopenood: note: --eps {args.eps} did not apply to {', '.join(unbudgeted)} (minimal-perturbation "
              "attacks have no budget; asr.csv leaves their eps empty)", file=sys.stderr)
    for label, reason in ctx.failures.items():
        print(f"advopenood: {label} failed: {reason}", file=sys.stderr)
    if ctx.failures:
        print(f"advopenood: wrote {ctx.out} without the outputs of {len(ctx.failures)} failed plugin(s); "
              f"tracebacks in {ctx.out / 'errors.log'}", file=sys.stderr)
        return 3
    print(f"advopenood: wrote {ctx.out}")
    return 0


def _main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["eval-ood"]:
            from advopenood.cli.eval_ood import eval_ood_main

            return eval_ood_main(argv[1:])
        asks_help = not argv or argv[0] == "list" or bool({"-h", "--help"} & set(argv))
        parser = build_parser(store_index=asks_help)
        listing = plugin_index.index(store=asks_help)
        if asks_help or argv[0] == "verify":  # a run warns once its checks passed: a refusal stays one line
            warn_clashes(listing)
        if not argv:
            parser.print_help()
            return 0
        args = parser.parse_args(argv)
        if args.command == "list":
            return cmd_list(args.kind, args.every, args.pattern)
        if args.command == "verify":
            return cmd_verify(args.run, not args.quiet)
        if args.command == "leaderboard":
            from advopenood.run.leaderboard import cmd_leaderboard

            return cmd_leaderboard(args.paths, args.out or "site", verify=args.verify)
        bench = _benchmark(args)
        # bad flags, names, config keys and values, folders and files are refused before torch and the plugins load
        precheck(args, plan_flags(args, **FORCED.get(args.command, {})), bench)
        from advopenood.run import pipeline
        from advopenood.run.resolved import resolve

        analyses = analysis_commands()
        forced = dict(analyses[args.command].command_settings) if args.command in analyses else \
            FORCED.get(args.command, {})
        run = resolve(_plan(args, bench, **forced), attack_only=args.command == "attack", overwrite=args.overwrite)
        warn_clashes(listing)
        ctx = pipeline.run(run, progress=not args.quiet, export_png=args.export_png,
                           latex=getattr(args, "latex", "headline"))
        return _finished(ctx, args)
    except UsageError as exc:
        print(f"advopenood: error: {exc}", file=sys.stderr)
        return 2
    except StorageError as exc:  # a full, read-only or over-quota file system: the run failed, nothing committed
        print(f"advopenood: error: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:  # the same outside a run's pipeline (eval-ood, a cache write): one line, not a traceback
        failure = storage_error(exc)
        if failure is None:
            raise
        where = f"writing {failure.filename!r}" if failure.filename else "writing (the system named no file)"
        print(f"advopenood: error: {STORAGE_ERRNOS[failure.errno]} ({errno.errorcode[failure.errno]}) {where}; "
              f"{argv[0]} stopped; free space (or make it writable) and run the same command again", file=sys.stderr)
        return 3
    except Terminated:
        print("advopenood: terminated (SIGTERM); finished shards are kept, run the same command again to resume",
              file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("advopenood: interrupted; finished shards are kept, run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

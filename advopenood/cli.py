"""``advopenood`` command line: run, attack, demo, bintest, list, export, eval-ood.

Bad input exits with code 2 and one line naming the bad value and the valid choices, no traceback.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from advopenood import __version__, registry
from advopenood.errors import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (exit 2) instead of usage + error."""

    def error(self, message: str) -> None:
        raise UsageError(message)


def _run_flags(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    p.add_argument("--config", required=config_required, help="YAML path or packaged name (demo, cifar10_resnet20)")
    p.add_argument("--data-root", help="folder holding the config's data files (or OpenOOD's data/ folder)")
    p.add_argument("--out", help="output folder (default runs/<config name>)")
    p.add_argument("--protocol", help="strong (default, ours) | lorenz2024 | mahmood2021: see README, Protocols")
    p.add_argument("--attack", help="comma-separated attacks, e.g. pgd,fgsm,df,mpgd")
    p.add_argument("--eps", help="budget(s) for bounded attacks, e.g. 8/255 or 0.01,0.03 (a sweep)")
    p.add_argument("--detectors", help="all, or comma-separated detector names")
    p.add_argument("--detector-backend", help="auto | openood | pytorch-ood")
    p.add_argument("--evaluator", help="comma-separated evaluators (default: ood)")
    p.add_argument("--analysis", help="comma-separated analyses, e.g. gradcam,bintest")
    p.add_argument("--limit", type=_positive_int, help="evaluate the first N images of a seeded permutation of the ID set")
    p.add_argument("--device", help="cpu | cuda | cuda:N")
    p.add_argument("--seed", type=int)
    p.add_argument("--shard-size", type=_positive_int, help="images per stored shard (default 256)")
    p.add_argument("--cache-dir", help="attack store and model cache (default $ADVOPENOOD_CACHE or ~/.cache/advopenood)")
    p.add_argument("--export-png", action="store_true",
                   help="also export adversarial sets as PNG + OpenOOD image lists under OUT/openood/")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; valid choices: a positive integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive; valid choices: a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="advopenood", description="Adversarial robustness of OpenOOD's post-hoc OOD detectors.")
    parser.add_argument("--version", action="version", version=f"advopenood {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _run_flags(sub.add_parser("run", help="attacks + detectors + evaluators + analyses"))
    _run_flags(sub.add_parser("attack", help="generate (or reuse) adversarial sets only, and write asr.csv"))
    demo = sub.add_parser("demo", help="the embedded demo: digits vs textures/noise, small CNN, every stage")
    _run_flags(demo, config_required=False)
    bintest = sub.add_parser("bintest", help="binarization test of an attack (same as run --analysis bintest)")
    _run_flags(bintest)
    lister = sub.add_parser("list", help="registered plugins with one-line descriptions")
    lister.add_argument("kind", help=" | ".join(registry.KINDS))
    sub.add_parser("eval-ood", help="OpenOOD's scripts/eval_ood.py with --attack/--eps (needs OpenOOD)", add_help=False)
    return parser


def _config(args: argparse.Namespace, **forced) -> dict:
    from advopenood.config import apply_overrides, load_config

    cfg, folder = load_config(args.config or "demo")
    flags = {k: getattr(args, k) for k in ("data_root", "out", "protocol", "attack", "eps", "detectors", "detector_backend",
                                            "evaluator", "analysis", "limit", "device", "seed", "cache_dir", "shard_size")}
    flags.update({k: v for k, v in forced.items() if v is not None})
    return apply_overrides(cfg, config_dir=folder, **flags)


def cmd_list(kind: str) -> int:
    if kind not in registry.KINDS:
        raise UsageError(f"unknown plugin kind {kind!r}; valid choices: {', '.join(registry.KINDS)}")
    table = registry.entries(kind)
    width = max((len(n) for n in table), default=0)
    for name, entry in table.items():
        print(f"{name:<{width}}  {entry.description}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["eval-ood"]:
            from advopenood.openood_bridge import eval_ood_main

            return eval_ood_main(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command == "list":
            return cmd_list(args.kind)
        from advopenood import pipeline

        forced = {"bintest": {"analysis": "bintest", "evaluator": "", "detectors": ""},
                  "attack": {"analysis": "", "evaluator": "", "detectors": ""}}.get(args.command, {})
        cfg = _config(args, **forced)
        ctx = pipeline.run(cfg, attack_only=args.command == "attack", progress=not args.quiet)
        if args.export_png:
            from advopenood.export import export_openood

            for line in export_openood(ctx):
                print(line)
        if ctx.rank == 0:
            print(f"advopenood: wrote {ctx.out}")
        return 0
    except UsageError as exc:
        print(f"advopenood: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("advopenood: interrupted; finished shards are kept, run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

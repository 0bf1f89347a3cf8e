"""Refusal time: each ordinary mistake, from a fresh interpreter to its one-line refusal (target: every case under
1.5 s on 2 idle cores; issue 50, item 9).

Run: ``python benchmarks/bench_refusals.py [--repeat N]``. Each case is the CLI (``python -m advopenood.cli``) in a
new process, as a user's mistyped command runs; the median of ``--repeat`` runs (default 1) is its time. Every case
must exit with code 2 and write exactly one line on stderr, and the refusal must come before torch loads (the flags,
names, config keys and values, folders and files: :mod:`advopenood.cli.precheck`). One ``advopenood --help`` first
stores the plugin index in a cache of the benchmark's own (``$ADVOPENOOD_CACHE``), as any install does once. Prints one row per case and a ``SUMMARY`` line (slowest,
median, of the wall time and of the CPU time, which on a loaded machine stands for the wall time on idle cores); exit 1
when a case is not a one-line exit 2.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the config files of the cases: name -> YAML text (``@`` files are written as raw bytes)
FILES = {
    "bad_key.yaml": "name: demo\nmodel: {arch: democnn, num_classes: 10, in_channels: 1, input_size: 16}\n"
                    "data: {id: {kind: demo, name: digits, split: test}}\nattackz: [pgd]\n",
    "bad_value.yaml": "name: demo\nmodel: {arch: democnn, num_classes: 10, in_channels: 1, input_size: 16}\n"
                      "data: {id: {kind: demo, name: digits, split: test}}\nlimit: -5\n",
    "malformed.yaml": "name: demo\nattacks: [pgd\n",
    "list.yaml": "- pgd\n- fgsm\n",
    "twice.yaml": "name: demo\nname: again\n",
    "missing_npz.yaml": "name: x\nmodel: {arch: resnet20, checkpoint: nosuch.pt}\n"
                        "data: {root: ., id: {kind: npz, path: nosuch.npz}}\n",
    "missing_ckpt.yaml": "name: x\nmodel: {arch: resnet20, checkpoint: nosuch.pt}\ndata: {id: {kind: demo, name: digits, split: test}}\n",
    "bad_ci.yaml": "name: demo\nmodel: {arch: democnn, num_classes: 10, in_channels: 1, input_size: 16}\n"
                   "data: {id: {kind: demo, name: digits, split: test}}\nci: {method: bootstrap, resamples: 5}\n",
}
BINARY = {"not_utf8.yaml": b"name: \xff\xfe demo\n"}


def cases(tmp: Path) -> dict[str, list[str]]:
    """Case name -> the CLI's arguments (files under ``tmp``)."""
    for name, text in FILES.items():
        (tmp / name).write_text(text)
    for name, data in BINARY.items():
        (tmp / name).write_bytes(data)
    (tmp / "a_file").write_text("not a folder\n")
    (tmp / "not_a_run").mkdir()
    out = str(tmp / "out")
    run = ["run", "--config", "demo", "--out", out]
    demo = ["demo", "--out", out]
    return {
        "--eps -0.1": [*run, "--eps", "-0.1"],
        "--eps 0": [*run, "--eps", "0"],
        "--eps abc": [*run, "--eps", "abc"],
        "--eps 1/0": [*run, "--eps", "1/0"],
        "--ci-resamples 5": [*run, "--ci-resamples", "5"],
        "--ci-resamples 0": [*run, "--ci-resamples", "0"],
        "--ci bogus": [*run, "--ci", "bogus"],
        "--seed -1": [*run, "--seed", "-1"],
        "--seed abc": [*run, "--seed", "abc"],
        **({} if gpu_driver() else {"--device cuda (no GPU driver)": [*run, "--device", "cuda"]}),
        "--device gpu": [*run, "--device", "gpu"],
        "--config mistyped name": ["run", "--config", "cifar10_resnet2", "--out", out],
        "--config missing file": ["run", "--config", str(tmp / "nosuch.yaml"), "--out", out],
        "config: unknown key": ["run", "--config", str(tmp / "bad_key.yaml"), "--out", out],
        "config: bad value": ["run", "--config", str(tmp / "bad_value.yaml"), "--out", out],
        "config: malformed YAML": ["run", "--config", str(tmp / "malformed.yaml"), "--out", out],
        "config: not UTF-8": ["run", "--config", str(tmp / "not_utf8.yaml"), "--out", out],
        "config: a list": ["run", "--config", str(tmp / "list.yaml"), "--out", out],
        "config: key twice": ["run", "--config", str(tmp / "twice.yaml"), "--out", out],
        "config: 5 resamples": ["run", "--config", str(tmp / "bad_ci.yaml"), "--out", out],
        "config: data file missing": ["run", "--config", str(tmp / "missing_npz.yaml"), "--out", out],
        "config: checkpoint missing": ["run", "--config", str(tmp / "missing_ckpt.yaml"), "--out", out],
        "--out a file": ["run", "--config", "demo", "--out", str(tmp / "a_file")],
        "--cache-dir a file": [*run, "--cache-dir", str(tmp / "a_file")],
        "--data-root missing": [*run, "--data-root", str(tmp / "nosuch")],
        "verify missing folder": ["verify", str(tmp / "nosuch")],
        "verify not a run": ["verify", str(tmp / "not_a_run")],
        "--attack mistyped": [*run, "--attack", "pgdd"],
        "--detectors mistyped": [*run, "--detectors", "msp,mdss"],
        "--evaluator mistyped": [*run, "--evaluator", "ood,robust_aurok"],
        "--analysis mistyped": [*run, "--analysis", "gradcm"],
        "--limit 0": [*run, "--limit", "0"],
        "--protocol mistyped": [*run, "--protocol", "lorenz2042"],
        "--detector-backend bogus": [*run, "--detector-backend", "bogus"],
        "--shard-size -1": [*run, "--shard-size", "-1"],
        "--num-workers 999": [*run, "--num-workers", "999"],
        "unknown flag": [*run, "--detecters", "msp"],
        "run without --config": ["run", "--out", out],
        "list bogus kind": ["list", "bogus"],
        "demo --eps -1": [*demo, "--eps", "-1"],
        "attack --seed -1": ["attack", "--config", "demo", "--out", out, "--seed", "-1"],
    }


def gpu_driver() -> bool:
    """Whether this machine has a GPU driver (then ``--device cuda`` is a valid choice: no such case)."""
    from advopenood.run.preflight import GPU_DRIVER_PATHS

    return any(os.path.exists(p) for p in GPU_DRIVER_PATHS)


def one(argv: list[str]) -> tuple[float, float, int, str]:
    """Wall time, CPU time (user + system: on idle cores, about the wall time of this one-threaded work), exit code
    and stderr of the CLI with ``argv`` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "advopenood.cli", *argv], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, done.returncode, done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; its time is their median")
    args = parser.parse_args()
    times, cpus, bad = {}, {}, []
    with tempfile.TemporaryDirectory() as folder:
        # a cache of its own: the plugin index another install stored under a shared cache would not match this one
        os.environ["ADVOPENOOD_CACHE"] = str(Path(folder) / "cache")
        subprocess.run([sys.executable, "-m", "advopenood.cli", "--help"], capture_output=True, check=True)
        for name, argv in cases(Path(folder)).items():
            runs = [one(argv) for _ in range(max(1, args.repeat))]
            times[name] = statistics.median(r[0] for r in runs)
            cpus[name] = statistics.median(r[1] for r in runs)
            _, _, rc, err = runs[-1]
            lines = err.strip().splitlines()
            ok = rc == 2 and len(lines) == 1 and "Traceback" not in err
            if not ok:
                bad.append(name)
            print(f"{name:30s} {times[name]:5.2f} s wall {cpus[name]:5.2f} s cpu  exit {rc}  {'ok ' if ok else 'BAD'}  "
                  f"{(lines or [''])[-1][:100]}")
    worst, worst_cpu = max(times, key=times.get), max(cpus, key=cpus.get)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"SUMMARY refusals: {len(times)} cases; wall: slowest {worst!r} {times[worst]:.2f} s (target < 1.5 s on 2 "
          f"idle cores), median {statistics.median(times.values()):.2f} s; cpu: slowest {worst_cpu!r} "
          f"{cpus[worst_cpu]:.2f} s, median {statistics.median(cpus.values()):.2f} s; {len(bad)} not a one-line exit 2"
          f"{': ' + ', '.join(bad) if bad else ''}; load average {load:.2f} on {os.cpu_count()} cores")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

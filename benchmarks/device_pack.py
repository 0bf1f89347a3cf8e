"""The pack's files a lent GPU machine needs, small enough to travel with a `device` call (64 MiB in all).

    python benchmarks/device_pack.py --out .gpupack/p200 --limit 200     # then carry .gpupack, --data-root it there

`../shared/data` does not travel to the device machine. For each ``--limit``, the ID and Tiny-ImageNet test sets are
cut to the rows a run with that ``--limit`` and seed selects (:func:`~advopenood.data.datasets.seeded_prefix`,
sorted), in that order: ``limit_dataset`` then keeps the whole file, so the run sees the same images, in the same
order, as on the full pack. Textures (1,200 rows), the 10,000 training rows the detectors fit on and the two
ResNet-20 checkpoints are copied whole. The files are checked against the full pack before the script exits.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import DATA  # noqa: E402

CUT = {"cifar10_test.npz": "cifar10", "tin_test.npz": "tin"}
WHOLE = ["texture_test.npz", "cifar10_train_10k.npz", "resnet20_cifar10.pt", "resnet20_cifar10_at.pt"]


def write_pack(out: Path, limit: int, seed: int = 0, source: Path = DATA) -> Path:
    """The pack for runs of ``--limit limit`` and ``seed`` under ``out``; returns ``out``."""
    from advopenood.data.datasets import seeded_prefix

    out.mkdir(parents=True, exist_ok=True)
    for name in CUT:
        with np.load(source / name) as z:
            rows = seeded_prefix(len(z["y"]), limit, seed)
            np.savez(out / name, **{k: z[k][rows] for k in z.files})
    for name in WHOLE:
        shutil.copyfile(source / name, out / name)
    return out


def same_images(out: Path, limit: int, seed: int = 0, source: Path = DATA) -> bool:
    """Whether every cut set of ``out`` yields the full pack's images and labels at ``limit`` and ``seed``."""
    from advopenood.data.datasets import build_dataset, limit_dataset, stack

    def images(root: Path, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        spec = {"kind": "npz", "path": name, "name": CUT[name]}
        return stack(limit_dataset(build_dataset(spec, root, 3, 32), limit, seed))

    return all(all(torch.equal(a, b) for a, b in zip(images(source, n), images(out, n))) for n in CUT)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--limit", type=int, required=True, help="the --limit of the runs the pack is for")
    p.add_argument("--seed", type=int, default=0, help="the runs' seed (default 0)")
    args = p.parse_args()
    out = write_pack(args.out, args.limit, args.seed)
    if not same_images(out, args.limit, args.seed):
        print(f"device_pack: {out} does not give the full pack's images", file=sys.stderr)
        return 1
    size = sum(f.stat().st_size for f in out.iterdir()) / 2 ** 20
    print(f"device_pack: {out}: {size:.1f} MiB, the full pack's images at --limit {args.limit} --seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Memory: peak RSS added by the detector stage (fit + score, all 16 detectors) for 1 vs 5 OOD sets.

Each case runs in a fresh child process: the model and every image array are loaded first, then the process's
current RSS is read (``VmRSS``) and ``score_all`` runs; the stage's cost is the peak (``VmHWM``) minus that.
The sets are disjoint slices of the CIFAR-10 test file (one array in memory whatever their number), so only the
detector stage can make the figure grow with the number of sets. The stage runs as ``run`` runs it, with a
(fresh, temporary) store: scores are kept (``n`` floats per detector and set), network outputs per batch, and
one set's logits and features until they are written to the store, so the stage should cost about the same for
5 sets as for 1.
Run: ``python benchmarks/bench_detector_memory.py [--n 300 --fit 1000]``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from _common import DATA, REPO

CHILD = r"""
import json, sys, tempfile
sys.path.insert(0, {bench!r})
import numpy as np, torch
from advopenood import registry
from advopenood.data.datasets import Subset, build_dataset, limit_dataset, make_loader
from advopenood.detectors import score_all
from advopenood.models.classifier import build_model
from advopenood.detection.scorecache import ScoreCache

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024

n, n_sets, fit_n, batch = {n}, {sets}, {fit}, {batch}
torch.set_num_threads(2)
data = {data!r}
model = build_model("resnet20", 10, f"{{data}}/resnet20_cifar10.pt")
fit = limit_dataset(build_dataset({{"kind": "npz", "path": "cifar10_train_10k.npz", "name": "train"}}, data, 3, 32), fit_n, 0)
test = build_dataset({{"kind": "npz", "path": "cifar10_test.npz", "name": "test"}}, data, 3, 32)
sets = {{"id": Subset(test, np.arange(n))}}
sets.update({{f"ood{{i}}": Subset(test, np.arange(n * (i + 1), n * (i + 2))) for i in range(n_sets)}})
names = [k for k in registry.names("detectors") if getattr(registry.get("detectors", k), "openood_name", None)]
fit[0], test[0]
store = tempfile.TemporaryDirectory()
before = rss("VmRSS")
result = score_all(names, "pytorch-ood", model, fit, {{k: (lambda ds=ds: make_loader(ds, batch)) for k, ds in sets.items()}},
                   batch_size=batch, device=torch.device("cpu"), seed=0, progress=False,
                   cache=ScoreCache(store.name), identities={{k: ds.identity() for k, ds in sets.items()}},
                   model_hash="bench")
assert result.work["set_passes_computed"] == len(sets)
print(json.dumps({{"before": before, "peak": rss("VmHWM"), "detectors": len(result.scores), "errors": result.errors}}))
"""


def stage_mib(n: int, sets: int, fit: int, batch: int) -> dict:
    code = CHILD.format(bench=str(REPO / "benchmarks"), n=n, sets=sets, fit=fit, batch=batch, data=str(DATA))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300, help="images per set")
    parser.add_argument("--fit", type=int, default=1000, help="fit-set images")
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    one, five = (stage_mib(args.n, k, args.fit, args.batch) for k in (1, 5))
    for label, r in (("1 OOD set ", one), ("5 OOD sets", five)):
        print(f"{label}: RSS before the stage {r['before']:7.1f} MiB, peak {r['peak']:7.1f} MiB, stage adds "
              f"{r['peak'] - r['before']:6.1f} MiB ({r['detectors']} detectors, errors: {r['errors'] or 'none'})")
    add1, add5 = one["peak"] - one["before"], five["peak"] - five["before"]
    print(f"SUMMARY detector memory: peak RSS added by the detector stage, 5 / 1 OOD sets = {add5 / add1:.2f}x "
          f"({add5:.0f} vs {add1:.0f} MiB; whole-process peak {five['peak'] / one['peak']:.2f}x); all 16 detectors, "
          f"fit {args.fit}, {args.n} images per set, batch {args.batch} (target: about 1x, not 5x)")


if __name__ == "__main__":
    main()

"""Export adversarial sets as 8-bit PNGs with OpenOOD image lists, and re-check them after rounding."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from advopenood import io as aio
from advopenood.attacks.store import AdvSet
from advopenood.evaluation.context import RunContext


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """``N x C x H x W`` in [0, 1] -> ``N x H x W [x C]`` uint8 (round half to even, as PNG writers expect)."""
    arr = torch.round(x.clamp(0, 1) * 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return arr[..., 0] if arr.shape[-1] == 1 else arr


def export_set(adv: AdvSet, model: torch.nn.Module, root: Path, dataset: str, batch_size: int,
               device: torch.device) -> tuple[Path, int, int]:
    """Write ``root/images_classic/adv/<dataset>/<set>/<i>.png`` and ``root/benchmark_imglist/<dataset>/test_adv_<set>.txt``.

    Returns (image list, number of successful adversarial examples, how many stay successful as 8-bit PNGs).
    """
    rel_dir = Path("adv") / dataset / adv.set_name.replace("@", "_eps")
    img_dir = root / "images_classic" / rel_dir
    lines, survive, total, offset = [], 0, 0, 0
    successes = adv.records.success.to_numpy()
    for x, y in adv.iter_batches(batch_size):
        pixels = to_uint8(x)
        success = successes[offset:offset + len(x)]
        with torch.no_grad():
            x8 = torch.from_numpy(pixels).float().div(255)
            x8 = x8[:, None] if x8.ndim == 3 else x8.permute(0, 3, 1, 2)
            pred8 = model(x8.to(device)).argmax(1).cpu()
        survive += int(((pred8 != y).numpy() & success).sum())
        total += int(success.sum())
        for i, (img, label) in enumerate(zip(pixels, y.tolist())):
            name = f"{offset + i:06d}.png"
            aio.atomic_write(img_dir / name, lambda f, img=img: Image.fromarray(img).save(f, format="PNG"))
            lines.append(f"{(rel_dir / name).as_posix()} {label}")
        offset += len(x)
    imglist = root / "benchmark_imglist" / dataset / f"test_adv_{adv.set_name.replace('@', '_eps')}.txt"
    aio.write_text(imglist, "\n".join(lines) + "\n")
    return imglist, total, survive


def export_openood(ctx: RunContext) -> list[str]:
    """Export every adversarial set of a run under ``OUT/openood/``; one summary line per set."""
    out = []
    for adv in ctx.id_adv_sets.values():
        imglist, total, survive = export_set(adv, ctx.model, ctx.out / "openood", ctx.dataset, ctx.batch_size, ctx.device)
        where = imglist.relative_to(ctx.out).as_posix()  # ctx.out is the staging folder until the run ends
        out.append(f"{adv.set_name}: OUT/{where} - {survive} of {total} successful adversarial examples "
                   "survive 8-bit rounding")
    return out

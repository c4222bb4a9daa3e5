#!/usr/bin/env python3
"""Checks the launch rule's split count against a sweep on the GPU.

For every module in MODULE_DIR (one per head count) and batch 1..256 it
times split counts 1, 2, 4, ..., 64 (graph replays, medians, rotating inputs;
same method as bench_sparse_mla.py) and prints, per case, the fastest split,
the rule's choice and how much slower the rule's choice is than the best.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

from bench_extra_kv import dtype_name, make_cache  # noqa: E402
from bench_sparse_mla import time_fn  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module_dir", help="one module per head count, one cache dtype")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch
    import kforge
    from kforge.kernel import module_cubins
    slots = 1 << 20
    lines = ["| heads | batch | best splits | best (us) | rule splits | rule (us) | rule / best |",
             "|---|---|---|---|---|---|---|"]
    print(lines[0], flush=True)
    kv = None
    mods = sorted(module_cubins(args.module_dir),
                  key=lambda c: int(os.path.basename(c).split("_h")[1].split("_")[0]))
    for cubin in mods:
        mod = kforge.Kernel.from_files(cubin)
        spec = mod.spec
        d_v, d_qk = spec.kv_lora_rank, spec.kv_lora_rank + spec.rope_dim
        if kv is None:
            # Random values in the module's format (every module here has the same).
            kv = make_cache(torch, dtype_name(spec.kv_cache_dtype), slots, d_qk)
        H, K = spec.num_q_heads, spec.topk
        for B in [int(b) for b in args.batches.split(",")]:
            sets = []
            for _ in range(2):
                sets.append(dict(
                    q=torch.randn(B, H, d_qk, device="cuda").to(torch.bfloat16),
                    idx=torch.randint(0, slots, (B, K), device="cuda", dtype=torch.int32),
                    out=torch.empty(B, H, d_v, device="cuda", dtype=torch.bfloat16),
                    lse=torch.empty(B, H, device="cuda")))
            rule = mod.auto_splits(B)
            cands = sorted({1, 2, 4, 6, 8, 12, 16, 24, 32, 64, rule} &
                           set(range(1, mod.max_splits + 1)))
            t = {}
            for s in cands:
                ws = mod.workspace(B, s)
                t[s] = time_fn(lambda st: mod(st["q"], kv, st["idx"], st["out"], st["lse"],
                                              num_splits=s, workspace=ws), sets, args.reps)
            # The rule's own call: where the selector takes a cluster entry
            # ("Nc": its splits merged in the kernel) it is not a forced split.
            sel = mod.selection(B)
            if sel.plan.cluster:
                rule = f"{sel.num_splits}c"
                ws = mod.workspace(B)
                t[rule] = time_fn(lambda st: mod(st["q"], kv, st["idx"], st["out"], st["lse"],
                                                 workspace=ws), sets, args.reps)
            best = min(t, key=t.get)
            row = (f"| {H} | {B} | {best} | {t[best]:.1f} | {rule} | {t[rule]:.1f} | "
                   f"{t[rule] / t[best]:.2f} |  sweep: "
                   + " ".join(f"{k}={v:.1f}" for k, v in t.items()))
            lines.append(row)
            print(row, flush=True)
        del mod
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

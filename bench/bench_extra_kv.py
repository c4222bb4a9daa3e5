#!/usr/bin/env python3
"""What a second KV cache (spec extra_kv) costs: each module with an extra
cache in MODULE_DIR against the module of the same spec without one whose
topk is the sum (the same keys in one list), CUDA graph replays, medians,
the launch rule's split count. Both read the same number of records of the
same format, so the extra cache's price is the difference.

usage: bench_extra_kv.py MODULE_DIR [--batches 1,32,128] [--out FILE]

Modules: `kforge compile --spec` of a spec with extra_kv and of the same
spec with topk = topk + extra_kv.topk and no extra_kv (the compile lines
are in BENCH.md).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))


def make_cache(torch, dtype_name, slots, d_qk):
    """A random cache of `slots` tokens in the named format (pages of 64)."""
    import kforge
    from kforge import kv_records
    kv = torch.randn(slots, d_qk, device="cuda").to(torch.bfloat16)
    if dtype_name == "bf16":
        return kv.view(-1, 64, d_qk)
    if dtype_name == "fp8_ds_mla":
        return kforge.quantize_fp8_ds_mla(kv, "arbitrary").view(-1, 64, 656 if d_qk == 576 else 528)
    return kv_records.quantize_kv_records(kv.view(-1, 64, d_qk), dtype_name)


def dtype_name(value):
    """The format name make_cache takes, from a spec's kv_cache_dtype value."""
    from kforge import kv_records
    return {0: "bf16", 1: "bf16", 2: "fp8_ds_mla"}.get(value) or kv_records.record_name(value)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module_dir")
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sets", type=int, default=4)
    ap.add_argument("--slots", type=int, default=1 << 18)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch

    from bench_sparse_mla import time_fn

    import kforge
    from kforge import kv_records
    from kforge.kernel import module_cubins, read_artifact

    def key(spec, topk):
        return (spec.num_q_heads, spec.kv_lora_rank, spec.rope_dim, spec.kv_cache_dtype, topk)

    plain, extra = {}, []
    for path in module_cubins(args.module_dir):
        spec = read_artifact(path).spec.sparse_mla_decode
        if spec.HasField("extra_kv"):
            extra.append(path)
        else:
            plain[key(spec, spec.topk)] = path
    lines = ["| module (heads, topk + extra, formats) | batch | with extra cache (us) | "
             "one list of topk + extra (us) | ratio |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for path in extra:
        mod = kforge.Kernel.from_files(path)
        spec = mod.spec
        x = spec.extra_kv
        twin_path = plain.get(key(spec, spec.topk + x.topk))
        twin = kforge.Kernel.from_files(twin_path) if twin_path else None
        H, Dv = spec.num_q_heads, spec.kv_lora_rank
        D = Dv + spec.rope_dim
        main_cache = make_cache(torch, dtype_name(spec.kv_cache_dtype), args.slots, D)
        x_cache = main_cache if x.kv_cache_dtype == spec.kv_cache_dtype and \
            x.page_block_size == spec.page_block_size else None
        if x_cache is None and x.page_block_size == 64:
            x_cache = make_cache(torch, dtype_name(x.kv_cache_dtype), args.slots, D)
        if x_cache is None:
            print(f"| {mod.module_name} | skipped: extra pages of {x.page_block_size} |")
            continue
        for B in (int(b) for b in args.batches.split(",")):
            sets = []
            for _ in range(args.sets):
                q = torch.randn(B, H, D, device="cuda").to(torch.bfloat16)
                idx = torch.randint(0, args.slots, (B, spec.topk + x.topk), device="cuda",
                                    dtype=torch.int32)
                out = torch.empty(B, H, Dv, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(B, H, device="cuda", dtype=torch.float32)
                sets.append(dict(q=q, idx=idx, main=idx[:, :spec.topk].contiguous(),
                                 x=idx[:, spec.topk:].contiguous(), out=out, lse=lse))
            ws = mod.workspace(B)
            with_x = time_fn(lambda st: mod(st["q"], main_cache, st["main"], st["out"], st["lse"],
                                            workspace=ws, extra_kv_cache=x_cache,
                                            extra_indices=st["x"]), sets, args.reps)
            one = float("nan")
            if twin is not None:
                ws2 = twin.workspace(B)
                one = time_fn(lambda st: twin(st["q"], main_cache, st["idx"], st["out"],
                                              st["lse"], workspace=ws2), sets, args.reps)
            row = (f"| h{H} {spec.topk} + {x.topk} {dtype_name(spec.kv_cache_dtype)} + "
                   f"{dtype_name(x.kv_cache_dtype)} | {B} | {with_x:.1f} | {one:.1f} | "
                   f"{with_x / one:.3f} |")
            lines.append(row)
            print(row, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

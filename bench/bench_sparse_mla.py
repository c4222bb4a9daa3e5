#!/usr/bin/env python3
"""Times kforge sparse MLA modules on the GPU against PyTorch and the roofline.

For each case (heads x batch, topk 2048, bf16 KV) it loads the module for
that head count from MODULE_DIR (kforge.Kernel.from_files), rotates through several input sets (fresh
random indices into a large cache, so L2 cannot hold the working set), times
main + combine with CUDA events (warm-up, median of many runs) for several
split counts, and compares with a PyTorch gather + bmm implementation and the
roofline floor max(bytes / 4.2 TB/s, flops / 708 TFLOP/s) measured on the
H200 (docs/DESIGN.md). Prints a markdown table and writes it to --out.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

COPY_BW = 4.2e12
MMA_RATE = 708e12


def capture(fn, sets, warmup=3):
    """A CUDA graph of one call per input set (after warm-up calls), replayed
    once."""
    import torch
    for i in range(warmup):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(g, stream=stream):
            for st in sets:
                fn(st)
    g.replay()
    torch.cuda.synchronize()
    return g


# GPU cycles of the busy wait queued before each timed replay when the
# host's graph submission is to be left out (about 100 us at 2 GHz: longer
# than a submission takes).
HIDE_HOST_CYCLES = 200_000


def replay_times(g, calls, reps, hide_host=False):
    """Microseconds per call of each of reps replays of g (calls per replay).
    The start event is recorded when the GPU reaches it; with an idle GPU it
    then waits for the host to submit the graph, and that wait is timed too
    (about 18 us on one H100 host: BENCH.md "Method"). hide_host queues a
    busy wait first, so the graph is on the GPU's queue before the start
    event runs and only the GPU's own time is measured."""
    import torch
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hide_host:
            torch.cuda._sleep(HIDE_HOST_CYCLES)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / calls)
    return times


def time_fn(fn, sets, reps, warmup=3, hide_host=False):
    """Median microseconds per call. The calls (one per input set) are
    captured into a CUDA graph and replayed, so host launch overhead (Python,
    ctypes) never shows up as GPU time (the graph's submission does unless
    hide_host: replay_times)."""
    return statistics.median(replay_times(capture(fn, sets, warmup), len(sets), reps,
                                          hide_host))


def torch_reference_impl(kv, scale, d_v):
    import torch

    def run(st):
        q, idx, out = st["q"], st["idx"], st["out"]
        rows = kv[idx.clamp(min=0).long()]                         # [T, K, D]
        s = torch.bmm(q, rows.transpose(1, 2)).float() * scale     # [T, H, K]
        s.masked_fill_((idx < 0)[:, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1).to(torch.bfloat16)
        out.copy_(torch.bmm(p, rows[..., :d_v]))
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module_dir")
    ap.add_argument("--out", default="")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sets", type=int, default=4)
    ap.add_argument("--cache-slots", type=int, default=1 << 20)
    ap.add_argument("--cases", default="128x128,64x64,16x128,8x1",
                    help="heads x batch list")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch baseline")
    ap.add_argument("--auto-only", action="store_true",
                    help="time only the launch rule's split count (A/B runs of variants)")
    ap.add_argument("--topk", type=int, default=2048,
                    help="time the modules of this top-k (a small one shows a call's fixed costs)")
    ap.add_argument("--kv-dtype", default="bf16",
                    choices=("bf16", "fp8_ds_mla", "fp8_ds_mla_v4", "mxfp8_ds_mla_v41",
                             "nvfp4_ds_mla"),
                    help="time the modules for this cache dtype (a quantized one: a uint8 "
                         "cache of its records quantized from the same random values)")
    args = ap.parse_args()
    import torch
    import kforge
    from kforge.kernel import module_cubins, read_artifact
    from kforge.spec import kv_dtype_value

    mods = {}
    want = kv_dtype_value(args.kv_dtype)
    for c in module_cubins(args.module_dir):
        spec = read_artifact(c).spec.sparse_mla_decode
        if spec.topk == args.topk and spec.s_q <= 1 and spec.kv_cache_dtype == want:
            mods[spec.num_q_heads] = c
    from kforge import kv_records
    D = kv_records.LATENT_WIDTH.get(args.kv_dtype, 576)
    kv = torch.randn(args.cache_slots, D, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    cache, row_bytes = kv, D * 2
    if args.kv_dtype == "fp8_ds_mla":
        # The records the kernel reads; the PyTorch baseline keeps bf16 rows.
        cache = kforge.quantize_fp8_ds_mla(kv, "arbitrary")
        row_bytes = cache.shape[-1]
    elif args.kv_dtype != "bf16":
        cache = kv_records.quantize_kv_records(kv.view(-1, 64, D), args.kv_dtype)
        row_bytes = cache.shape[-1]
    lines = []
    header = ("| heads x batch | kforge best (us) | splits | kforge auto (us) | auto splits | "
              "PyTorch gather+bmm (us) | roofline floor (us) | best / floor | TFLOP/s | GB/s |")
    lines.append(header)
    lines.append("|" + "---|" * 10)
    print(header, flush=True)
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    for H, B in cases:
        if H not in mods:
            print(f"| {H} x {B} | no module in {args.module_dir} |")
            continue
        mod = kforge.Kernel.from_files(mods[H])
        K, Dv = mod.spec.topk, mod.spec.kv_lora_rank
        T = B
        sets = []
        for _ in range(args.sets):
            q = torch.randn(T, H, D, device="cuda").to(torch.bfloat16)
            idx = torch.randint(0, args.cache_slots, (T, K), device="cuda", dtype=torch.int32)
            out = torch.empty(T, H, Dv, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(T, H, device="cuda", dtype=torch.float32)
            sets.append(dict(q=q, idx=idx, out=out, lse=lse))
        flops = H * T * K * 2 * (D + Dv)
        bytes_ = T * K * row_bytes + T * H * (D + Dv) * 2
        floor = max(bytes_ / COPY_BW, flops / MMA_RATE) * 1e6
        results = {}
        # Forced split counts run split + combine; "auto" is the rule's
        # choice, which may be the cluster entry (its splits merged in the
        # kernel: key "Nc").
        auto_sel = mod.selection(T)
        auto = f"{auto_sel.num_splits}c" if auto_sel.plan.cluster else auto_sel.num_splits
        cands = [] if args.auto_only else sorted({1, 2, 4, 8, 16, 32, auto_sel.num_splits} &
                                                 set(range(1, mod.max_splits + 1)))
        for splits in cands:
            ws = mod.workspace(T, splits)
            results[splits] = time_fn(
                lambda st: mod(st["q"], cache, st["idx"], st["out"], st["lse"],
                               num_splits=splits, workspace=ws), sets, args.reps)
        if auto not in results:
            ws = mod.workspace(T)
            results[auto] = time_fn(
                lambda st: mod(st["q"], cache, st["idx"], st["out"], st["lse"],
                               workspace=ws), sets, args.reps)
        best_s = min(results, key=results.get)
        ref = float("nan") if args.no_torch else time_fn(
            torch_reference_impl(kv, mod.spec.softmax_scale, Dv), sets,
            max(5, args.reps // 3))
        best = results[best_s]
        row = (f"| {H} x {B} | {best:.1f} | {best_s} | {results[auto]:.1f} | {auto} | {ref:.1f} | "
               f"{floor:.1f} | {best / floor:.2f} | {flops / best / 1e6:.0f} | "
               f"{bytes_ / best / 1e3:.0f} |")
        lines.append(row)
        print(row, "  sweep:", {k: round(v, 1) for k, v in results.items()}, flush=True)
        del mod
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

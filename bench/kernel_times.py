#!/usr/bin/env python3
"""Where the time of one decode call goes: per-kernel GPU time inside CUDA
graph replays (torch.profiler / CUPTI, kernels not serialised), against the
replay's wall time per call. The difference is launch gaps and tails.

usage: kernel_times.py MODULE_DIR [--kv-dtype bf16|fp8_ds_mla]
           [--cases 128x1,64x1,8x1] [--splits 1,2,4,8,16,32]

Prints one row per (case, module, split count): graph time per call, the
main kernel's and the combine kernel's mean durations, and the rest. On
sm_90+ the kernels launch programmatically (the combine is scheduled while
the main kernel runs and waits in griddepcontrol.wait), so there the
combine's duration includes that wait and "rest" can be negative: read
the graph time. A
directory may hold several modules of one head count (e.g. `kforge compile
--tiling` candidates): each gets its rows, named by its tiling
(head tile x token tile x stages x warps).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module_dir")
    ap.add_argument("--kv-dtype", default="bf16", choices=("bf16", "fp8_ds_mla"))
    ap.add_argument("--cases", default="128x1,64x1,16x1,8x1,128x32")
    ap.add_argument("--splits", default="auto,1,2,4,8,16,32")
    ap.add_argument("--sets", type=int, default=4)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--cache-slots", type=int, default=1 << 20)
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_sparse_mla import capture, replay_times

    import kforge
    from kforge.kernel import module_cubins, read_artifact

    fp8 = args.kv_dtype == "fp8_ds_mla"
    mods = {}
    for c in module_cubins(args.module_dir):
        spec = read_artifact(c).spec.sparse_mla_decode
        if spec.topk == 2048 and spec.s_q <= 1 and (spec.kv_cache_dtype == 2) == fp8:
            mods.setdefault(spec.num_q_heads, []).append(c)
    D = 576
    kv = torch.randn(args.cache_slots, D, device="cuda").to(torch.bfloat16)
    cache = kforge.quantize_fp8_ds_mla(kv, "arbitrary") if fp8 else kv
    print("| heads x batch | tiling | splits | graph us/call | main us | combine us | rest us |")
    print("|---|---|---|---|---|---|---|")
    cases = [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    for H, B, path in [(H, B, p) for H, B in cases for p in sorted(mods.get(H, [None]))]:
        if path is None:
            print(f"| {H} x {B} | no module |")
            continue
        mod = kforge.Kernel.from_files(path)
        artifact = read_artifact(path)

        def label(t):
            return f"{t.head_tile}x{t.token_tile}x{t.stages}x{t.warps}{' wgmma' if t.wgmma else ''}"
        K, Dv = mod.spec.topk, mod.spec.kv_lora_rank
        sets = []
        for _ in range(args.sets):
            sets.append(dict(
                q=torch.randn(B, H, D, device="cuda").to(torch.bfloat16),
                idx=torch.randint(0, args.cache_slots, (B, K), device="cuda", dtype=torch.int32),
                out=torch.empty(B, H, Dv, device="cuda", dtype=torch.bfloat16),
                lse=torch.empty(B, H, device="cuda")))
        for sp in args.splits.split(","):
            splits = mod.auto_splits(B) if sp == "auto" else int(sp)
            if splits > mod.max_splits:
                continue
            ws = mod.workspace(B, splits)

            def call(st):
                mod(st["q"], cache, st["idx"], st["out"], st["lse"], num_splits=splits,
                    workspace=ws)

            # The kernel the selector picks for this batch: the small-batch
            # one (SmallBatchPath) or the throughput one.
            small = mod.selection(B, splits).plan.small_batch
            tiling = (label(artifact.small_batch.tiling) + " small" if small
                      else label(artifact.tiling))
            g = capture(call, sets)
            walls = replay_times(g, len(sets), args.reps)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    g.replay()
                torch.cuda.synchronize()
            main_t, comb_t = [], []
            for ev in prof.events():
                if ev.device_type.name != "CUDA":
                    continue
                if "combine" in ev.name:
                    comb_t.append(ev.device_time if hasattr(ev, "device_time") else ev.cuda_time)
                elif "sparse_mla" in ev.name:
                    main_t.append(ev.device_time if hasattr(ev, "device_time") else ev.cuda_time)
            wall = statistics.median(walls)
            m = statistics.median(main_t) if main_t else 0.0
            c = statistics.median(comb_t) if comb_t else 0.0
            split_label = f"{splits} (auto)" if sp == "auto" else str(splits)
            print(f"| {H} x {B} | {tiling} | {split_label} | {wall:.1f} | {m:.1f} | {c:.1f} | {wall - m - c:.1f} |",
                  flush=True)
        del mod


if __name__ == "__main__":
    main()

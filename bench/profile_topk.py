#!/usr/bin/env python3
"""Runs the DSA indexer's top-k on random logits a few times, for a
profiler (ncu) to attach to, or prints graph-replay times of several
row lengths (--times).
usage: profile_topk.py MODULE.cubin ROWS CONTEXT[,CONTEXT...] [cluster|one] [--times]"""
import copy
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import torch  # noqa: E402
from kforge import dsa_indexer as kdi  # noqa: E402

ix = kdi.DsaIndexer.from_files(sys.argv[1])
rows = int(sys.argv[2])
contexts = [int(c) for c in sys.argv[3].split(",")]
path = sys.argv[4] if len(sys.argv) > 4 and not sys.argv[4].startswith("--") else None
if path is not None and ix.description["indexer"].get("topk_cluster"):
    d = copy.deepcopy(ix.description)
    d["indexer"]["topk_cluster"]["max_rows"] = 65535 if path == "cluster" else 0
    ix = kdi.DsaIndexer(d, ix._image)
for ctx_len in contexts:
    gen = torch.Generator(device="cuda").manual_seed(3)
    logits = torch.randn(rows, ctx_len, device="cuda", generator=gen)
    ctx = torch.full((rows,), ctx_len, dtype=torch.int32, device="cuda")
    idx = torch.empty(rows, ix.topk_k, dtype=torch.int32, device="cuda")
    if "--times" not in sys.argv:
        for _ in range(3):
            ix.topk(logits, ctx, 1, idx)
        torch.cuda.synchronize()
        continue
    fn = lambda: ix.topk(logits, ctx, 1, idx)  # noqa: E731
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    print(f"{path or 'rule'} {rows} x {ctx_len}: {statistics.median(times):.1f} us")
print("done")

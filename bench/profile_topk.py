#!/usr/bin/env python3
"""Runs the DSA indexer's top-k on random logits a few times, for a
profiler (ncu) to attach to, or prints graph-replay times of several
row lengths (--times).
usage: profile_topk.py MODULE.cubin ROWS CONTEXT[,CONTEXT...] [cluster|one] [--times]
                       [--no-pdl]
cluster / one force the top-k path (the plan's row bound moved); --no-pdl
launches without programmatic stream serialization."""
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from bench_sparse_mla import time_fn  # noqa: E402
from kforge import dsa_indexer as kdi  # noqa: E402

ix = kdi.DsaIndexer.from_files(sys.argv[1])
rows = int(sys.argv[2])
contexts = [int(c) for c in sys.argv[3].split(",")]
path = sys.argv[4] if len(sys.argv) > 4 and not sys.argv[4].startswith("--") else None
d = copy.deepcopy(ix.description)
if path is not None and d["indexer"].get("topk_cluster"):
    rows_bound = 65535 if path == "cluster" else 0
    d["indexer"]["topk_cluster"].update(max_rows=rows_bound, short_rows=rows_bound)
if "--no-pdl" in sys.argv:
    d["indexer"]["programmatic"] = False
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
    t = time_fn(lambda _: ix.topk(logits, ctx, 1, idx), [None], 30)
    print(f"{path or 'rule'}{' no-pdl' if '--no-pdl' in sys.argv else ''} {rows} x {ctx_len}: "
          f"{t:.1f} us")
print("done")

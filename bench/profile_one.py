#!/usr/bin/env python3
"""Runs one sparse MLA case a few times, for a profiler (ncu) to attach to.
usage: profile_one.py MODULE.cubin BATCH NUM_SPLITS|auto"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
import kforge  # noqa: E402
from bench_extra_kv import dtype_name, make_cache  # noqa: E402

mod = kforge.Kernel.from_files(sys.argv[1])
T = int(sys.argv[2])
splits = None if sys.argv[3] == "auto" else int(sys.argv[3])
spec = mod.spec
d_v, d_qk, heads = spec.kv_lora_rank, spec.kv_lora_rank + spec.rope_dim, spec.num_q_heads
kv = make_cache(torch, dtype_name(spec.kv_cache_dtype), 1 << 20, d_qk)
q = torch.randn(T, heads, d_qk, device="cuda").to(torch.bfloat16)
idx = torch.randint(0, 1 << 20, (T, spec.topk), device="cuda", dtype=torch.int32)
out = torch.empty(T, heads, d_v, device="cuda", dtype=torch.bfloat16)
lse = torch.empty(T, heads, device="cuda") if spec.return_lse else None
for _ in range(3):
    mod(q, kv, idx, out, lse, num_splits=splits)
torch.cuda.synchronize()
print("done")

#!/usr/bin/env python3
"""The DSA indexer's top-k on real indexer logits (128 x 32768 from the
module's own logits kernel) and on other key distributions, graph-replay
medians in us; or, with --ncu, three top-k launches for a profiler.
usage: topk_real_logits.py MODULE.cubin [--ncu]
Prints the first radix digit's boundary-bin sizes over the rows, then the
top-k of: the real logits, randn, keys spread over all 32 bits (no hot
bins), and one octave of values (a boundary bin past the candidates).
bench/profile_topk.py times random logits over row counts and lengths."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from bench_sparse_mla import time_fn  # noqa: E402
from indexer_ab import random_cache  # noqa: E402
from kforge import dsa_indexer as kdi  # noqa: E402

if len(sys.argv) < 2:
    sys.exit(__doc__)
ix = kdi.DsaIndexer.from_files(sys.argv[1])
batch, ctx_len = 128, 32768
gen = torch.Generator(device="cuda").manual_seed(1)
cache, bt, ctx = random_cache(batch, ctx_len, gen)
q = torch.randn(batch, ix.heads, 128, device="cuda", generator=gen).to(torch.float8_e4m3fn)
w = torch.randn(batch, ix.heads, device="cuda", generator=gen)
real = torch.empty(batch, ctx_len, device="cuda")
ix.logits(q, w, cache, bt, ctx, ctx_len, out=real)
torch.cuda.synchronize()
del cache
idx = torch.empty(batch, ix.topk_k, dtype=torch.int32, device="cuda")
if "--ncu" in sys.argv:
    for _ in range(3):
        ix.topk(real, ctx, 1, idx)
    torch.cuda.synchronize()
    sys.exit(0)

# The first digit (the ordered key's top 11 bits) and its boundary bin per row.
bits = real.view(torch.int32).to(torch.int64) & 0xffffffff
key = torch.where(bits >= 0x80000000, 0xffffffff - bits, bits | 0x80000000)
sizes = []
for r in range(batch):
    h = torch.bincount(key[r] >> 21, minlength=2048).flip(0).cumsum(0)
    b = int((h >= ix.topk_k).nonzero()[0])
    sizes.append(int(h[b] - (h[b - 1] if b else 0)))
sizes = torch.tensor(sizes)
print(f"boundary bin sizes: min {sizes.min()} median {sizes.median()} max {sizes.max()}")

spread = torch.randint(-2**31, 2**31 - 1, (batch, ctx_len), dtype=torch.int32, device="cuda",
                       generator=gen)
spread = torch.where((spread & 0x7f800000) == 0x7f800000, spread & ~0x40000000, spread)
cases = (("real", real), ("randn", torch.randn(batch, ctx_len, device="cuda", generator=gen)),
         ("all 32 bits", spread.view(torch.float32)),
         ("one octave", 1000.0 + 999.0 * torch.rand(batch, ctx_len, device="cuda", generator=gen)))
res = [f"{name} {time_fn(lambda _: ix.topk(x, ctx, 1, idx), [None], 30):.1f}" for name, x in cases]
print(f"top-k {batch} x {ctx_len} (us):", " | ".join(res))

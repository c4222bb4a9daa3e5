#!/usr/bin/env python3
"""A/B timing of DSA indexer modules: logits + top-k + slot ids in one CUDA
graph (kforge.dsa_indexer_topk), and the logits kernel alone, at 128 x 32768
and 1 x 131072, the modules alternating in one process so host drift falls
on all of them alike. Prints "step / logits" medians in us.
usage: indexer_ab.py MODULE.cubin [MODULE.cubin ...] [--rounds N]
Every module must match the C ABI library's build (KFORGE_CAPI_LIB selects
it; the plan refuses launch fields another config.h would produce). Random
e4m3 keys with unit scales, random Q and weights, shuffled block tables."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from bench_sparse_mla import time_fn  # noqa: E402
from kforge import dsa_indexer as kdi  # noqa: E402


def random_cache(batch, ctx_len, gen, device="cuda"):
    """Index-key pages of batch requests of ctx_len tokens: e4m3 bytes 0..119
    (finite, no NaN codes) with unit scales, a shuffled block table, and the
    context lengths."""
    pages = (ctx_len + 63) // 64
    cache = torch.randint(0, 120, (batch * pages, kdi.PAGE_BYTES), dtype=torch.uint8,
                          device=device, generator=gen)
    cache[:, 64 * 128:].view(torch.float32)[:] = 1.0
    table = torch.randperm(batch * pages, device=device, generator=gen).view(batch, pages).int()
    ctx = torch.full((batch,), ctx_len, dtype=torch.int32, device=device)
    return cache, table, ctx


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    paths = [a for a in args if a.endswith(".cubin")]
    if not paths:
        sys.exit(__doc__)
    ixs = [kdi.DsaIndexer.from_files(p) for p in paths]
    label = [f"{os.path.basename(os.path.dirname(p)) or '.'}/h{ix.heads}"
             for p, ix in zip(paths, ixs)]
    for batch, ctx_len in ((128, 32768), (1, 131072)):
        gen = torch.Generator(device="cuda").manual_seed(1)
        cache, bt, ctx = random_cache(batch, ctx_len, gen)
        mla_bt = torch.randperm(bt.numel(), device="cuda", generator=gen).view_as(bt).int()
        out = torch.empty(batch, ctx_len, device="cuda")
        for _ in range(rounds):
            res = []
            for name, ix in zip(label, ixs):
                q = torch.randn(batch, ix.heads, 128, device="cuda",
                                generator=gen).to(torch.float8_e4m3fn)
                w = torch.randn(batch, ix.heads, device="cuda", generator=gen)
                idx = torch.empty(batch, ix.topk_k, dtype=torch.int32, device="cuda")
                slots = torch.empty_like(idx)
                t = time_fn(lambda _: kdi.dsa_indexer_topk(
                    ix, q, w, cache, bt, ctx, max_context=ctx_len, mla_block_table=mla_bt,
                    logits=out, indices=idx, slots=slots), [None], 30)
                t_logits = time_fn(lambda _: ix.logits(q, w, cache, bt, ctx, ctx_len, out=out),
                                   [None], 30)
                res.append(f"{name} {t:.1f} / {t_logits:.1f}")
            print(f"{batch} x {ctx_len} (us):", " | ".join(res), flush=True)
        del cache


if __name__ == "__main__":
    main()

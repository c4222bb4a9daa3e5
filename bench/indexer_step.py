#!/usr/bin/env python3
"""The DSA indexer step at decode shapes (issue 47's table): logits + top-k
in one CUDA graph (kforge.dsa_indexer_topk, no slots), the logits kernel
alone and the top-k kernel alone, for each case.

usage: indexer_step.py MODULE.cubin [--cases CASE,...] [--calls N] [--reps N]
                       [--hide-host] [--profile] [--out FILE]

A case is BATCHxS_QxCONTEXT[/MAX_CONTEXT]: every request holds CONTEXT
tokens, or, with an "r" before it (64x1xr4096), a random length in
1..CONTEXT; MAX_CONTEXT (default CONTEXT) is the logits' width, the bound an
engine passes (vLLM passes its max model length).

Two timings of each (CUDA events around graph replays, median of --reps):
  1 call   a graph of one call, replayed: what an engine's graph of one
           layer sees, the host's graph submission included (the issue's
           numbers are taken this way);
  N calls  a graph of --calls calls, replayed, divided by N: the GPU's own
           time a call, with the gaps between dependent kernels but not the
           host's submission.
The "floor" row times a graph of one 4-byte fill kernel the same two ways:
the smallest any step can read on this host and card. --hide-host queues
a GPU busy wait before each timed replay, so the host's graph submission
falls outside the events in both columns (not yet run on a GPU: check the
floor row drops to about a kernel's own time before trusting it).

--profile runs each case's step three times without graphs (for ncu to
attach to, e.g. ncu --metrics gpu__time_duration.sum -k regex:dsa_indexer)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from bench_sparse_mla import time_fn  # noqa: E402
from kforge import dsa_indexer as kdi  # noqa: E402

DEFAULT_CASES = ("128x1x32768,64x1x32768,16x1x32768,4x1x65536,1x1x131072,2x4x65536,1x2x32768,"
                 "64x1xr4096,1x1x2048,1x1x1,1x1x1/131072")


def parse_case(text):
    shape, _, max_ctx = text.partition("/")
    b, s_q, ctx = shape.split("x")
    ragged = ctx.startswith("r")
    ctx = int(ctx.lstrip("r"))
    return int(b), int(s_q), ctx, ragged, int(max_ctx) if max_ctx else ctx


def make_inputs(ix, batch, s_q, ctx, ragged, max_ctx, gen):
    """Random e4m3 keys (codes 0..119, no NaN) with random positive scales in
    shuffled pages, random Q and weights, the context lengths."""
    lens = (torch.randint(1, ctx + 1, (batch,), generator=gen, device="cuda") if ragged else
            torch.full((batch,), ctx, device="cuda")).int()
    pages = (max_ctx + 63) // 64
    used = (ctx + 63) // 64
    cache = torch.randint(0, 120, (batch * used, kdi.PAGE_BYTES), dtype=torch.uint8,
                          device="cuda", generator=gen)
    cache[:, 64 * 128:].view(torch.float32)[:] = torch.rand(
        batch * used, 64, device="cuda", generator=gen) + 0.5
    table = torch.zeros(batch, pages, dtype=torch.int32, device="cuda")
    table[:, :used] = torch.randperm(batch * used, device="cuda",
                                     generator=gen).view(batch, used).int()
    rows = batch * s_q
    q = torch.randn(rows, ix.heads, 128, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(rows, ix.heads, device="cuda", generator=gen)
    return dict(q=q, w=w, cache=cache, table=table, lens=lens,
                logits=torch.empty(rows, max_ctx, device="cuda"),
                idx=torch.empty(rows, ix.topk_k, dtype=torch.int32, device="cuda"))


def calls(ix, d, max_ctx, s_q):
    step = lambda _: kdi.dsa_indexer_topk(  # noqa: E731
        ix, d["q"], d["w"], d["cache"], d["table"], d["lens"], max_context=max_ctx,
        logits=d["logits"], indices=d["idx"])
    logits = lambda _: ix.logits(d["q"], d["w"], d["cache"], d["table"], d["lens"],  # noqa: E731
                                 max_ctx, out=d["logits"])
    topk = lambda _: ix.topk(d["logits"], d["lens"], s_q, d["idx"])  # noqa: E731
    return step, logits, topk


def both_times(fn, n, reps, hide_host=False):
    return (time_fn(fn, [None], reps, hide_host=hide_host),
            time_fn(fn, [None] * n, reps, hide_host=hide_host))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("module")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--hide-host", action="store_true",
                    help="queue a GPU busy wait before each timed replay, so the host's graph "
                         "submission is not timed (bench_sparse_mla.replay_times)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    ix = kdi.DsaIndexer.from_files(a.module)
    gpu = torch.cuda.get_device_name()
    lines = [f"{os.path.basename(a.module)}, {ix.heads} index heads, top-k {ix.topk_k}, {gpu}; "
             f"us, 1 call a graph / {a.calls} calls a graph"
             f"{', host submission hidden' if a.hide_host else ''}", "",
             "| case (batch x s_q x context / max) | step | logits alone | top-k alone |",
             "|---|---|---|---|"]
    if not a.profile:
        one = torch.zeros(1, dtype=torch.int32, device="cuda")
        f1, fn = both_times(lambda _: one.fill_(1), a.calls, a.reps, a.hide_host)
        lines.append(f"| floor: one fill kernel | {f1:.1f} / {fn:.1f} | | |")
        print(lines[-1], flush=True)
    for text in a.cases.split(","):
        batch, s_q, ctx, ragged, max_ctx = parse_case(text)
        gen = torch.Generator(device="cuda").manual_seed(47)
        d = make_inputs(ix, batch, s_q, ctx, ragged, max_ctx, gen)
        step, logits, topk = calls(ix, d, max_ctx, s_q)
        if a.profile:
            for _ in range(3):
                step(None)
            torch.cuda.synchronize()
            print(f"profiled {text}", flush=True)
            continue
        cells = []
        for fn in (step, logits, topk):
            t1, tn = both_times(fn, a.calls, a.reps, a.hide_host)
            cells.append(f"{t1:.1f} / {tn:.1f}")
        lines.append(f"| {text} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
        del d
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

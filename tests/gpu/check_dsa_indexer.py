#!/usr/bin/env python3
"""GPU check (and --bench) of the DSA indexer modules `kforge compile --kind
dsa-indexer` wrote into DIR, against an fp64 PyTorch reference on fresh
random inputs (docs/DESIGN.md, "The DSA lightning indexer").

    python3 tests/gpu/check_dsa_indexer.py DIR [--bench] [--seed N]

Checks, per module for this GPU's arch and per case:
  logits   every valid position within 1e-2 relative of the fp64 reference
           on the dequantized inputs (|got - ref| <= 1e-2 |ref| + 1e-5 *
           the row's largest |ref|, the second term for cancellation between
           heads of opposite weight); every masked position of [0,
           max_context) exactly -inf; outputs poisoned with NaN first
  top-k    the valid prefix: distinct positions in [0, len), increasing;
           the set is
           torch.topk's of the same fp32 logits except at exact ties on the
           boundary (every logit above the k-th value is in, every chosen
           one is >= it, and of the ties the smallest positions are taken);
           -1 after min(len, k); poisoned first
  slots    block_table_mla[b, pos // 64] * 64 + pos % 64, -1 kept
Cases: s_q 1..4 (the causal edge), contexts of length 1, shorter than k,
exactly k, longer than k, a partial last page, shuffled page tables, heads
padded to 16 (a module with another head count), a CUDA-graph replay;
prefill (query_start): ragged rows per request, a whole prompt's causal
edge, rows no request holds, more rows than context, a decreasing
query_start, a graph replay; top-k on logits written directly: winners all
in the first or the last part of a cluster's row, all equal, few values,
+-inf blocks, denormals, huge values, odd strides, more rows than the
cluster entry takes, boundary bins past the candidates' room. Modules with
the top-k cluster entry (sm_90+) run every case three times: as shipped,
the cluster entry forced on, and off.

Without a GPU (or torch, or a CUDA driver) it prints SKIP and exits 0.
"""

import argparse
import copy
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(0)


try:
    import torch
except ImportError:
    skip("no PyTorch")
if not torch.cuda.is_available():
    skip("no CUDA GPU")
try:
    from kforge import dsa_indexer as kdi
    from bench_sparse_mla import time_fn  # CUDA-graph replays, median
    kdi._driver()
except Exception as e:  # noqa: BLE001 - any import problem is a skip reason
    skip(f"cannot load kernels here ({e})")

NEG_INF = float("-inf")


def arch_tag():
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}" + ("a" if major >= 9 else "")


def row_map(batch, s_q, lens, query_start=None, rows=None):
    """(request, valid positions) of every query row, as the kernels locate
    rows (LocateRow in templates/kforge/dsa_indexer/logits.cuh): decode, s_q
    rows per request; prefill, the first request b whose rows end past the
    row (query_start[b + 1] > row), empty unless query_start[b] <= row."""
    def causal(L, n, i):
        return min(L, max(0, L - n + i + 1))
    if query_start is None:
        return [(b, causal(lens[b], s_q, i)) for b in range(batch) for i in range(s_q)]
    out = []
    for r in range(rows):
        lo, hi = 0, batch
        while lo < hi:
            mid = (lo + hi) // 2
            if query_start[mid + 1] <= r:
                lo = mid + 1
            else:
                hi = mid
        if lo >= batch or r < query_start[lo] or query_start[lo + 1] - query_start[lo] <= 0:
            out.append((-1, 0))
        else:
            n = query_start[lo + 1] - query_start[lo]
            out.append((lo, causal(lens[lo], n, r - query_start[lo])))
    return out


def make_case(heads, batch, s_q, lens, seed, dev, max_context=None, shuffle=True,
              query_start=None, rows=None):
    """Random inputs for `lens` (context lengths per request); prefill when
    query_start (a list of batch + 1 ints) and rows are given."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    max_len = max(lens)
    if max_context is None:
        max_context = max_len + int(torch.randint(0, 100, (1,), generator=g))
    pages_per_req = (max_context + 63) // 64
    num_pages = batch * pages_per_req + 3
    perm = torch.randperm(num_pages, generator=g) if shuffle else torch.arange(num_pages)
    block_table = perm[:batch * pages_per_req].view(batch, pages_per_req).to(torch.int32)
    cache = torch.zeros(num_pages, kdi.PAGE_BYTES, dtype=torch.uint8)
    # Garbage in unused pages and rows, so reading past the context shows.
    cache.random_(0, 256, generator=g)
    values_all, scales_all = [], []
    for b in range(batch):
        keys = torch.randn(lens[b], 128, generator=g) * (0.5 + torch.rand(lens[b], 1, generator=g))
        values, scales = kdi.quantize_index_keys(keys)
        values_all.append(values)
        scales_all.append(scales)
        n_pages = (lens[b] + 63) // 64
        for pg in range(n_pages):
            page = int(block_table[b, pg])
            lo, hi = pg * 64, min(lens[b], pg * 64 + 64)
            vals = cache[page, :64 * 128].view(64, 128)
            vals[:hi - lo] = values[lo:hi]
            sc = cache[page, 64 * 128:].view(torch.float32)
            sc[:hi - lo] = scales[lo:hi]
    if query_start is None:
        rows = batch * s_q
    q = (torch.randn(rows, heads, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    weights = torch.randn(rows, heads, generator=g) * 0.1
    ctx = torch.tensor(lens, dtype=torch.int32)
    mla_table = torch.randperm(10 * num_pages, generator=g)[:batch * pages_per_req].view(
        batch, pages_per_req).to(torch.int32)
    return dict(q=q.to(dev), weights=weights.to(dev), cache=cache.to(dev),
                block_table=block_table.to(dev), context_lens=ctx.to(dev),
                mla_table=mla_table.to(dev), max_context=max_context, s_q=s_q, batch=batch,
                values=values_all, scales=scales_all, lens=lens, rows=rows,
                row_map=row_map(batch, s_q, lens, query_start, rows),
                query_start=(None if query_start is None else
                             torch.tensor(query_start, dtype=torch.int32).to(dev)))


def reference_logits(c):
    """fp64 [rows, max_context], -inf where masked."""
    q = c["q"].cpu().float().double()
    w = c["weights"].cpu().double()
    out = torch.full((c["rows"], c["max_context"]), NEG_INF, dtype=torch.float64)
    keys = [v.view(torch.float8_e4m3fn).float().double() for v in c["values"]]  # [L, 128]
    for r, (b, n) in enumerate(c["row_map"]):
        if n == 0:
            continue
        dots = torch.relu(q[r] @ keys[b][:n].T)  # [H, n]
        out[r, :n] = (w[r][:, None] * dots).sum(0) * c["scales"][b][:n].double()
    return out


def check_topk(got_logits, idx, slots, c, k, label):
    """Returns a list of failure strings."""
    fails = []
    lg = got_logits.cpu()
    idx = idx.cpu()
    slots = slots.cpu() if slots is not None else None
    table = c["mla_table"].cpu()
    for r, (b, n) in enumerate(c["row_map"]):
        m = min(n, k)
        row = idx[r]
        if (row[m:] != -1).any():
            fails.append(f"{label} row {r}: not -1 after {m}")
        pos = row[:m].long()
        if m and ((pos < 0).any() or (pos >= n).any()):
            fails.append(f"{label} row {r}: positions outside [0, {n})")
            continue
        if len(set(pos.tolist())) != m:
            fails.append(f"{label} row {r}: repeated positions")
            continue
        if m == 0:
            continue
        vals = lg[r, pos]
        if (pos[1:] <= pos[:-1]).any():
            fails.append(f"{label} row {r}: positions not increasing")
        valid = lg[r, :n]
        ref_vals, _ = torch.topk(valid, m)
        kth = ref_vals[-1]
        above = (valid > kth).nonzero().flatten()
        if not set(above.tolist()) <= set(pos.tolist()) or (vals < kth).any():
            fails.append(f"{label} row {r}: set differs from torch.topk beyond ties")
        tie_pos = (valid == kth).nonzero().flatten()
        need = m - above.numel()
        chosen_ties = sorted(p for p in pos.tolist() if valid[p] == kth)
        if chosen_ties != tie_pos[:need].tolist():
            fails.append(f"{label} row {r}: boundary ties not the smallest positions")
        if slots is not None:
            want = table[b, pos // 64] * 64 + pos % 64
            if (slots[r, :m] != want.to(torch.int32)).any() or (slots[r, m:] != -1).any():
                fails.append(f"{label} row {r}: slots wrong")
    return fails


def run_case(ix, c, label, graph=False):
    dev = ix.device
    rows = c["rows"]
    k = ix.topk_k
    logits = torch.full((rows, c["max_context"] + 5), float("nan"), device=dev)
    idx = torch.full((rows, k), 0x7eadbeef, dtype=torch.int32, device=dev)
    slots = torch.full((rows, k), 0x7eadbeef, dtype=torch.int32, device=dev)

    def step():
        kdi.dsa_indexer_topk(ix, c["q"], c["weights"], c["cache"], c["block_table"],
                             c["context_lens"], max_context=c["max_context"],
                             mla_block_table=c["mla_table"], logits=logits, indices=idx,
                             slots=slots, query_start=c["query_start"])

    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()  # warm-up outside the graph
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        logits.fill_(float("nan"))
        idx.fill_(0x7eadbeef)
        slots.fill_(0x7eadbeef)
        g.replay()
    else:
        step()
    torch.cuda.synchronize()
    fails = []
    ref = reference_logits(c)
    got = logits[:, :c["max_context"]].cpu().double()
    if (logits[:, c["max_context"]:].isnan().logical_not()).any():
        fails.append(f"{label}: wrote past max_context")
    masked = torch.isinf(ref)
    if not torch.equal(got[masked], ref[masked]):
        fails.append(f"{label}: masked positions not -inf ({int((got[masked] != NEG_INF).sum())})")
    worst = 0.0
    if (~masked).any():
        r_abs = ref.abs().masked_fill(masked, 0)
        row_max = r_abs.amax(dim=1, keepdim=True).expand_as(ref)
        err = (got - ref).abs()
        tol = 1e-2 * r_abs + 1e-5 * row_max
        bad = (~masked) & ~(err <= tol)
        if bad.any():
            fails.append(f"{label}: {int(bad.sum())} logits off "
                         f"(max err {float(err[bad].max()):.3g})")
        rel = (err / (r_abs + 1e-5 * row_max)).masked_fill(masked, 0)
        worst = float(rel.max())
    fails += check_topk(logits[:, :c["max_context"]], idx, slots, c, k, label)
    return fails, worst


def variants(path):
    """The module as shipped and, where it has the top-k cluster entry, with
    the launch rule's row bound moved so every case takes the cluster entry,
    then none does (the plan picks by rows: both paths see every case)."""
    ix = kdi.DsaIndexer.from_files(path)
    out = [("", ix)]
    if ix.description["indexer"].get("topk_cluster"):
        for tag, rows in ((" [cluster]", 65535), (" [one CTA]", 0)):
            d = copy.deepcopy(ix.description)
            d["indexer"]["topk_cluster"].update(max_rows=rows, short_rows=rows)
            out.append((tag, kdi.DsaIndexer(d, ix._image)))
    return out


def topk_direct_cases(k, seed):
    """(name, rows of logits as lists of tensors) for the top-k alone."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = 8 * k + 3  # every part of an 8-CTA cluster, an odd length
    blocks = torch.randn(n, generator=g)
    blocks[n // 3:n // 2] = NEG_INF
    blocks[5:9] = float("inf")
    patterns = [
        torch.arange(n, dtype=torch.float32),  # every winner in the last part
        -torch.arange(n, dtype=torch.float32),  # in the first
        torch.full((n,), 0.25),  # all equal: the k smallest positions
        torch.randint(0, 5, (n,), generator=g).float(),  # ties across parts
        torch.randn(n, generator=g),
        blocks,
        torch.randn(n, generator=g) * 1e-40,  # denormals
        torch.randn(n, generator=g) * 1e37,
        torch.randn(k + 1, generator=g),
        torch.randn(k, generator=g),
        torch.randn(5, generator=g),
        torch.randn(131072, generator=g),
        # The boundary bin holds more than one CTA's candidates (4096): the
        # whole cluster's (each part's fits), then each part's too.
        torch.randint(0, 3, (60000,), generator=g).float(),
        torch.full((40000,), 1.5),
    ]
    many = [torch.randint(0, 50, (3 * k + 7,), generator=g).float() for _ in range(40)]
    return [("topk patterns", patterns), ("topk 40 rows", many)]


def run_topk_direct(ix, rows, label, stride_pad):
    """Top-k (with slots) of `rows` written into a logits tensor whose
    row stride is the longest row + stride_pad (odd: unaligned rows)."""
    dev = ix.device
    k = ix.topk_k
    lens = [len(r) for r in rows]
    width = max(lens) + stride_pad
    logits = torch.full((len(rows), width), float("nan"))
    for i, r in enumerate(rows):
        logits[i, :len(r)] = r
    logits = logits.to(dev)
    ctx = torch.tensor(lens, dtype=torch.int32, device=dev)
    pages = (width + 63) // 64
    table = torch.randperm(len(rows) * pages * 3)[:len(rows) * pages].view(
        len(rows), pages).to(torch.int32).to(dev)
    idx = torch.full((len(rows), k), 0x7eadbeef, dtype=torch.int32, device=dev)
    slots = torch.full_like(idx, 0x7eadbeef)
    ix.topk(logits, ctx, 1, idx, mla_block_table=table, slots=slots, max_context=max(lens))
    torch.cuda.synchronize()
    c = dict(row_map=[(b, n) for b, n in enumerate(lens)], mla_table=table)
    return check_topk(logits, idx, slots, c, k, label)


def check(modules, seed):
    dev = torch.device("cuda")
    total = failed = 0

    def record(label, fails, worst, what=""):
        nonlocal total, failed
        total += 1
        failed += bool(fails)
        print(f"{'FAIL' if fails else 'ok  '} {label}: {what}max rel err {worst:.2e}")
        for f in fails[:8]:
            print("   ", f)

    for path, (tag, ix) in ((p, v) for p in modules for v in variants(p)):
        k, h = ix.topk_k, ix.heads
        name = ix.module_name + tag
        for n, (what, rows) in enumerate(topk_direct_cases(k, seed + 200)):
            for pad in (1, 4):
                label = f"{name} {what} (stride +{pad})"
                record(label, run_topk_direct(ix, rows, label, pad), 0.0, f"{len(rows)} rows ")
        cases = [
            ("len1", 3, 1, [1, 1, 1]),
            ("short", 2, 1, [min(k - 1, 100) or 1, 37]),
            ("exact_k", 2, 1, [k, k + 1]),
            ("long", 2, 1, [k + 700, 3 * k + 5]),
            ("mtp2", 3, 2, [2, k + 3, 300]),
            ("mtp3", 2, 3, [3, k + 130]),
            ("mtp4", 3, 4, [4, 5, 2 * k + 64]),
            ("pages", 4, 1, [64, 128, 65, 5000]),
        ]
        for n, (name, batch, s_q, lens) in enumerate(cases):
            c = make_case(h, batch, s_q, lens, seed + n, dev)
            label = f"{name} {name}"
            record(label, *run_case(ix, c, label), f"batch {batch} s_q {s_q} lens {lens} ")
        # Ties: a tied cache (every key equal) makes every logit of a row equal.
        c = make_case(h, 2, 2, [k + 300, 90], seed + 99, dev)
        for b in range(2):
            c["values"][b][:] = c["values"][b][0]
            c["scales"][b][:] = c["scales"][b][0]
        cache = c["cache"].cpu()
        for b in range(2):
            for pg in range((c["lens"][b] + 63) // 64):
                page = int(c["block_table"][b, pg])
                cache[page, :64 * 128].view(64, 128)[:] = c["values"][b][0]
                cache[page, 64 * 128:].view(torch.float32)[:] = c["scales"][b][0]
        c["cache"] = cache.to(dev)
        record(f"{name} ties", *run_case(ix, c, f"{name} ties"))
        # Prefill: ragged query rows per request (query_start), each row
        # causal at its own position: a one-token request, a whole prompt
        # (rows == context), a long chunk; then rows no request holds
        # (before query_start[0], an empty request, past the last), more
        # rows than context, and a decreasing query_start.
        prefill = [
            ("prefill", [50, 7, k + 900], [0, 1, 8, 308], 308),
            ("prefill_gaps", [5, k + 52, 9, 4], [2, 2, 10, 10, 20], 23),
            ("prefill_bad_qs", [300, 70, 40], [0, 9, 4, 12], 12),
        ]
        for n, (name, lens, qs, rows) in enumerate(prefill):
            c = make_case(h, len(lens), 0, lens, seed + 50 + n, dev, query_start=qs, rows=rows)
            label = f"{name} {name}"
            record(label, *run_case(ix, c, label, graph=name == "prefill"),
                   f"lens {lens} query_start {qs} rows {rows} ")
        c = make_case(h, 3, 2, [k + 50, 17, 1000], seed + 7, dev)
        label = f"{name} cuda graph replay"
        record(label, *run_case(ix, c, label, graph=True))
    print(f"check: {total - failed}/{total} passed")
    return failed == 0


def torch_reference(q, weights, cache, block_table, ctx, max_context, k, s_q):
    """The PyTorch implementation the bench compares with (what an engine
    without the kernel runs): gather the pages, dequantize to bf16,
    matmul, relu, weigh, sum, scale, mask, torch.topk."""
    batch = block_table.shape[0]
    pages = block_table[:, :(max_context + 63) // 64].long()
    raw = cache[pages]  # [B, P, 8448]
    vals = raw[..., :64 * 128].reshape(batch, -1, 128)[:, :max_context]
    scales = raw[..., 64 * 128:].contiguous().view(torch.float32).reshape(batch, -1)
    scales = scales[:, :max_context]
    kb = vals.view(torch.float8_e4m3fn).to(torch.bfloat16)
    qb = q.view(batch, s_q, -1, 128).to(torch.bfloat16)
    s = torch.einsum("bihd,bsd->bihs", qb, kb).float().relu_()
    logits = (s * weights.view(batch, s_q, -1, 1)).sum(2) * scales[:, None, :]
    pos = torch.arange(max_context, device=q.device)
    limit = (ctx[:, None] - s_q + torch.arange(s_q, device=q.device)[None, :])[..., None]
    logits = logits.masked_fill(pos[None, None, :] > limit, float("-inf"))
    return torch.topk(logits.view(batch * s_q, -1), k, dim=-1).indices


def bench_one(ix, batch, ctx_len, label, reps=20):
    dev = ix.device
    h, k = ix.heads, ix.topk_k
    pages_per_req = (ctx_len + 63) // 64
    num_pages = batch * pages_per_req
    gen = torch.Generator(device=dev).manual_seed(1)
    cache = torch.randint(0, 256, (num_pages, kdi.PAGE_BYTES), dtype=torch.uint8, device=dev,
                          generator=gen)
    # Scales: small positive floats (random bytes would be NaN / huge).
    cache[:, 64 * 128:].view(torch.float32)[:] = torch.rand(num_pages, 64, device=dev,
                                                            generator=gen) + 0.5
    vals = cache[:, :64 * 128]
    vals[(vals & 0x7f) == 0x7f] = 0  # no e4m3 NaN codes
    block_table = torch.randperm(num_pages, device=dev, generator=gen).view(
        batch, pages_per_req).to(torch.int32)
    ctx = torch.full((batch,), ctx_len, dtype=torch.int32, device=dev)
    q = torch.randn(batch, h, 128, device=dev, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(batch, h, device=dev, generator=gen)
    logits = torch.empty(batch, ctx_len, device=dev)
    idx = torch.empty(batch, k, dtype=torch.int32, device=dev)
    slots = torch.empty_like(idx)

    def timed(fn, n=reps):
        return time_fn(lambda _: fn(), [None], n)

    t_logits = timed(lambda: ix.logits(q, w, cache, block_table, ctx, ctx_len, out=logits))
    t_topk = timed(lambda: ix.topk(logits, ctx, 1, idx, mla_block_table=block_table, slots=slots))
    t_both = timed(lambda: kdi.dsa_indexer_topk(ix, q, w, cache, block_table, ctx,
                                                max_context=ctx_len, mla_block_table=block_table,
                                                logits=logits, indices=idx, slots=slots))
    # Agreement with the reference on this input (sets, ties aside).
    try:
        ref_idx = torch_reference(q, w, cache, block_table, ctx, ctx_len, k, 1)
        same = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in
                   zip(idx[:4].cpu(), ref_idx[:4].cpu())) / (4 * k if batch >= 4 else batch * k)
        t_ref = timed(lambda: torch_reference(q, w, cache, block_table, ctx, ctx_len, k, 1), 5)
    except torch.cuda.OutOfMemoryError:
        same, t_ref = float("nan"), float("nan")
    floor_us = batch * ctx_len * 132 / 4.8e12 * 1e6
    print(f"| {label} | {batch} x {ctx_len} | {t_logits:.1f} | {t_topk:.1f} | {t_both:.1f} | "
          f"{floor_us:.1f} | {t_ref:.1f} | {t_ref / t_both:.1f}x | {same:.3f} |")


def bench_topk_paths(path):
    """The top-k alone on random logits, one CTA per row against the cluster
    entry, over rows: the numbers behind config.h's kTopkCluster* bounds."""
    vs = variants(path)
    if len(vs) == 1:
        return
    print("| top-k rows x context | one CTA per row us | cluster us |")
    print("|---|---|---|")
    gen = torch.Generator(device="cuda").manual_seed(3)
    for ctx_len in (32768, 131072):
        for rows in (1, 2, 4, 8, 16, 32, 64, 128):
            logits = torch.randn(rows, ctx_len, device="cuda", generator=gen)
            ctx = torch.full((rows,), ctx_len, dtype=torch.int32, device="cuda")
            idx = torch.empty(rows, vs[0][1].topk_k, dtype=torch.int32, device="cuda")
            t = {tag: time_fn(lambda _, ix=ix: ix.topk(logits, ctx, 1, idx), [None], 20)
                 for tag, ix in vs[1:]}
            print(f"| {rows} x {ctx_len} | {t[' [one CTA]']:.1f} | {t[' [cluster]']:.1f} |")


def bench(modules):
    print("| module | batch x context | logits us | top-k us | both us | HBM floor us (4.8 TB/s)"
          " | torch us | speedup | top-k overlap with torch (bf16) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in modules:
        ix = kdi.DsaIndexer.from_files(path)
        name = os.path.basename(path)
        if ix.heads not in (32, 64) or ix.topk_k != 2048:
            continue  # the models' shapes only
        if ix.heads == 64:
            bench_one(ix, 128, 32768, name)
        bench_one(ix, 1, 131072, name)
    for path in modules:
        ix = kdi.DsaIndexer.from_files(path)
        if ix.heads == 64 and ix.topk_k == 2048:
            bench_topk_paths(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(2), "little"))
    args = ap.parse_args()
    from kforge.kernel import module_cubins
    modules = module_cubins(args.dir, f"dsa_indexer_*_{arch_tag()}")
    if not modules:
        print(f"no dsa_indexer modules for {arch_tag()} in {args.dir}")
        return 1
    print(f"{torch.cuda.get_device_name()}  seed {args.seed}  modules: "
          f"{[os.path.basename(m) for m in modules]}")
    ok = True
    if not args.no_check:
        ok = check(modules, args.seed)
    if args.bench:
        bench(modules)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

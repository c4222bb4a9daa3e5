#!/usr/bin/env python3
"""GPU correctness check for kforge sparse MLA modules (needs a CUDA GPU).

Loads every module under MODULE_DIR (written by `kforge compile`, see
tests/gpu/compile_check_modules.sh) with the kforge package
(kforge.Kernel.from_files: launches planned by the C++ PlanDecode through
the C ABI, loaded and launched by the C++ module loader through it) and compares it
with an fp64 PyTorch reference on fresh random inputs: -1 padding,
out-of-range slots, a query token whose indices are all invalid, a paged
cache with a gap between pages, outputs poisoned with NaN before each run,
and several split counts (1, the launch rule's choice, the maximum), forced
through the selector's forced_num_splits. Then, at small batches, the
optional inputs: topk_length per query token ([batch, s_q] or flat) and per
request ([batch], s_q > 1) with rows of 0 and of exactly topk, values past
topk and negative (clamped by the kernel) and the indices past a token's
length pointed at real slots (they must not count); an attention sink per
head (random around the lse, +1e4: out 0, -1e4 and -inf: no effect); and
both together. The reference: out = out_attn / (1 + exp(sink - lse)), lse
the attention's own. A module built with an extra KV cache (spec extra_kv)
gets one of its own format and page size, its own indices (with repeats and
the same kinds of invalid ones, all -1 for the empty token) and, with
topk_length, its own extra_topk_length; the reference attends both lists in
one softmax.

Bars: bf16 output relative error <= 1e-2, lse relative error <= 1e-4, no NaN,
every output element written. Prints one table row per case and exits 1 on
any failure. Skips (exit 0, "SKIP") when no GPU is present.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def reference(q, kv_rows, idx, valid, scale, d_v):  # idx unused (valid says)
    """fp64 sparse attention. q [T,H,D], kv_rows [T,K,D], valid [T,K]."""
    import torch
    s = torch.einsum("thd,tkd->thk", q, kv_rows) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf where nothing is valid
    p = torch.exp(s - lse[..., None])
    p = torch.nan_to_num(p, nan=0.0)
    out = torch.einsum("thk,tkd->thd", p, kv_rows[..., :d_v])
    return out, lse


FP8_DS_MLA = 2
SCALE_FORMATS = {1: "pow2", 2: "arbitrary"}
# Magnitudes an fp8 cache is tried at: its scales come out ~1/448, tiny
# (~2e-9) and huge (~20); e4m3 codes span +-448 and the subnormals.
FP8_MAGNITUDES = (1.0, 1e-6, 1e4)


def make_cache(spec, num_pages, pbs, D, paged_gap, gen, magnitude):
    """(kv tensor the kernel reads, fp64 rows [num_pages, pbs, D] of its
    values). bf16: random values, a page gap of 64 elements. fp8_ds_mla:
    random values times `magnitude`, one all-zero 128-group, quantized with
    the spec's scale convention; uint8 records, a page gap of 64 bytes."""
    import torch
    import kforge
    from kforge import kv_records
    if kv_records.record_name(spec.kv_cache_dtype):
        return make_record_cache(spec, num_pages, pbs, D, paged_gap, gen, magnitude)
    if spec.kv_cache_dtype != FP8_DS_MLA:
        gap = 64 if paged_gap else 0  # elements between pages (keeps 16 B alignment)
        page_stride = pbs * D + gap
        # Times `magnitude` too: beside a quantised cache (an extra cache of
        # another format) the logits stay O(1) for every magnitude tried.
        storage = (torch.randn(num_pages * page_stride, generator=gen, device="cuda",
                               dtype=torch.float32) * magnitude).to(torch.bfloat16)
        kv = storage.as_strided((num_pages, pbs, D), (page_stride, D, 1))
        return kv, kv.double()
    values = torch.randn(num_pages, pbs, D, generator=gen, device="cuda",
                         dtype=torch.float32) * magnitude
    values[0, 0, :128] = 0  # a zero tile: scale 1, every code 0
    records = kforge.quantize_fp8_ds_mla(values, SCALE_FORMATS[spec.kv_scale_format])
    R = records.shape[-1]
    page_stride = pbs * R + (64 if paged_gap else 0)
    storage = torch.full((num_pages * page_stride,), 0xFF, dtype=torch.uint8, device="cuda")
    kv = storage.as_strided((num_pages, pbs, R), (page_stride, R, 1))
    kv.copy_(records)
    # The reference keys are the kernel's: e4m3 * scale rounded once to
    # fp32 and then to bf16 (kv_format.cuh, as FlashMLA's dequantisation),
    # so a row of one or two tokens (a short topk_length) checks the
    # kernel's arithmetic, not that rounding (about 3e-3 in such an lse).
    return kv, kforge.dequantize_fp8_ds_mla(kv).float().to(torch.bfloat16).double()


def make_record_cache(spec, num_pages, pbs, D, paged_gap, gen, magnitude):
    """A V4 / V4.1 / nvfp4 cache: random values times `magnitude` with an
    all-zero scale group, quantized (kforge.kv_records), pages 64 bytes
    apart when `paged_gap`; then scale bytes at their extremes poked into
    page 0 (ue8m0 0 = 2^-127 and 1; e4m3 scales 0x01 = 2^-9, the smallest,
    and 0x7e = 448, the largest). The reference rows are the kernel's view
    of those bytes (kv_records.bf16_dequantize_kv_records: each value
    rounded once from fp32 to bf16)."""
    import torch
    from kforge import kv_records
    name = kv_records.record_name(spec.kv_cache_dtype)
    values = torch.randn(num_pages, pbs, D, generator=gen, device="cuda",
                         dtype=torch.float32) * magnitude
    values[0, 0, :64] = 0  # a zero group / block
    page = kv_records.page_bytes(name, pbs) + (64 if paged_gap else 0)
    kv = kv_records.quantize_kv_records(values, name, page_stride=page)
    raw = torch.as_strided(kv, (num_pages * page,), (1,))  # the whole buffer
    t = min(1, pbs - 1)  # token 1 of page 0 (token 0 on 1-token pages)
    if name == "nvfp4_ds_mla":
        rec = t * 352
        raw[rec + 320] = 0x01   # block 0: scale 2^-9
        raw[rec + 321] = 0x7E   # block 4: scale 448
    else:
        data = 576 if name == "fp8_ds_mla_v4" else 512
        scale_bytes = 8 if name == "fp8_ds_mla_v4" else 16
        row = pbs * data + t * scale_bytes
        raw[row] = 0            # group 0: 2^-127
        raw[row + 1] = 1        # group 1: 2^-126
    return kv, kv_records.bf16_dequantize_kv_records(kv, name)


def launch(mod, q, kv, idx, out, lse, num_splits, topk_length=None, sink=None, extra=None):
    """mod(q, kv, idx, out, lse, num_splits=...) with the optional
    topk_length and sink (kforge.Kernel's call) and the extra cache's
    (extra_kv_cache, extra_indices, extra_topk_length) or None."""
    x_kv, x_idx, x_len = extra if extra is not None else (None, None, None)
    return mod(q, kv, idx, out, lse, num_splits=num_splits, topk_length=topk_length,
               sink=sink, extra_kv_cache=x_kv, extra_indices=x_idx, extra_topk_length=x_len)


def extra_cache_spec(spec):
    """A spec whose cache is `spec`'s extra cache (make_cache's input)."""
    x = type(spec)()
    x.CopyFrom(spec)
    x.ClearField("extra_kv")
    x.kv_cache_dtype = spec.extra_kv.kv_cache_dtype
    x.kv_scale_format = spec.extra_kv.kv_scale_format
    x.page_block_size = spec.extra_kv.page_block_size
    return x


def random_indices(torch, gen, T, K, num_slots, unique):
    """[T, K] int32 slots: unique per token (or with repeats), ~10% -1,
    ~3% past the cache, ~2% other negatives (INT_MIN in column 0)."""
    if unique:
        idx = torch.stack([torch.randperm(num_slots, generator=gen, device="cuda")[:K]
                           for _ in range(T)]).to(torch.int32)
    else:
        idx = torch.randint(0, num_slots, (T, K), generator=gen, device="cuda",
                            dtype=torch.int32)
    drop = torch.rand(T, K, generator=gen, device="cuda") < 0.1
    idx = torch.where(drop, torch.full_like(idx, -1), idx)
    oob = torch.rand(T, K, generator=gen, device="cuda") < 0.03
    idx = torch.where(oob, torch.full_like(idx, num_slots + 5), idx)
    # Negative slots other than -1, down to INT_MIN, mean "no token" too.
    neg = torch.rand(T, K, generator=gen, device="cuda") < 0.02
    idx = torch.where(neg, torch.full_like(idx, -7), idx)
    idx[:, :1] = torch.where(idx[:, :1] == -7, torch.full_like(idx[:, :1], -2**31), idx[:, :1])
    return idx


def cut_at_lengths(torch, gen, idx, valid, topk_length, batch, s_q, num_slots):
    """(lengths tensor as the kernel takes it, idx, valid) for a list of
    K indices per token cut at random lengths (specials included), one per
    token ("token") or per request ("request"); past a token's length the
    indices point at real slots (read, they would count)."""
    T, K = idx.shape
    n = batch if topk_length == "request" else T
    lengths = torch.randint(0, K + 1, (n,), generator=gen, device="cuda", dtype=torch.int64)
    lengths = place_specials(torch, gen, lengths, topk_length_specials(K), max(1, n // 2))
    tensor = lengths.to(torch.int32)
    if topk_length == "token" and (batch + s_q) % 2:
        tensor = tensor.view(batch, s_q)  # [batch, s_q], else [batch * s_q]
    per_token = lengths if topk_length == "token" else lengths.repeat_interleave(s_q)
    counted = torch.arange(K, device="cuda")[None, :] < per_token.clamp(0, K)[:, None]
    real = torch.randint(0, num_slots, (T, K), generator=gen, device="cuda", dtype=torch.int32)
    return tensor, torch.where(counted, idx, real), valid & counted


def gather_rows(torch, kv_values, idx, valid, pbs):
    """fp64 rows [T, K, D] of the valid slots, zero elsewhere."""
    safe = torch.where(valid, idx, torch.zeros_like(idx)).long()
    return kv_values[safe // pbs, safe % pbs] * valid[..., None]


# topk_length values placed at random entries: a row with nothing, one
# with exactly topk, past topk and negative (the kernel clamps to 0..topk).
def topk_length_specials(topk):
    return [0, topk, topk + 17, -3, 2**31 - 1, -2**31]


# Sink logits placed at random heads: out ~0, no effect, no effect.
SINK_SPECIALS = (1e4, -1e4, float("-inf"))


def place_specials(torch, gen, values, specials, count):
    """values with `count` of `specials` (from a random rotation) written at
    random distinct entries."""
    n = values.shape[0]
    count = min(count, n, len(specials))
    start = int(torch.randint(0, len(specials), (1,), generator=gen, device="cuda"))
    where = torch.randperm(n, generator=gen, device="cuda")[:count]
    chosen = [specials[(start + i) % len(specials)] for i in range(count)]
    values[where] = torch.tensor(chosen, dtype=values.dtype, device="cuda")
    return values


def run_case(mod, batch, s_q, splits_mode, gen, paged_gap, magnitude=1.0, topk_length=None,
             sink=False):
    """One case; topk_length None, "token" (one length per query token) or
    "request" (one per request); sink: an attention sink per head."""
    import torch
    spec = mod.spec
    H, Dv, K = spec.num_q_heads, spec.kv_lora_rank, spec.topk
    D = Dv + spec.rope_dim
    T = batch * s_q
    pbs = spec.page_block_size
    num_pages = max(4, math.ceil(2 * (K + 64) / pbs))
    num_slots = num_pages * pbs
    kv_view, kv_values = make_cache(spec, num_pages, pbs, D, paged_gap, gen, magnitude)

    # q / magnitude keeps the logits O(1) whatever the cache's magnitude, as
    # in a real model: the kernels multiply bf16 K (dequantised e4m3 *
    # scale, rounded once to bf16 as FlashMLA does), so raw 1e4-magnitude
    # keys would give logits ~1e4 that bf16 rounding alone moves by ~10.
    # The cache's extreme scales are still what the kernel reads.
    q = (torch.randn(T, H, D, generator=gen, device="cuda", dtype=torch.float32) /
         magnitude).to(torch.bfloat16)
    # Unique random slots per token, then knock some out.
    idx = random_indices(torch, gen, T, K, num_slots, unique=True)
    if T > 1:
        idx[T // 2].fill_(-1)  # a token with nothing to attend to
    valid = (idx >= 0) & (idx < num_slots)
    tl_tensor = None
    if topk_length is not None:
        tl_tensor, idx, valid = cut_at_lengths(torch, gen, idx, valid, topk_length, batch, s_q,
                                               num_slots)
    rows = gather_rows(torch, kv_values, idx, valid, pbs)
    # The extra cache (spec extra_kv): its own format, page size and
    # indices (with repeats), and its own lengths beside topk_length; its
    # rows join the top-k ones in the one softmax.
    extra = None
    if spec.HasField("extra_kv"):
        xspec = extra_cache_spec(spec)
        XK, xpbs = spec.extra_kv.topk, spec.extra_kv.page_block_size
        x_pages = max(4, math.ceil(2 * (XK + 64) / xpbs))
        x_slots = x_pages * xpbs
        x_view, x_values = make_cache(xspec, x_pages, xpbs, D, paged_gap, gen, magnitude)
        x_idx = random_indices(torch, gen, T, XK, x_slots, unique=False)
        if T > 1:
            x_idx[T // 2].fill_(-1)
        x_valid = (x_idx >= 0) & (x_idx < x_slots)
        x_tl = None
        if topk_length is not None:
            x_tl, x_idx, x_valid = cut_at_lengths(torch, gen, x_idx, x_valid, topk_length, batch,
                                                  s_q, x_slots)
        rows = torch.cat([rows, gather_rows(torch, x_values, x_idx, x_valid, xpbs)], dim=1)
        valid = torch.cat([valid, x_valid], dim=1)
        extra = (x_view, x_idx, x_tl)
    ref_out, ref_lse = reference(q.double(), rows, None, valid, spec.softmax_scale, Dv)
    del rows
    sink_tensor, big_sink = None, None
    if sink:
        # Around each head's mean lse, so that the sink moves out by O(1).
        fin = torch.isfinite(ref_lse)
        center = ref_lse.where(fin, torch.zeros_like(ref_lse)).sum(0) / fin.sum(0).clamp_min(1)
        values = center + 2 * torch.randn(H, generator=gen, device="cuda", dtype=torch.float64)
        values = place_specials(torch, gen, values, SINK_SPECIALS, 3 if H > 3 else 1)
        sink_tensor = values.to(torch.float32)
        s64 = sink_tensor.double()[None, :]
        factor = torch.where(torch.isfinite(ref_lse), 1 / (1 + torch.exp(s64 - ref_lse)),
                             torch.zeros_like(ref_lse))
        ref_out = ref_out * factor[..., None]  # ref_lse stays the attention's own
        big_sink = sink_tensor >= 1e4

    out = torch.full((T, H, Dv), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((T, H), float("nan"), device="cuda", dtype=torch.float32)
    # "auto" is the rule's own choice (the cluster entry where it takes it);
    # a forced count always runs split + combine.
    forced = {"1": 1, "max": mod.max_splits}.get(splits_mode)
    splits = forced if forced is not None else mod.auto_splits(T)
    # The kernel addresses slot s at (s / pbs) * page_stride + (s % pbs) * D.
    # With topk_length the tensors are [batch, s_q, ...] views (its shape
    # is read against them: one length per request needs s_q).
    call = (q, idx, out, lse)
    if tl_tensor is not None:
        call = (q.view(batch, s_q, H, D), idx.view(batch, s_q, K), out.view(batch, s_q, H, Dv),
                lse.view(batch, s_q, H))
        if extra is not None:
            extra = (extra[0], extra[1].view(batch, s_q, -1), extra[2])
    sel = launch(mod, call[0], kv_view, call[1], call[2], call[3] if spec.return_lse else None,
                 forced, tl_tensor, sink_tensor, extra)
    torch.cuda.synchronize()
    assert sel.num_splits == splits, (sel.num_splits, splits)
    assert forced is None or not sel.plan.cluster, "a forced split count took the cluster entry"

    o = out.double()
    nan = bool(torch.isnan(o).any()) or (spec.return_lse and bool(torch.isnan(lse).any()))
    err = float(torch.linalg.vector_norm(o - ref_out) / max(torch.linalg.vector_norm(ref_out), 1e-30))
    if spec.return_lse:
        fin = torch.isfinite(ref_lse)
        same_inf = bool(torch.equal(torch.isinf(lse.double()), ~fin))
        lerr = float(torch.linalg.vector_norm(lse.double()[fin] - ref_lse[fin]) /
                     max(torch.linalg.vector_norm(ref_lse[fin]), 1e-30))
        labs = float((lse.double()[fin] - ref_lse[fin]).abs().max()) if bool(fin.any()) else 0.0
        if not same_inf:
            lerr = labs = float("inf")
    else:
        lerr = labs = 0.0
    # lse: 1e-4 relative (norm) or 1e-3 absolute (the C++ suite's bar; with
    # a short topk_length an lse is about one logit, whose norm can be
    # small).
    lse_ok = lerr <= 1e-4 or labs <= 1e-3
    # Tokens with nothing attended (the all -1 one, a topk_length of 0):
    # out exactly 0.
    empty = ~valid.any(dim=1)
    empty_ok = bool((out[empty] == 0).all())
    # A +1e4 sink takes the whole softmax: out 0 for that head.
    sink_ok = big_sink is None or bool((o[:, big_sink].abs() <= 1e-30).all())
    ok = (not nan) and err <= 1e-2 and lse_ok and empty_ok and sink_ok
    return dict(T=T, splits=splits, err=err, lse_err=lerr, lse_abs=labs, nan=nan,
                empty_ok=empty_ok,
                sink_ok=sink_ok, ok=ok, small_batch=bool(sel.plan.small_batch),
                cluster=bool(sel.plan.cluster), topk_length=topk_length, sink=bool(sink),
                extra=extra is not None)


# The optional inputs' cases, at small batches (the path each takes is the
# same as without them; the split modes pick the combine or the main kernel
# to apply the sink): (topk_length, sink, (batch, s_q) shapes tried in turn
# over the split modes and modules). "mixed": per token or per request, in
# turn.
EXTRA_CASES = (
    ("token", False, ((1, 1), (5, 2), (16, 2), (3, 4))),
    ("request", False, ((3, 2), (8, 4), (2, 4), (16, 2))),
    (None, True, ((1, 1), (4, 2), (16, 2), (7, 1))),
    ("mixed", True, ((2, 2), (8, 4), (16, 1), (5, 2))),
)
SPLIT_MODES = (("1", False), ("auto", True), ("max", False))


def case_tag(r):
    """The optional inputs of a result row, for the table."""
    tags = ([f"len/{r['topk_length']}"] if r.get("topk_length") else []) + (
        ["sink"] if r.get("sink") else []) + (["extra-kv"] if r.get("extra") else [])
    return " ".join(tags)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("module_dir")
    # 1..8 (times s_q 1, 2, 4) covers every module's small-batch path
    # (SmallBatchPath: up to 32 tokens) and its edge; 16 (32 and 64 tokens)
    # the throughput tiling's 2-split cluster entry; 128 the throughput one.
    ap.add_argument("--batches", default="1,2,3,5,8,16,128")
    ap.add_argument("--no-extra", action="store_true",
                    help="skip the topk_length / sink cases")
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA GPU")
        return 0
    import kforge
    from kforge.kernel import module_cubins
    from kforge import kv_records
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows, failures = [], 0
    print(f"{'module':70s} {'tiling':>14s} {'B':>4s} {'T':>4s} {'spl':>4s} "
          f"{'out rel err':>11s} {'lse rel err':>11s}  result")
    for m_index, cubin in enumerate(module_cubins(args.module_dir)):
        mod = kforge.Kernel.from_files(cubin)
        def label(t):
            return f"h{t.head_tile}n{t.token_tile}w{t.warps}"
        # One kernel serves every s_q (MTP 1, 2, 4): batch * s_q query tokens.
        fp8 = any(d == FP8_DS_MLA or kv_records.record_name(d) is not None
                  for d in (mod.spec.kv_cache_dtype, mod.spec.extra_kv.kv_cache_dtype))
        cases = [(int(x), s, None, False) for x in args.batches.split(",") for s in (1, 2, 4)]
        runs = [(b, s_q, mode, gap, i, topk_length, sink)
                for i, (b, s_q, topk_length, sink) in enumerate(cases)
                for mode, gap in SPLIT_MODES]
        if not args.no_extra:
            for k, (topk_length, sink, shapes) in enumerate(EXTRA_CASES):
                for j, (mode, gap) in enumerate(SPLIT_MODES):
                    b, s_q = shapes[(j + m_index) % len(shapes)]
                    tl = topk_length
                    if tl == "mixed":
                        tl = "request" if (j + m_index) % 2 else "token"
                    runs.append((b, s_q, mode, gap, k + j + m_index, tl, sink))
        for b, s_q, mode, gap, i, topk_length, sink in runs:
            magnitude = FP8_MAGNITUDES[i % len(FP8_MAGNITUDES)] if fp8 else 1.0
            r = run_case(mod, b, s_q, mode, gen, gap, magnitude, topk_length, sink)
            r.update(magnitude=magnitude)
            # The path the selector took: the small-batch kernel ("s"), the
            # main one, or either's cluster entry ("c").
            small = mod.artifact.small_batch
            tiling = (label(small.tiling if r["small_batch"] else mod.artifact.tiling) +
                      ("c" if r["cluster"] else "s" if r["small_batch"] else ""))
            r.update(module=mod.module_name, tiling=tiling, batch=b, s_q=s_q)
            rows.append(r)
            failures += not r["ok"]
            tag = case_tag(r)
            print(f"{r['module']:70s} {tiling:>14s} {b:4d} {r['T']:4d} {r['splits']:4d} "
                  f"{r['err']:11.2e} {r['lse_err']:11.2e}  "
                  f"{'ok' if r['ok'] else 'FAIL'}{' NaN' if r['nan'] else ''}"
                  f"{'' if r['ok'] else ' lse abs %.2e' % r['lse_abs']}"
                  f"{'' if r['empty_ok'] else ' empty-row-not-zero'}"
                  f"{'' if r['sink_ok'] else ' sink-1e4-head-not-zero'}"
                  f"{'  ' + tag if tag else ''}", flush=True)
        del mod
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    for name, pick in (("topk_length / sink", lambda r: r["topk_length"] or r["sink"]),
                       ("extra KV cache", lambda r: r["extra"])):
        some = [r for r in rows if pick(r)]
        if some:
            print(f"{name} cases: {len(some)}, worst out rel err "
                  f"{max(r['err'] for r in some):.2e}, worst lse abs err "
                  f"{max(r['lse_abs'] for r in some):.2e}")
    print(f"{len(rows) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

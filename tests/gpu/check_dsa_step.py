#!/usr/bin/env python3
"""End-to-end DSA attention step from kforge kernels only: indexer logits ->
top-k -> slot ids -> sparse MLA decode, against an fp64 reference of the
whole step (docs/DESIGN.md; issue 16).

    python3 tests/gpu/check_dsa_step.py INDEXER_DIR MLA_DIR [--seed N]

INDEXER_DIR holds `kforge compile --kind dsa-indexer` modules, MLA_DIR bf16
sparse MLA modules (`kforge compile --preset glm-5 --tp 8`, `--preset
deepseek-v3.2`) for this GPU's arch; each MLA module is paired with the
indexer module of the same top-k (the model's: glm-5 TP8 -> 32 index heads,
deepseek-v3.2 TP1 -> 64). kforge.Kernel needs the package's native library
and message modules (tests/gpu/stage_binaries.sh).

Per step:
  positions  the kernel's top-k positions equal the fp64 reference's top-k
             of the fp64 logits, except positions whose reference logit is
             within 1e-6 (relative to the row's largest) of the k-th (fp32
             accumulation may swap near-ties); -1 padding the same
  output     sparse MLA out / lse over the kernel's slots within the bars
             of check_sparse_mla.py (out 1e-2 relative norm, lse 1e-4
             relative norm or 1e-3 absolute) of the fp64 attention over the
             fp64 keys of those slots; the slots themselves are checked
             against the block table
Both caches share the block table, as in vLLM (one page id, two caches).
Without a GPU it prints SKIP and exits 0.

Status: written after branch indexer's two H200 runs and not run yet; the
indexer half it calls passed tests/gpu/check_dsa_indexer.py there.
"""

import argparse
import glob
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(0)


try:
    import torch
except ImportError:
    skip("no PyTorch")
if not torch.cuda.is_available():
    skip("no CUDA GPU")

import kforge  # noqa: E402
from kforge import dsa_indexer as kdi  # noqa: E402


def arch_tag():
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}" + ("a" if major >= 9 else "")


def step_case(ix, mla, batch, s_q, lens, gen):
    """One step; returns (ok, message)."""
    dev = torch.device("cuda")
    k, hi = ix.topk_k, ix.heads
    spec = mla.spec
    H, Dv = spec.num_q_heads, spec.kv_lora_rank
    D = Dv + spec.rope_dim
    rows = batch * s_q
    max_context = max(lens)
    ppr = (max_context + 63) // 64
    num_pages = batch * ppr + 2
    table = torch.randperm(num_pages, generator=gen)[:batch * ppr].view(batch, ppr).to(torch.int32)

    # Index-key cache: e4m3 keys with per-token scales (the models' writer).
    index_cache = torch.zeros(num_pages, kdi.PAGE_BYTES, dtype=torch.uint8)
    keys8, key_scales = [], []
    for b in range(batch):
        values, scales = kdi.quantize_index_keys(torch.randn(lens[b], 128, generator=gen))
        keys8.append(values)
        key_scales.append(scales)
        for pg in range((lens[b] + 63) // 64):
            lo, hi_ = pg * 64, min(lens[b], pg * 64 + 64)
            page = int(table[b, pg])
            index_cache[page, :64 * 128].view(64, 128)[:hi_ - lo] = values[lo:hi_]
            index_cache[page, 64 * 128:].view(torch.float32)[:hi_ - lo] = scales[lo:hi_]
    q_idx = (torch.randn(rows, hi, 128, generator=gen) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(rows, hi, generator=gen) * 0.1
    kv = torch.randn(num_pages, 64, D, generator=gen).to(torch.bfloat16)
    q = torch.randn(rows, H, D, generator=gen).to(torch.bfloat16)
    ctx = torch.tensor(lens, dtype=torch.int32)

    # kforge: indexer -> top-k -> slots -> sparse MLA decode.
    tab_d, ctx_d = table.to(dev), ctx.to(dev)
    idx, slots = kdi.dsa_indexer_topk(ix, q_idx.to(dev), w.to(dev), index_cache.to(dev), tab_d,
                                      ctx_d, max_context=max_context, mla_block_table=tab_d)
    out = torch.full((rows, H, Dv), float("nan"), dtype=torch.bfloat16, device=dev)
    lse = torch.full((rows, H), float("nan"), dtype=torch.float32, device=dev)
    mla(q.to(dev), kv.to(dev), slots, out, lse if spec.return_lse else None)
    torch.cuda.synchronize()
    idx, slots, out, lse = idx.cpu(), slots.cpu(), out.cpu().double(), lse.cpu().double()

    # fp64 reference: logits, top-k, slots, attention.
    qd, wd = q_idx.float().double(), w.double()
    problems = []
    for b in range(batch):
        kd = keys8[b].view(torch.float8_e4m3fn).float().double()
        sd = key_scales[b].double()
        for i in range(s_q):
            r = b * s_q + i
            n = min(lens[b], max(0, lens[b] - s_q + i + 1))
            m = min(n, k)
            got = idx[r]
            if (got[m:] != -1).any() or (slots[r, m:] != -1).any():
                problems.append(f"row {r}: not -1 after {m}")
                continue
            if m == 0:
                continue
            logits = (wd[r][:, None] * torch.relu(qd[r] @ kd[:n].T)).sum(0) * sd[:n]
            ref = torch.topk(logits, m).indices
            kth = logits[ref[-1]]
            near = 1e-6 * float(logits.abs().max())
            diff = set(got[:m].tolist()) ^ set(ref.tolist())
            if any(p < 0 or p >= n or abs(float(logits[p] - kth)) > near for p in diff):
                problems.append(f"row {r}: positions differ beyond near-ties ({len(diff)})")
            pos = got[:m].long()
            want = table[b, pos // 64].long() * 64 + pos % 64
            if not torch.equal(slots[r, :m].long(), want):
                problems.append(f"row {r}: slots wrong")
    # Attention over the kernel's slots, fp64 (check_sparse_mla.py's
    # reference).
    valid = slots >= 0
    safe = torch.where(valid, slots, torch.zeros_like(slots)).long()
    kv_rows = kv.double()[safe // 64, safe % 64] * valid[..., None]
    s = torch.einsum("thd,tkd->thk", q.double(), kv_rows) * spec.softmax_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    ref_lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - ref_lse[..., None]), nan=0.0)
    ref_out = torch.einsum("thk,tkd->thd", p, kv_rows[..., :Dv])
    err = float(torch.linalg.vector_norm(out - ref_out) /
                max(float(torch.linalg.vector_norm(ref_out)), 1e-30))
    if torch.isnan(out).any() or err > 1e-2:
        problems.append(f"out rel err {err:.3g}")
    if spec.return_lse:
        fin = torch.isfinite(ref_lse)
        lerr = float(torch.linalg.vector_norm(lse[fin] - ref_lse[fin]) /
                     max(float(torch.linalg.vector_norm(ref_lse[fin])), 1e-30))
        labs = float((lse[fin] - ref_lse[fin]).abs().max()) if bool(fin.any()) else 0.0
        if not (lerr <= 1e-4 or labs <= 1e-3):
            problems.append(f"lse rel err {lerr:.3g}, abs {labs:.3g}")
    return not problems, f"out rel err {err:.2e}" + ("; " + "; ".join(problems[:5])
                                                      if problems else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("indexer_dir")
    ap.add_argument("mla_dir")
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(2), "little"))
    args = ap.parse_args()
    tag = arch_tag()
    indexers = [kdi.DsaIndexer.from_files(p) for p in
                sorted(glob.glob(os.path.join(args.indexer_dir, f"dsa_indexer_*_{tag}.cubin")))]
    # The step attends one cache: modules built with an extra cache (their
    # names carry "_xtopk") take a second one and are not this step's.
    mlas = sorted(p for p in glob.glob(os.path.join(args.mla_dir,
                                                    f"sparse_mla_decode_*bf16*_{tag}.cubin"))
                  if "_xtopk" not in os.path.basename(p))
    if not indexers or not mlas:
        print(f"no modules for {tag}: {len(indexers)} indexer, {len(mlas)} sparse MLA")
        return 1
    gen = torch.Generator().manual_seed(args.seed)
    print(f"{torch.cuda.get_device_name()}  seed {args.seed}")
    total = failed = 0
    for path in mlas:
        mla = kforge.Kernel.from_files(path)
        # The model's indexer: glm-5 (64 heads / TP) pairs with 32 index
        # heads, deepseek-v3.2 (128 / TP) with 64; same top-k.
        want_heads = 32 if math.isclose(mla.spec.softmax_scale, 0.0625) else 64
        ix = next((x for x in indexers
                   if x.topk_k == mla.spec.topk and x.heads == want_heads), None)
        if ix is None:
            print(f"skip {os.path.basename(path)}: no indexer with {want_heads} heads, "
                  f"top-k {mla.spec.topk}")
            continue
        for batch, s_q, lens in ((1, 1, [1]), (2, 1, [100, 5000]), (3, 2, [2, 2049, 3000]),
                                 (2, 4, [4, 9000])):
            ok, message = step_case(ix, mla, batch, s_q, lens, gen)
            total += 1
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {ix.module_name} + {mla.module_name}: "
                  f"batch {batch} s_q {s_q} lens {lens}: {message}")
    print(f"dsa step: {total - failed}/{total} passed")
    return 0 if failed == 0 and total > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

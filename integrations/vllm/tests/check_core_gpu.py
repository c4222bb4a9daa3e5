#!/usr/bin/env python3
"""GPU check of kforge-vllm's kernel-calling core (kforge_vllm.core) on
vLLM-layout inputs, against the fp64 reference (tests/gpu/check_sparse_mla.py).
Needs no vLLM: the core imports none, and vLLM cannot be carried to the GPU
host.

For a GLM-5 TP8 shape (8 heads, scale 0.0625) and a DeepSeek-V3.2 TP1 shape
(128 heads, scale 0.135234), each with a bf16 cache, an fp8_ds_mla cache
(656-byte records, arbitrary scales as vLLM writes them) and an nvfp4_ds_mla
cache (352-byte records, kforge.kv_records' quantizer):
  - the cache is one layer's view of an allocation holding three layers
    with their blocks interleaved (vLLM's block-outermost layout: the block
    stride is three pages), [num_blocks, 64, row], squeezed as the MLA
    layer hands it over;
  - a batch of decode (1 token), MTP verification (2, 3, 4 tokens) and
    prefill (37 tokens after 500 cached) requests, block tables of random
    blocks, the indexer's top-k positions (a random subset of each token's
    causal prefix, -1 padded and with -1 holes; one token with nothing to
    attend to), q as the (latent, rope) pair;
  - the slots and valid counts vLLM's conversion hands the backend
    (vllm_slots: vLLM's numbering, block * block_stride_rows + offset,
    valid ones first), passed with the counts as kforge's topk_length;
  - eager: out within 1e-2 (max |err| / max |ref|) of the reference (which
    reads each position's row through the block table), zero for the
    empty token;
  - graph: slots + attention captured in one CUDA graph after prefetch()
    and a warm-up, replayed on fresh inputs copied into the captured
    tensors: the same bits as an eager call on them;
  - lse (what vLLM asks for under decode context parallelism): a core
    built with return_lse, called with return_lse, gives the same out and
    the reference's lse (natural log, [tokens, heads]; -inf for the empty
    token) over the values the kernel multiplies (a quantized cache
    dequantized and rounded once to bf16), within e2e_python's LSE_BAR;
  - dcp: the batch's positions split between two DCP ranks as vLLM
    shards them (position p on rank p % 2, interleave 1; vllm_slots of
    each rank's positions only), each rank's (out, lse) from kforge, merged
    as vLLM merges them (lse = log sum_r exp(lse_r), out = sum_r
    exp(lse_r - lse) out_r): the full attention, within the out bar; a
    rank with none of a token's positions gives it out 0 and lse -inf.

Usage: check_core_gpu.py PATH/TO/kforge [--lib-dir DIR] | --bundle DIR
Prints one line per check and "N passed, N failed"; exit 1 on a failure.
Skips (prints SKIP, exit 0) without PyTorch or a CUDA GPU.
"""

import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..", "..", "..")
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
sys.path.insert(0, os.path.join(HERE, ".."))

import e2e_python  # noqa: E402  (tests/gpu: kernel sources, skip rules, the error bar)

SHAPES = (("glm-5 tp8", 8, 0.0625), ("deepseek-v3.2 tp1", 128, 0.135234))
CACHE_DTYPES = ("auto", "fp8_ds_mla", "nvfp4_ds_mla")
PAGE, TOPK, RANK, ROPE = 64, 2048, 512, 64
QUERY_LENS = (1, 1, 2, 3, 4, 1, 37)  # decodes, MTP verifications, a prefill chunk
CONTEXT = (900, 3000, 64, 2100, 130, 1, 500)  # cached tokens before each request's queries
NUM_LAYERS, LAYER = 3, 1  # the cache view is layer 1 of 3 interleaved layers


DCP_RANKS = 2  # the dcp check's simulated decode-context-parallel ranks


class Batch:
    """One step's vLLM-layout inputs (all on the GPU)."""

    def __init__(self, torch, gen, heads, cache_dtype, num_blocks):
        import kforge
        dev = "cuda"
        self.seq_lens = [c + q for c, q in zip(CONTEXT, QUERY_LENS)]
        tokens = sum(QUERY_LENS)
        # Block tables: distinct random blocks per request, padded with 0.
        max_blocks = max(math.ceil(s / PAGE) for s in self.seq_lens) + 2
        perm = torch.randperm(num_blocks, generator=gen, device=dev).to(torch.int32)
        self.block_table = torch.zeros(len(QUERY_LENS), max_blocks, dtype=torch.int32, device=dev)
        used = 0
        for r, s in enumerate(self.seq_lens):
            n = math.ceil(s / PAGE)
            self.block_table[r, :n] = perm[used:used + n]
            used += n
        self.req_id = torch.tensor([r for r, q in enumerate(QUERY_LENS) for _ in range(q)],
                                   dtype=torch.int32, device=dev)
        positions = [c + i for c, q in zip(CONTEXT, QUERY_LENS) for i in range(q)]
        # The indexer's buffer, top-k wide (vLLM converts every column).
        self.topk = torch.full((tokens, TOPK), -1, dtype=torch.int32, device=dev)
        for t, pos in enumerate(positions):
            n = min(pos + 1, TOPK)
            self.topk[t, :n] = torch.randperm(pos + 1, generator=gen, device=dev)[:n]
            # -1 holes among the valid ones, as the indexer pads short rows
            holes = torch.rand(n, generator=gen, device=dev) < 0.05
            self.topk[t, :n] = torch.where(holes, -1, self.topk[t, :n])
        self.topk[tokens // 2, :TOPK] = -1  # a token with nothing to attend to
        self.q_latent = torch.randn(tokens, heads, RANK, generator=gen, device=dev).bfloat16()
        self.q_rope = torch.randn(tokens, heads, ROPE, generator=gen, device=dev).bfloat16()
        # The layer's cache: rows of 576 bf16 (or 656-byte fp8_ds_mla
        # records) in a 3-layer block-interleaved allocation.
        values = (torch.randn(num_blocks, PAGE, RANK + ROPE, generator=gen, device=dev)
                  .bfloat16())
        # values: the cache's values (fp8: exact); kernel_values: the ones
        # the kernel multiplies (dequantized in fp32, rounded once to bf16,
        # as FlashMLA and kforge's kv_format.cuh do), which the lse is
        # checked against: exact fp8 values miss that 2^-9 rounding, worth
        # 1e-3 of the lse at DeepSeek-V3.2's scale.
        if cache_dtype == "fp8_ds_mla":
            content = kforge.quantize_fp8_ds_mla(values, "arbitrary")
            self.values = kforge.dequantize_fp8_ds_mla(content)
            self.kernel_values = kforge.dequantize_fp8_ds_mla(
                content, torch.float32).bfloat16().double()
        elif cache_dtype == "nvfp4_ds_mla":
            from kforge import kv_records
            content = kv_records.quantize_kv_records(values, "nvfp4_ds_mla")
            self.values = kv_records.bf16_dequantize_kv_records(content, "nvfp4_ds_mla")
            self.kernel_values = self.values
        else:
            content, self.values, self.kernel_values = values, values, values
        row = content.shape[-1]
        page_elems = PAGE * row
        storage = torch.full((num_blocks * NUM_LAYERS * page_elems,), 0xFF if content.dtype ==
                             torch.uint8 else float("nan"), dtype=content.dtype, device=dev)
        self.kv_cache = storage.as_strided((num_blocks, PAGE, row),
                                           (NUM_LAYERS * page_elems, row, 1),
                                           LAYER * page_elems)
        self.kv_cache.copy_(content)

    def copy_into(self, other):
        """Copies this batch's inputs into `other`'s tensors (graph replay)."""
        for name in ("block_table", "req_id", "topk", "q_latent", "q_rope", "kv_cache"):
            getattr(other, name).copy_(getattr(self, name))

    def reference_slots(self, torch):
        """Rows of self.values (contiguous, not the cache) by position."""
        topk = self.topk.tolist()
        table = self.block_table.tolist()
        rows = []
        for t, r in enumerate(self.req_id.tolist()):
            rows.append([-1 if p < 0 else table[r][p // PAGE] * PAGE + p % PAGE for p in topk[t]])
        return torch.tensor(rows, dtype=torch.int32, device="cuda")

    def reference_out(self, torch, reference, slots, scale):
        return self.reference_out_lse(torch, reference, slots, scale, self.values)[0]

    def reference_out_lse(self, torch, reference, slots, scale, values=None):
        """(out, lse) of the fp64 reference (lse natural log, -inf where
        nothing is valid) over `values` (default: kernel_values)."""
        values = self.kernel_values if values is None else values
        flat = values.reshape(-1, RANK + ROPE)
        valid = slots >= 0
        rows = flat[torch.where(valid, slots, 0).long()].double() * valid[..., None]
        q = torch.cat([self.q_latent, self.q_rope], -1).double()
        return reference(q, rows, slots, valid, scale, RANK)

    def on_rank(self, torch, rank, ranks):
        """This batch as DCP rank `rank` of `ranks` sees it through vLLM's
        conversion: only the top-k positions the rank holds (p % ranks ==
        rank) stay; the cache and everything else are shared."""
        import copy
        view = copy.copy(self)
        view.topk = torch.where((self.topk >= 0) & (self.topk % ranks == rank), self.topk, -1)
        return view


def vllm_slots(torch, b):
    """What vLLM 0.33's conversion (sparse_utils.
    triton_convert_req_index_to_global_index, return_valid_counts) hands the
    backend for batch `b`: slots block * block_stride_rows + offset (the
    block stride of b.kv_cache, NUM_LAYERS pages, in rows), -1 for -1 or a
    block past the table, the valid ones compacted to the front in order;
    and their count per token. Torch ops with no host sync (capturable)."""
    pos = b.topk.clamp(min=0)
    column = torch.div(pos, PAGE, rounding_mode="floor")
    valid = (b.topk >= 0) & (column < b.block_table.shape[1])
    column = column.clamp(max=b.block_table.shape[1] - 1)
    blocks = b.block_table[b.req_id.long().unsqueeze(1).expand_as(column), column.long()]
    stride_rows = b.kv_cache.stride(0) // b.kv_cache.shape[2]
    slots = torch.where(valid, blocks * stride_rows + pos.remainder(PAGE), -1)
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    return slots.gather(1, order).to(torch.int32), valid.sum(1, dtype=torch.int32)


def check_shape(torch, reference, gen, name, heads, scale, cache_dtype, results):
    from kforge_vllm import core

    def record(what, problems):
        results.append(problems)
        label = f"{name} {cache_dtype}"
        print(f"{label:32s} {what:8s} {'FAIL: ' + '; '.join(problems) if problems else 'ok'}",
              flush=True)

    spec = core.attention_spec(num_heads=heads, kv_lora_rank=RANK, rope_dim=ROPE, topk=TOPK,
                               page_size=PAGE, softmax_scale=scale, cache_dtype=cache_dtype)
    attention = core.SparseMlaCore(spec)
    attention.prefetch()
    num_blocks = sum(math.ceil((c + q) / PAGE) for c, q in zip(CONTEXT, QUERY_LENS)) + 16

    def step(b):
        slots, counts = vllm_slots(torch, b)
        return slots, attention((b.q_latent, b.q_rope), b.kv_cache, slots, topk_length=counts)

    # Eager, against the reference.
    problems = []
    b = Batch(torch, gen, heads, cache_dtype, num_blocks)
    _, out = step(b)
    torch.cuda.synchronize()
    want = b.reference_out(torch, reference, b.reference_slots(torch), scale)
    o = out.double()
    if torch.isnan(o).any():
        problems.append("NaN in out")
    err = float((o - want).abs().max() / want.abs().max())
    if err > e2e_python.OUT_BAR:
        problems.append(f"out error {err:.2e} > {e2e_python.OUT_BAR}")
    empty = sum(QUERY_LENS) // 2
    if not bool((out[empty] == 0).all()):
        problems.append("the token with no valid position has a nonzero output")
    record("eager", problems)
    if not problems:
        print(f"{'':32s} out error {err:.2e}", flush=True)

    # A captured CUDA graph replayed on fresh inputs.
    problems = []
    try:
        static = Batch(torch, gen, heads, cache_dtype, num_blocks)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g_slots, g_out = step(static)
        for _ in range(2):
            fresh = Batch(torch, gen, heads, cache_dtype, num_blocks)
            fresh.copy_into(static)
            g_out.fill_(float("nan"))
            graph.replay()
            want_slots, want_out = step(fresh)
            torch.cuda.synchronize()
            if not torch.equal(g_slots, want_slots):
                problems.append("replayed slots differ from eager")
            if not torch.equal(g_out, want_out):
                problems.append("replayed out differs from eager")
    except Exception as e:  # capture errors name the call that broke it
        problems.append(f"{type(e).__name__}: {e}")
    record("graph", problems)

    # The lse, as vLLM asks for it under DCP, and two DCP ranks merged by it.
    lse_spec = core.attention_spec(num_heads=heads, kv_lora_rank=RANK, rope_dim=ROPE,
                                   topk=TOPK, page_size=PAGE, softmax_scale=scale,
                                   cache_dtype=cache_dtype, return_lse=True)
    with_lse = core.SparseMlaCore(lse_spec)
    with_lse.prefetch()
    lse_bar = e2e_python.LSE_BAR  # against kernel_values: no dequantization error left

    def call_lse(view):
        slots, counts = vllm_slots(torch, view)
        return with_lse((view.q_latent, view.q_rope), view.kv_cache, slots, topk_length=counts,
                        return_lse=True)

    problems = []
    out, lse = call_lse(b)
    torch.cuda.synchronize()
    want_out, want_lse = b.reference_out_lse(torch, reference, b.reference_slots(torch), scale)
    if tuple(lse.shape) != (sum(QUERY_LENS), heads) or lse.dtype != torch.float32:
        problems.append(f"lse: {lse.dtype} {list(lse.shape)}, expected float32 "
                        f"[{sum(QUERY_LENS)}, {heads}]")
    else:
        problems += lse_problems(torch, out, lse, want_out, want_lse, lse_bar)
    record("lse", problems)

    problems = []
    parts = [call_lse(b.on_rank(torch, r, DCP_RANKS)) for r in range(DCP_RANKS)]
    torch.cuda.synchronize()
    lses = torch.stack([l.double() for _, l in parts])
    merged_lse = torch.logsumexp(lses, 0)
    weights = torch.exp(lses - merged_lse).nan_to_num(0.0)  # all -inf: nothing anywhere
    merged = sum(w[..., None] * o.double() for w, (o, _) in zip(weights, parts))
    problems += lse_problems(torch, merged, merged_lse, want_out, want_lse, lse_bar)
    for r, (o, l) in enumerate(parts):
        none_here = ~((b.on_rank(torch, r, DCP_RANKS).topk >= 0).any(1))
        if none_here.any() and not (bool((o[none_here] == 0).all()) and
                                    bool((l[none_here] == float("-inf")).all())):
            problems.append(f"rank {r}: a token with nothing on it is not (0, -inf)")
    record("dcp", problems)


def lse_problems(torch, out, lse, want_out, want_lse, lse_bar):
    """out and lse against the reference's: NaN, the out bar, -inf exactly
    where the reference's is, and the lse bar (max abs error over max |lse|
    on the finite rows, as e2e_python measures it)."""
    problems = []
    o, l = out.double(), lse.double()
    if torch.isnan(o).any() or torch.isnan(l).any():
        problems.append("NaN")
    err = float((o - want_out).abs().max() / want_out.abs().max())
    if err > e2e_python.OUT_BAR:
        problems.append(f"out error {err:.2e} > {e2e_python.OUT_BAR}")
    finite = torch.isfinite(want_lse)
    if not torch.equal(torch.isfinite(l), finite):
        problems.append("lse finite where the reference's is not (or the reverse)")
    elif finite.any():
        lse_err = float((l[finite] - want_lse[finite]).abs().max() /
                        want_lse[finite].abs().max())
        if lse_err > lse_bar:
            problems.append(f"lse error {lse_err:.2e} > {lse_bar}")
    return problems


def checks(torch, source, gen, reference):
    print(f"source: {source!r}, device: {torch.cuda.get_device_name()}", flush=True)
    results = []
    for name, heads, scale in SHAPES:
        for cache_dtype in CACHE_DTYPES:
            try:
                check_shape(torch, reference, gen, name, heads, scale, cache_dtype, results)
            except Exception as e:
                results.append([f"{type(e).__name__}: {e}"])
                print(f"{name} {cache_dtype}: FAIL: {type(e).__name__}: {e}", flush=True)
    return results


def main():
    return e2e_python.run_gpu_check(__doc__.splitlines()[0], "kforge_vllm_core_", checks)


if __name__ == "__main__":
    sys.exit(main())

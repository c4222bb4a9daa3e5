#!/usr/bin/env python3
"""GPU check of kforge's PyTorch op (kforge::sparse_mla_decode) and of the
eager call's plan cache.

For GLM-5 TP8 (8 heads) at batch 1, 32 and 128 and DeepSeek-V3.2 TP1 (128
heads) at batch 4, on fresh random inputs (e2e_python.make_inputs: a paged
cache with a gap between pages, -1 and duplicate indices, a token with
nothing to attend to):
  - opcheck: the op's schema (what it mutates) and fake implementation
    (torch.library.opcheck, test_schema and test_faketensor);
  - compiled: torch.compile(fullgraph=True) of a function calling the
    decoder (returning out and lse, and writing a given out=) gives the same
    bits as the eager call, with no graph break (torch._dynamo.explain);
  - graph: the eager call captured in a CUDA graph after prefetch() and
    warm-up replays correctly on fresh inputs copied into the captured
    tensors (the same bits as an eager call on them, and the fp64
    reference's bars);
  - compiled graph: torch.compile(mode="reduce-overhead", fullgraph=True)
    on fresh inputs equals eager;
  - topk_length + sink: the op's optional inputs through opcheck and
    torch.compile(fullgraph=True), one graph, the same bits as eager, and
    eager itself against the call without them (indices past each length
    set to -1; out / (1 + exp(sink - lse)), lse unchanged);
  - cache: eager calls with the same signature at new addresses plan once;
    a changed signature plans again, and the results match the reference.

Usage: check_torch_op.py PATH/TO/kforge [--lib-dir DIR] | --bundle DIR
Prints one line per check and "N passed, N failed"; exit 1 on a failure.
Skips (prints SKIP, exit 0) without PyTorch or a CUDA GPU.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

CASES = (("glm-5", 8, (1, 32, 128)), ("deepseek-v3.2", 1, (4,)))


def fresh(torch, gen, batch, spec):
    import e2e_python
    return e2e_python.make_inputs(torch, gen, batch, spec.num_q_heads, spec, four_dim=False)


def optional_inputs(torch, gen, batch, spec):
    """topk_length [batch] (one per request, s_q 1) in 0..topk with a 0, a
    topk and one past it; sink [heads] around a typical lse, a -inf among
    them."""
    tl = torch.randint(0, spec.topk + 1, (batch,), generator=gen, device="cuda",
                       dtype=torch.int32)
    tl[0] = spec.topk + 5
    if batch > 2:
        tl[1], tl[2] = 0, spec.topk
    sink = 8 + 2 * torch.randn(spec.num_q_heads, generator=gen, device="cuda")
    sink[-1] = float("-inf")
    return tl, sink


def check_case(torch, kforge, reference, gen, decoder, batch, results):
    import e2e_python
    spec = decoder.spec
    name = f"{spec.num_q_heads} heads batch {batch}"

    def record(what, problems):
        results.append((f"{name}: {what}", problems))
        print(f"{name:22s} {what:14s} {'FAIL: ' + '; '.join(problems) if problems else 'ok'}",
              flush=True)

    def bars(q, kv, idx, out, lse):
        return e2e_python.compare(torch, reference, q, kv, idx, out, lse, spec.softmax_scale,
                                  spec.kv_lora_rank)[2]

    q, kv, idx = fresh(torch, gen, batch, spec)

    # opcheck: schema (mutation of out and lse declared) and fake tensors.
    problems = []
    out = torch.empty(batch, 1, spec.num_q_heads, spec.kv_lora_rank, device="cuda",
                      dtype=torch.bfloat16)
    lse = torch.empty(batch, 1, spec.num_q_heads, device="cuda", dtype=torch.float32)
    try:
        scale = float(spec.softmax_scale)
        tl, sink = optional_inputs(torch, gen, batch, spec)
        for extra in ((None, None), (tl, sink)):
            torch.library.opcheck(torch.ops.kforge.sparse_mla_decode.default,
                                  (q, kv, idx, out, lse, *extra, None, None, None, scale,
                                   decoder._op_id),
                                  test_utils=("test_schema", "test_faketensor"))
    except Exception as e:  # opcheck raises OpCheckError with the reason
        problems.append(f"{type(e).__name__}: {e}")
    record("opcheck", problems)

    # Compiled vs eager: identical bits, one graph.
    def fn(q, kv, idx):
        return decoder(q, kv, idx, return_lse=True)

    def fn_out(q, kv, idx, out):
        decoder(q, kv, idx, out=out)
        return out

    problems = []
    try:
        torch._dynamo.reset()
        explain = torch._dynamo.explain(fn)(q, kv, idx)
        if explain.graph_break_count or explain.graph_count != 1:
            problems.append(f"{explain.graph_count} graphs, {explain.graph_break_count} breaks: "
                            f"{explain.break_reasons}")
        compiled = torch.compile(fn, fullgraph=True)
        compiled_out = torch.compile(fn_out, fullgraph=True)
        for _ in range(2):  # fresh inputs each time, same compiled code
            q, kv, idx = fresh(torch, gen, batch, spec)
            want_out, want_lse = decoder(q, kv, idx, return_lse=True)
            got_out, got_lse = compiled(q, kv, idx)
            if not torch.equal(got_out, want_out) or not torch.equal(got_lse, want_lse):
                problems.append("compiled out/lse differ from eager")
            out = torch.full_like(want_out, float("nan"))
            compiled_out(q, kv, idx, out)
            if not torch.equal(out, want_out):
                problems.append("compiled out= call wrote other values than eager")
            problems += bars(q, kv, idx, want_out, want_lse)
    except Exception as e:
        problems.append(f"{type(e).__name__}: {e}")
    record("compiled", problems)

    # CUDA graph of the eager call, after prefetch and warm-up.
    problems = []
    try:
        q, kv, idx = fresh(torch, gen, batch, spec)
        out = torch.empty(batch, 1, spec.num_q_heads, spec.kv_lora_rank, device="cuda",
                          dtype=torch.bfloat16)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                decoder(q, kv, idx, return_lse=True, out=out)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _, lse = decoder(q, kv, idx, return_lse=True, out=out)
        for replay in range(3):
            q2, kv2, idx2 = fresh(torch, gen, batch, spec)
            q.copy_(q2), kv.copy_(kv2), idx.copy_(idx2)
            out.fill_(float("nan")), lse.fill_(float("nan"))
            graph.replay()
            want_out, want_lse = decoder(q2, kv2, idx2, return_lse=True)
            torch.cuda.synchronize()
            if not torch.equal(out, want_out) or not torch.equal(lse, want_lse):
                problems.append(f"replay {replay}: differs from eager on the same inputs")
            problems += [f"replay {replay}: {p}" for p in bars(q, kv, idx, out, lse)]
    except Exception as e:
        problems.append(f"{type(e).__name__}: {e}")
    record("graph", problems)

    # torch.compile's CUDA graphs.
    problems = []
    try:
        torch._dynamo.reset()
        graphed = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
        for _ in range(4):  # the first calls record, later ones replay
            q, kv, idx = fresh(torch, gen, batch, spec)
            got_out, got_lse = graphed(q, kv, idx)
            got_out, got_lse = got_out.clone(), got_lse.clone()
            want_out, want_lse = decoder(q, kv, idx, return_lse=True)
            torch.cuda.synchronize()
            if not torch.equal(got_out, want_out) or not torch.equal(got_lse, want_lse):
                problems.append("reduce-overhead differs from eager")
    except Exception as e:
        problems.append(f"{type(e).__name__}: {e}")
    record("compiled graph", problems)

    # topk_length and sink through the op: compiled equals eager (one
    # graph), and eager does what they mean.
    def fn_opt(q, kv, idx, tl, sink):
        return decoder(q, kv, idx, return_lse=True, topk_length=tl, sink=sink)

    problems = []
    try:
        torch._dynamo.reset()
        q, kv, idx = fresh(torch, gen, batch, spec)
        tl, sink = optional_inputs(torch, gen, batch, spec)
        explain = torch._dynamo.explain(fn_opt)(q, kv, idx, tl, sink)
        if explain.graph_break_count or explain.graph_count != 1:
            problems.append(f"{explain.graph_count} graphs, {explain.graph_break_count} breaks: "
                            f"{explain.break_reasons}")
        compiled = torch.compile(fn_opt, fullgraph=True)
        for _ in range(2):
            q, kv, idx = fresh(torch, gen, batch, spec)
            tl, sink = optional_inputs(torch, gen, batch, spec)
            want_out, want_lse = fn_opt(q, kv, idx, tl, sink)
            got_out, got_lse = compiled(q, kv, idx, tl, sink)
            if not torch.equal(got_out, want_out) or not torch.equal(got_lse, want_lse):
                problems.append("compiled out/lse with topk_length and sink differ from eager")
            # The same call spelled without them.
            past = (torch.arange(spec.topk, device="cuda")[None, None, :] >=
                    tl.clamp(0, spec.topk)[:, None, None])
            plain_out, plain_lse = decoder(q, kv, idx.masked_fill(past, -1), return_lse=True)
            torch.cuda.synchronize()
            fin = torch.isfinite(plain_lse)
            if not torch.equal(torch.isfinite(want_lse), fin):
                problems.append("lse finite where the call without topk_length is not")
            elif fin.any():
                lse_err = float((want_lse[fin] - plain_lse[fin]).abs().max() /
                                plain_lse[fin].abs().max())
                if lse_err > 1e-5:
                    problems.append(f"lse with topk_length and sink off by {lse_err:.2e}")
            l64 = plain_lse.double()
            factor = torch.where(fin, 1 / (1 + torch.exp(sink.double() - l64)),
                                 torch.zeros_like(l64))
            ref = plain_out.double() * factor[..., None]
            out_err = float((want_out.double() - ref).abs().max() /
                            ref.abs().max().clamp_min(1e-30))
            if out_err > 1e-2:
                problems.append(f"out with topk_length and sink off by {out_err:.2e}")
    except Exception as e:
        problems.append(f"{type(e).__name__}: {e}")
    record("len + sink", problems)

    # The plan cache: one plan per signature, correct results on each.
    problems = []
    cache = decoder._plans
    q, kv, idx = fresh(torch, gen, batch, spec)
    decoder(q, kv, idx, return_lse=True)
    before = cache.misses
    for _ in range(3):
        q, kv, idx = fresh(torch, gen, batch, spec)
        out, lse = decoder(q, kv, idx, return_lse=True)
        problems += bars(q, kv, idx, out, lse)
    if cache.misses != before:
        problems.append(f"{cache.misses - before} plans for one signature")
    # A changed signature: out with padded rows (head stride d_v + 8).
    padded = torch.empty(batch, 1, spec.num_q_heads, spec.kv_lora_rank + 8, device="cuda",
                         dtype=torch.bfloat16)[..., :spec.kv_lora_rank]
    decoder(q, kv, idx, out=padded)
    if cache.misses != before + 1:
        problems.append("a new out stride did not plan again")
    want = decoder(q, kv, idx)
    torch.cuda.synchronize()
    if not torch.equal(padded, want):
        problems.append("padded out differs from a contiguous one")
    record("plan cache", problems)


def extra_cache_case(torch, kforge, reference, gen, source, batch, results):
    """A spec with an extra KV cache (GLM-5 TP8, bf16, 128 extra indices,
    pages of 16): opcheck with the three extra tensors, compiled
    (fullgraph, one graph) equals eager, eager matches the fp64 reference
    of the top-k and the extra rows in one softmax, and extra_topk_length
    0 everywhere equals the call without the extra list's rows."""
    import e2e_python
    base = kforge.SparseMlaDecoder(source, preset="glm-5", tp=8).spec
    spec = type(base)()
    spec.CopyFrom(base)
    spec.extra_kv.kv_cache_dtype = spec.kv_cache_dtype
    spec.extra_kv.topk = 128
    spec.extra_kv.page_block_size = 16
    decoder = kforge.SparseMlaDecoder(source, spec=spec)
    decoder.prefetch()
    name = f"extra cache batch {batch}"
    problems = []

    def inputs():
        q, kv, idx = fresh(torch, gen, batch, spec)
        x_spec = type(spec)()
        x_spec.CopyFrom(spec)
        x_spec.topk, x_spec.page_block_size = 128, 16
        _, x_kv, x_idx = e2e_python.make_inputs(torch, gen, batch, spec.num_q_heads, x_spec,
                                                four_dim=False)
        return q, kv, idx, x_kv, x_idx

    def fn(q, kv, idx, x_kv, x_idx, x_len):
        return decoder(q, kv, idx, return_lse=True, extra_kv_cache=x_kv, extra_indices=x_idx,
                       extra_topk_length=x_len)

    try:
        q, kv, idx, x_kv, x_idx = inputs()
        out = torch.empty(batch, 1, spec.num_q_heads, spec.kv_lora_rank, device="cuda",
                          dtype=torch.bfloat16)
        lse = torch.empty(batch, 1, spec.num_q_heads, device="cuda", dtype=torch.float32)
        x_len = torch.full((batch,), 100, dtype=torch.int32, device="cuda")
        torch.library.opcheck(torch.ops.kforge.sparse_mla_decode.default,
                              (q, kv, idx, out, lse, None, None, x_kv, x_idx, x_len,
                               float(spec.softmax_scale), decoder._op_id),
                              test_utils=("test_schema", "test_faketensor"))
        torch._dynamo.reset()
        explain = torch._dynamo.explain(fn)(q, kv, idx, x_kv, x_idx, None)
        if explain.graph_break_count or explain.graph_count != 1:
            problems.append(f"{explain.graph_count} graphs, {explain.graph_break_count} breaks")
        compiled = torch.compile(fn, fullgraph=True)
        for _ in range(2):
            q, kv, idx, x_kv, x_idx = inputs()
            want_out, want_lse = fn(q, kv, idx, x_kv, x_idx, None)
            got_out, got_lse = compiled(q, kv, idx, x_kv, x_idx, None)
            torch.cuda.synchronize()
            if not torch.equal(got_out, want_out) or not torch.equal(got_lse, want_lse):
                problems.append("compiled differs from eager")
            # The reference: both lists' rows in one softmax (one flat
            # slot space: the extra cache's slots after the main ones).
            pbs, x_pbs = spec.page_block_size, 16
            t = batch
            flat, x_flat = idx.reshape(t, -1), x_idx.reshape(t, -1)
            slots = kv.shape[0] * pbs
            x_slots = x_kv.shape[0] * x_pbs
            valid = torch.cat([(flat >= 0) & (flat < slots), (x_flat >= 0) & (x_flat < x_slots)],
                              dim=1)
            safe = torch.where(flat >= 0, flat, torch.zeros_like(flat)).long().clamp_max(
                slots - 1)
            x_safe = torch.where(x_flat >= 0, x_flat, torch.zeros_like(x_flat)).long().clamp_max(
                x_slots - 1)
            rows = torch.cat([kv[safe // pbs, safe % pbs], x_kv[x_safe // x_pbs, x_safe % x_pbs]],
                             dim=1).double() * valid[..., None]
            ref_out, ref_lse = reference(q.reshape(t, spec.num_q_heads, -1).double(), rows, None,
                                         valid, spec.softmax_scale, spec.kv_lora_rank)
            o = want_out.reshape(ref_out.shape).double()
            err = float((o - ref_out).abs().max() / ref_out.abs().max().clamp_min(1e-30))
            if err > e2e_python.OUT_BAR:
                problems.append(f"out off the reference by {err:.2e}")
            fin = torch.isfinite(ref_lse)
            l = want_lse.reshape(ref_lse.shape).double()
            if not torch.equal(torch.isfinite(l), fin) or (
                    fin.any() and float((l[fin] - ref_lse[fin]).abs().max()) > 1e-3):
                problems.append("lse off the reference")
            # Extra lengths of 0: only the top-k list counts.
            zero = torch.zeros(batch, dtype=torch.int32, device="cuda")
            cut_out, cut_lse = fn(q, kv, idx, x_kv, x_idx, zero)
            none_out, none_lse = fn(q, kv, idx, x_kv, torch.full_like(x_idx, -1), None)
            torch.cuda.synchronize()
            if not torch.equal(cut_out, none_out) or not torch.equal(cut_lse, none_lse):
                problems.append("extra_topk_length 0 differs from an all -1 extra list")
    except Exception as e:
        problems.append(f"{type(e).__name__}: {e}")
    results.append((name, problems))
    print(f"{name:22s} {'extra cache':14s} {'FAIL: ' + '; '.join(problems) if problems else 'ok'}",
          flush=True)


def checks(torch, source, gen, reference):
    import kforge
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, source {source!r}")
    results = []
    for preset, tp, batches in CASES:
        decoder = kforge.SparseMlaDecoder(source, preset=preset, tp=tp)
        decoder.prefetch()
        for batch in batches:
            check_case(torch, kforge, reference, gen, decoder, batch, results)
    if not isinstance(source, kforge.Bundle):  # a bundle holds only the presets' kernels
        for batch in (1, 32):
            extra_cache_case(torch, kforge, reference, gen, source, batch, results)
    return [p for _, p in results]


def main():
    import e2e_python
    return e2e_python.run_gpu_check(__doc__.splitlines()[0], "kforge_torch_op_", checks)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""End-to-end check of the kforge Python client on a GPU.

Starts `kforge serve` (or opens a bundle with --bundle DIR) and runs
kforge.sparse_mla_decode for GLM-5 TP1 (64 heads), GLM-5 TP8 (8 heads) and
DeepSeek-V3.2 TP1 (128 heads) at batch 1, 32 and 128 (s_q 1) on fresh random
inputs: a paged bf16 cache with a gap between pages, indices with -1 entries,
duplicates and (batch > 1) one token with nothing to attend to, outputs
poisoned with NaN. Compares with check_sparse_mla.py's fp64 reference:
out max|err| / max|ref| <= 1e-2, lse max|err| / max|ref| <= 1e-4, -inf lse
exactly where nothing is valid, zero output there. Also checks that an
explicit SparseMlaDecoder gives the same bits, and that a decode step
captured in a CUDA graph after prefetch() replays correctly on new inputs
copied into the captured tensors. Prints (does not judge) the host time per
call, the engine's per-layer overhead.

Usage: e2e_python.py PATH/TO/kforge [--lib-dir DIR]   (DIR: the libraries
       kforge needs, put on LD_LIBRARY_PATH for the server only)
       e2e_python.py --bundle DIR                     (no server)
       KFORGE_E2E_INSTALLED=1: check the installed package (a wheel), not python/
Exit 0: all passed; 1: a failure; 77: no PyTorch or no GPU (skipped).
"""

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# KFORGE_E2E_INSTALLED=1: the kforge package pip installed (the wheel,
# scripts/build_wheel.sh) instead of the source tree's.
if os.environ.get("KFORGE_E2E_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

CASES = (("glm-5", 1), ("glm-5", 8), ("deepseek-v3.2", 1))
BATCHES = (1, 32, 128)
OUT_BAR, LSE_BAR = 1e-2, 1e-4
# An fp8_ds_mla cache with arbitrary (non power of two) scales: the kernel
# dequantizes e4m3 * scale to bf16, as FlashMLA does, a 2^-9 relative
# rounding of every K that a power-of-two scale does not have. Against the
# exact dequantized values this metric (max abs lse error over max |lse|)
# read 1.9e-4 on the H200 for glm-5 TP8 batch 32 (2026-12-01); the GPU
# check's norm-based lse error stays under 1e-4 (2.8e-5).
LSE_BAR_FP8_ARBITRARY = 5e-4
PAGE_GAP = 64  # elements between pages (keeps 16-byte alignment)
SKIP = 77


def server_env(lib_dir):
    """The environment for kforge alone: its staged libraries must not reach
    torch, which keeps its own libstdc++ (tests/gpu/stage_binaries.sh)."""
    env = dict(os.environ)
    if lib_dir:
        env["LD_LIBRARY_PATH"] = lib_dir + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    return env


def make_inputs(torch, gen, batch, heads, spec, four_dim):
    """q [batch, 1, heads, d_qk]; a paged cache (3- or 4-dim view with a gap
    between pages); indices with -1, duplicates and an all -1 token."""
    d_qk, topk, pbs = spec.kv_lora_rank + spec.rope_dim, spec.topk, spec.page_block_size
    num_pages = math.ceil(2 * (topk + pbs) / pbs)
    page_stride = pbs * d_qk + PAGE_GAP
    storage = torch.randn(num_pages * page_stride, generator=gen, device="cuda").bfloat16()
    if four_dim:
        kv = storage.as_strided((num_pages, pbs, 1, d_qk), (page_stride, d_qk, d_qk, 1))
    else:
        kv = storage.as_strided((num_pages, pbs, d_qk), (page_stride, d_qk, 1))
    q = torch.randn(batch, 1, heads, d_qk, generator=gen, device="cuda").bfloat16()
    slots = num_pages * pbs
    idx = torch.randint(0, slots, (batch, 1, topk), generator=gen, device="cuda",
                        dtype=torch.int32)
    idx[..., topk // 2:topk // 2 + 64] = idx[..., :64]  # duplicates
    drop = torch.rand(batch, 1, topk, generator=gen, device="cuda") < 0.1
    idx = torch.where(drop, torch.full_like(idx, -1), idx)
    if batch > 1:
        idx[batch // 2].fill_(-1)  # a token with nothing to attend to
    return q, kv, idx


def compare(torch, reference, q, kv, idx, out, lse, scale, d_v, lse_bar=LSE_BAR):
    """(out error, lse error, problems) against the fp64 reference."""
    batch, _, heads, d_qk = q.shape
    kv3 = kv.reshape(kv.shape[0], kv.shape[1], d_qk)
    pbs, slots = kv3.shape[1], kv3.shape[0] * kv3.shape[1]
    t, k = batch, idx.shape[-1]
    flat = idx.reshape(t, k)
    valid = (flat >= 0) & (flat < slots)
    safe = torch.where(valid, flat, torch.zeros_like(flat)).long()
    rows = kv3[safe // pbs, safe % pbs].double() * valid[..., None]
    ref_out, ref_lse = reference(q.reshape(t, heads, d_qk).double(), rows, flat, valid, scale,
                                 d_v)
    o, l = out.reshape(t, heads, d_v).double(), lse.reshape(t, heads).double()
    problems = []
    if torch.isnan(o).any() or torch.isnan(l).any():
        problems.append("NaN")
    out_err = float((o - ref_out).abs().max() / ref_out.abs().max().clamp_min(1e-30))
    finite = torch.isfinite(ref_lse)
    if not torch.equal(torch.isfinite(l), finite):
        problems.append("lse finite where the reference is not (or the reverse)")
    lse_err = float((l[finite] - ref_lse[finite]).abs().max() /
                    ref_lse[finite].abs().max().clamp_min(1e-30)) if finite.any() else 0.0
    empty = ~valid.any(dim=1)
    if empty.any() and not bool((o[empty] == 0).all()):
        problems.append("output of an empty token is not zero")
    if out_err > OUT_BAR:
        problems.append(f"out error > {OUT_BAR}")
    if lse_err > lse_bar:
        problems.append(f"lse error > {lse_bar}")
    return out_err, lse_err, problems


def run_case(torch, kforge, reference, gen, preset, tp, batch, explicit):
    """One (model, batch) row; `explicit` is a SparseMlaDecoder for the
    same model, which must give the same bits."""
    spec = kforge.spec_from_preset(preset, tp)
    q, kv, idx = make_inputs(torch, gen, batch, spec.num_q_heads, spec, four_dim=(tp == 8))
    d_v = spec.kv_lora_rank
    out = torch.full((batch, 1, spec.num_q_heads, d_v), float("nan"), device="cuda",
                     dtype=torch.bfloat16)
    result, lse = kforge.sparse_mla_decode(q, kv, idx, spec.softmax_scale, return_lse=True,
                                           out=out)
    torch.cuda.synchronize()
    decoder = kforge.ops.decoder_for(q, kv, idx, spec.softmax_scale, return_lse=True, out=out)
    splits = decoder.selection(batch, 1).num_splits
    out_err, lse_err, problems = compare(torch, reference, q, kv, idx, out, lse,
                                         spec.softmax_scale, d_v)
    if result is not out:
        problems.append("out= was not the tensor returned")
    again, again_lse = explicit(q, kv, idx, return_lse=True)
    torch.cuda.synchronize()
    if explicit.selection(batch, 1) == decoder.selection(batch, 1):
        if not (torch.equal(again, out) and torch.equal(again_lse, lse)):
            problems.append("SparseMlaDecoder differs from sparse_mla_decode")
    else:
        # Only where one of the two decoders holds a first answer
        # (KFORGE_FIRST_ANSWER=1: it plans without the entries the answer
        # lacks, for its life) do they run different kernels, whose bits
        # may differ: each is checked against the reference instead.
        if not any(d.holds_first_answer() for d in (explicit, decoder)):
            problems.append(f"the two decoders chose {explicit.selection(batch, 1)} and "
                            f"{decoder.selection(batch, 1)} with no first answer")
        _, _, again_problems = compare(torch, reference, q, kv, idx, again, again_lse,
                                       spec.softmax_scale, d_v)
        problems += [f"SparseMlaDecoder: {p}" for p in again_problems]
    return dict(model=f"{preset} tp{tp}", heads=spec.num_q_heads, batch=batch, splits=splits,
                out_err=out_err, lse_err=lse_err, problems=problems)


FP8_CASES = (("glm-5", 8, "arbitrary"), ("deepseek-v3.2", 1, "pow2"))


def fp8_case(torch, kforge, reference, gen, source, preset, tp, batch):
    """The engine path on an fp8_ds_mla cache: SparseMlaDecoder(kv_dtype=
    "fp8_ds_mla") over uint8 656-byte records (4-dim view, a gap between
    pages), against the fp64 reference of the dequantized cache."""
    decoder = kforge.SparseMlaDecoder(source, preset=preset, tp=tp, kv_dtype="fp8_ds_mla")
    spec = decoder.spec
    fmt = {1: "pow2", 2: "arbitrary"}[spec.kv_scale_format]
    q, kv, idx = make_inputs(torch, gen, batch, spec.num_q_heads, spec, four_dim=False)
    records = kforge.quantize_fp8_ds_mla(kv, fmt)  # [pages, pbs, 656]
    pages, pbs, record = records.shape
    page_stride = pbs * record + 64
    storage = torch.full((pages * page_stride,), 0xFF, dtype=torch.uint8, device="cuda")
    cache = storage.as_strided((pages, pbs, 1, record), (page_stride, record, record, 1))
    cache.copy_(records.reshape(pages, pbs, 1, record))
    out, lse = decoder(q, cache, idx, return_lse=True)
    torch.cuda.synchronize()
    values = kforge.dequantize_fp8_ds_mla(cache.reshape(pages, pbs, record))
    out_err, lse_err, problems = compare(
        torch, reference, q, values, idx, out, lse, spec.softmax_scale, spec.kv_lora_rank,
        lse_bar=LSE_BAR_FP8_ARBITRARY if fmt == "arbitrary" else LSE_BAR)
    return dict(model=f"{preset} tp{tp} fp8 {fmt}", heads=spec.num_q_heads, batch=batch,
                splits=decoder.selection(batch, 1).num_splits, out_err=out_err,
                lse_err=lse_err, problems=problems)


def graph_case(torch, kforge, reference, gen, decoder, preset, tp, batch):
    """Captures one decode step in a CUDA graph (as an engine does after
    prefetch), replays it on fresh inputs copied into the captured tensors,
    and times the host side of eager calls. Returns (problems, host us)."""
    import time
    spec = kforge.spec_from_preset(preset, tp)
    q, kv, idx = make_inputs(torch, gen, batch, spec.num_q_heads, spec, four_dim=False)
    out = torch.empty(batch, 1, spec.num_q_heads, spec.kv_lora_rank, device="cuda",
                      dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up on the side stream, as torch recommends
            decoder(q, kv, idx, return_lse=True, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = decoder(q, kv, idx, return_lse=True, out=out)
    problems = []
    for replay in range(2):
        q2, kv2, idx2 = make_inputs(torch, gen, batch, spec.num_q_heads, spec, four_dim=False)
        q.copy_(q2), kv.copy_(kv2), idx.copy_(idx2)
        out.fill_(float("nan")), lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _, _, p = compare(torch, reference, q, kv, idx, out, lse, spec.softmax_scale,
                          spec.kv_lora_rank)
        problems += [f"replay {replay}: {x}" for x in p]
    calls = 200
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        decoder(q, kv, idx, return_lse=True, out=out)
    host_us = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return problems, host_us


def refresh_case(torch, kforge, reference, gen, source):
    """A first answer replaced by the whole module (KFORGE_FIRST_ANSWER=1
    only): a decoder of a module the server has not compiled yet loads a
    first answer, runs with it, and swaps in the whole module by itself
    (SparseMlaDecoder.refresh from run()) once the server has it. None when
    the source takes whole modules only, else the problems."""
    if not getattr(source, "first_answer", False):
        return None
    preset, tp, batch = "deepseek-v3.2", 2, 1  # a module no other case asks for
    decoder = kforge.SparseMlaDecoder(source, preset=preset, tp=tp)
    decoder.prefetch()
    problems = []
    if not decoder.holds_first_answer():
        problems.append("a cold server's module did not come as a first answer")
    spec = decoder.spec
    waited, start = 0.0, time.monotonic()
    while True:
        q, kv, idx = make_inputs(torch, gen, batch, spec.num_q_heads, spec, four_dim=False)
        out, lse = decoder(q, kv, idx, return_lse=True)
        torch.cuda.synchronize()
        _, _, found = compare(torch, reference, q, kv, idx, out, lse, spec.softmax_scale,
                              spec.kv_lora_rank)
        problems += found
        waited = time.monotonic() - start
        if not decoder.holds_first_answer() or waited > 90 or found:
            break
        time.sleep(0.25)
    if decoder.holds_first_answer():
        problems.append(f"still a first answer after {waited:.0f} s")
    elif not decoder.selection(batch, 1).plan.small_batch:
        problems.append("the whole module's small-batch entry is not planned")
    print(f"{preset} tp{tp} first answer then the whole module after {waited:.1f} s: "
          f"{'FAIL: ' + '; '.join(problems) if problems else 'ok'}", flush=True)
    return problems


def report(r):
    """Prints one result row; 1 when it failed."""
    print(f"{r['model']:20s} {r['heads']:5d} {r['batch']:5d} {r['splits']:6d} "
          f"{r['out_err']:11.2e} {r['lse_err']:9.2e}  "
          f"{'FAIL: ' + '; '.join(r['problems']) if r['problems'] else 'ok'}", flush=True)
    return int(bool(r["problems"]))


def source_args(description):
    """The kernel source of a GPU script: a kforge binary to serve, or a
    bundle directory."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("kforge", nargs="?", help="kforge binary (server mode)")
    ap.add_argument("--lib-dir", default="", help="LD_LIBRARY_PATH for the kforge server")
    ap.add_argument("--bundle", default="", help="bundle directory (no server)")
    args = ap.parse_args()
    if bool(args.kforge) == bool(args.bundle):
        ap.error("give a kforge binary or --bundle DIR")
    return args


def cuda_torch():
    """torch with a CUDA GPU, or None after printing why a GPU script skips."""
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        return None
    if not torch.cuda.is_available():
        print("SKIP: no CUDA GPU")
        return None
    return torch


@contextlib.contextmanager
def kernel_source(args, prefix):
    """The kforge source a GPU script's source_args name, configured: the
    bundle, or a kforge serve started in a temporary directory (named with
    `prefix`) and stopped on the way out."""
    import kforge
    from kforge.testing import start_server, stop_server
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        if args.bundle:
            yield kforge.configure(bundle=args.bundle)
            return
        proc, address = start_server(args.kforge, os.path.join(tmp, "cache"),
                                     os.path.join(tmp, "server.log"),
                                     env=server_env(args.lib_dir))
        try:
            yield kforge.configure(address=address)
        finally:
            stop_server(proc)


@contextlib.contextmanager
def gpu_check(description, prefix):
    """What a GPU check script's main opens: the kernel source its command
    line names (source_args, kernel_source), torch with a CUDA GPU, a
    randomly seeded CUDA generator and the fp64 reference. Yields (torch,
    source, gen, reference), or None after printing why the script skips."""
    args = source_args(description)
    torch = cuda_torch()
    if torch is None:
        yield None
        return
    from check_sparse_mla import reference
    with kernel_source(args, prefix) as source:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
        yield torch, source, gen, reference


def run_gpu_check(description, prefix, checks):
    """A GPU check script's main: checks(torch, source, gen, reference)
    inside gpu_check returns one problem list per check; prints "N passed,
    N failed" and returns the exit status (1 on a failure, 0 skipped)."""
    with gpu_check(description, prefix) as opened:
        if opened is None:
            return 0
        problem_lists = checks(*opened)
    failed = sum(bool(p) for p in problem_lists)
    print(f"{len(problem_lists) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    args = source_args(__doc__.splitlines()[0])
    torch = cuda_torch()
    if torch is None:
        return SKIP
    import kforge
    import kforge.ops
    from check_sparse_mla import reference

    with kernel_source(args, "kforge_e2e_") as source:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(int.from_bytes(os.urandom(4), "little"))
        print(f"source: {source!r}, device: {torch.cuda.get_device_name()}")
        print(f"{'model':20s} {'heads':>5s} {'batch':>5s} {'splits':>6s} "
              f"{'max rel err':>11s} {'lse err':>9s}  pass")
        failures = 0
        for preset, tp in CASES:
            explicit = kforge.SparseMlaDecoder(source, preset=preset, tp=tp)
            print(f"{preset} tp{tp}: prefetched {explicit.prefetch()} kernels")
            for batch in BATCHES:
                r = run_case(torch, kforge, reference, gen, preset, tp, batch, explicit)
                failures += report(r)
            if tp == 8:
                problems, host_us = graph_case(torch, kforge, reference, gen, explicit,
                                               preset, tp, 32)
                failures += bool(problems)
                print(f"{preset} tp{tp} batch 32 in a CUDA graph: "
                      f"{'FAIL: ' + '; '.join(problems) if problems else 'ok'}; "
                      f"host time per eager call {host_us:.0f} us", flush=True)
        for preset, tp, _ in FP8_CASES:
            for batch in (1, 32):
                r = fp8_case(torch, kforge, reference, gen, source, preset, tp, batch)
                failures += report(r)
        refreshed = refresh_case(torch, kforge, reference, gen, source)
        failures += bool(refreshed)
    total = (len(CASES) * len(BATCHES) + sum(tp == 8 for _, tp in CASES)  # + graph cases
             + 2 * len(FP8_CASES) + (refreshed is not None))
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

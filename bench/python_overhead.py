#!/usr/bin/env python3
"""Host time of one eager kforge Python decode call (GLM-5 TP8, batch 1, 32
and 128): SparseMlaDecoder.__call__ (out= given, and out allocated) and
kforge.sparse_mla_decode, 500 calls each, then a cProfile of the decoder
path at batch 32. Prints; times the host only (the GPU work is queued, not
waited for, inside the timed loop; issue 11's bar is 20 us per call).

Usage (on the GPU machine, repository root):
    python3 bench/python_overhead.py STAGED_KFORGE LIB_DIR
"""
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, "python")
sys.path.insert(0, "tests/gpu")
import torch  # noqa: E402
import kforge  # noqa: E402
import e2e_python  # noqa: E402
from kforge.testing import start_server, stop_server  # noqa: E402

CALLS = 500
BATCHES = (1, 32, 128)


def host_us_per_call(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    us = (time.perf_counter() - start) / CALLS * 1e6
    torch.cuda.synchronize()
    return us


def main():
    tmp = tempfile.mkdtemp(prefix="kforge_overhead_")
    proc, address = start_server(sys.argv[1], os.path.join(tmp, "cache"),
                                 os.path.join(tmp, "server.log"),
                                 env=e2e_python.server_env(sys.argv[2]))
    try:
        source = kforge.configure(address=address)
        decoder = kforge.SparseMlaDecoder(source, preset="glm-5", tp=8)
        decoder.prefetch()
        spec = kforge.spec_from_preset("glm-5", 8)
        gen = torch.Generator(device="cuda")
        gen.manual_seed(1)
        print(f"{'batch':>5s} {'call':32s} {'host us/call':>12s}")
        for batch in BATCHES:
            q, kv, idx = e2e_python.make_inputs(torch, gen, batch, spec.num_q_heads, spec, False)
            out = torch.empty(batch, 1, spec.num_q_heads, spec.kv_lora_rank, device="cuda",
                              dtype=torch.bfloat16)
            calls = {
                "SparseMlaDecoder(out=, lse)": lambda: decoder(q, kv, idx, return_lse=True,
                                                               out=out),
                "SparseMlaDecoder(lse)": lambda: decoder(q, kv, idx, return_lse=True),
                "sparse_mla_decode(out=, lse)": lambda: kforge.sparse_mla_decode(
                    q, kv, idx, spec.softmax_scale, return_lse=True, out=out),
            }
            for fn in calls.values():  # warm up (first-call loads, plans, allocator)
                for _ in range(20):
                    fn()
            for name, fn in calls.items():
                print(f"{batch:5d} {name:32s} {host_us_per_call(fn):12.1f}", flush=True)
            print(f"{batch:5d} splits {decoder.selection(batch, 1).num_splits}, plans made "
                  f"{decoder._plans.misses}")
        q, kv, idx = e2e_python.make_inputs(torch, gen, 32, spec.num_q_heads, spec, False)
        out = torch.empty(32, 1, spec.num_q_heads, spec.kv_lora_rank, device="cuda",
                          dtype=torch.bfloat16)
        calls = {"SparseMlaDecoder": lambda: decoder(q, kv, idx, return_lse=True, out=out)}
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(CALLS):
            calls["SparseMlaDecoder"]()
        profile.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
        print(text.getvalue())
    finally:
        stop_server(proc)


if __name__ == "__main__":
    main()

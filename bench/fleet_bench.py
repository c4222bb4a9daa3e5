#!/usr/bin/env python3
"""Hit latency with the shared Redis tier: a local (memory) hit, a Redis hit
and a fleet-wide cold compile, measured from a Python gRPC client against
real `kforge serve --redis` processes and a redis-server on loopback.

  /usr/bin/python3 bench/fleet_bench.py build/cli/kforge [--servers 3] [--keys 6]

Each cold key (glm-5 TP 8 sm_90a with a distinct topk, so nothing is
cached) is asked of every server at once: the time until all have it is
the fleet's cold compile. Then a fresh server (empty memory and disk) asks
for each key once: a Redis hit. Then the same server repeats one key: a
memory hit. Prints a markdown table; needs python/kforge/v1/*_pb2.py, which
the build generates.
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import grpc  # noqa: E402
from kforge.v1 import service_pb2  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path, marker, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = open(path).read() if os.path.exists(path) else ""
        at = text.find(marker)
        if at >= 0:
            return text[at + len(marker):].split()[0]
        time.sleep(0.02)
    raise RuntimeError(f"{marker!r} not in {path}:\n{text}")


def get_kernel(channel, topk):
    call = channel.unary_unary(
        "/kforge.v1.KernelService/GetKernel",
        request_serializer=service_pb2.GetKernelRequest.SerializeToString,
        response_deserializer=service_pb2.GetKernelResponse.FromString)
    request = service_pb2.GetKernelRequest(arch="sm_90a")
    spec = request.kernel.spec.sparse_mla_decode
    spec.num_q_heads, spec.kv_lora_rank, spec.rope_dim = 8, 512, 64
    spec.topk, spec.s_q, spec.kv_cache_dtype = topk, 1, 1
    spec.page_block_size, spec.softmax_scale, spec.return_lse = 64, 0.0625, True
    start = time.perf_counter()
    response = call(request, timeout=300)
    return time.perf_counter() - start, response.source


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kforge")
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--keys", type=int, default=6)
    parser.add_argument("--hits", type=int, default=500)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="kforge_fleet_bench.")
    procs = []
    try:
        redis_port = free_port()
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL))
        time.sleep(0.3)

        def serve(i):
            log = os.path.join(tmp, f"server{i}.log")
            procs.append(subprocess.Popen(
                [args.kforge, "serve", "--listen", "127.0.0.1:0", "--cache-dir",
                 os.path.join(tmp, f"cache{i}"), "--redis", f"127.0.0.1:{redis_port}"],
                stdout=open(log, "w"), stderr=subprocess.STDOUT))
            return grpc.insecure_channel(wait_for(log, "kforge: serving on "),
                                         options=[("grpc.max_receive_message_length", 1 << 28)])

        fleet = [serve(i) for i in range(args.servers)]
        cold = []
        for k in range(args.keys):
            topk = 3001 + k
            start = time.perf_counter()
            threads = [threading.Thread(target=get_kernel, args=(c, topk)) for c in fleet]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            cold.append(time.perf_counter() - start)

        fresh = serve(args.servers)
        redis_hits = []
        for k in range(args.keys):
            seconds, source = get_kernel(fresh, 3001 + k)
            assert source == service_pb2.ARTIFACT_SOURCE_REDIS, source
            redis_hits.append(seconds)
        memory_hits = []
        for _ in range(args.hits):
            seconds, source = get_kernel(fresh, 3001)
            assert source == service_pb2.ARTIFACT_SOURCE_MEMORY, source
            memory_hits.append(seconds)

        def ms(values):
            return f"{statistics.median(values) * 1e3:.2f} ms (min {min(values) * 1e3:.2f})"

        print("| what | median latency (client side) | samples |")
        print("|---|---|---|")
        print(f"| local hit (memory tier) | {ms(memory_hits)} | {len(memory_hits)} |")
        print(f"| Redis hit (fresh server, empty disk) | {ms(redis_hits)} | {len(redis_hits)} |")
        print(f"| fleet-wide cold compile ({args.servers} servers ask at once, "
              f"1 compiles) | {ms(cold)} | {len(cold)} |")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

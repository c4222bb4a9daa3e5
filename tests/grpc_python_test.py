#!/usr/bin/env python3
"""A client that is not ours: Python grpcio (Debian python3-grpcio) talks to
`kforge serve` with message classes generated from our .proto at test time,
through raw method names, plus grpc.health.v1 with hand-encoded bytes.

Usage: grpc_python_test.py PATH/TO/kforge PROTO_ROOT [PATH/TO/protoc]
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import grpc

KFORGE, PROTO_ROOT = sys.argv[1], sys.argv[2]
PROTOC = sys.argv[3] if len(sys.argv) > 3 else "protoc"
ARCH = "sm_90a"
SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def check(cond, message):
    if not cond:
        fail(message)
    print("ok: " + message)


def start_server(tmp, name):
    log_path = os.path.join(tmp, name + ".log")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [KFORGE, "serve", "--listen", "127.0.0.1:0",
         "--cache-dir", os.path.join(tmp, "cache"), "--workers", "2"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    marker = "kforge: serving on "
    while True:
        text = open(log_path).read()
        if marker in text:
            return proc, text.split(marker, 1)[1].split()[0], log_path
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            fail("server did not start:\n" + text)
        time.sleep(0.02)


def main():
    with tempfile.TemporaryDirectory(prefix="kforge_py_") as tmp:
        gen = os.path.join(tmp, "gen")
        os.makedirs(gen)
        protos = ["kforge/v1/spec.proto", "kforge/v1/artifact.proto",
                  "kforge/v1/service.proto"]
        subprocess.run([PROTOC, "--proto_path=" + PROTO_ROOT,
                        "--python_out=" + gen] + protos, check=True)
        sys.path.insert(0, gen)
        from kforge.v1 import service_pb2  # generated just above

        proc, address, log_path = start_server(tmp, "server")
        try:
            channel = grpc.insecure_channel(
                address, options=[("grpc.max_receive_message_length", 256 << 20)])
            health = channel.unary_unary("/grpc.health.v1.Health/Check")
            deadline = time.time() + 30
            while True:
                try:
                    if health(b"", timeout=2) == SERVING:
                        break
                except grpc.RpcError:
                    pass
                if time.time() > deadline:
                    fail("health never said SERVING")
                time.sleep(0.02)
            print("ok: grpc.health.v1.Health/Check answers SERVING")

            get_kernel = channel.unary_unary(
                "/kforge.v1.KernelService/GetKernel",
                request_serializer=service_pb2.GetKernelRequest.SerializeToString,
                response_deserializer=service_pb2.GetKernelResponse.FromString)
            request = service_pb2.GetKernelRequest(arch=ARCH)
            request.kernel.preset.name = "glm-5"
            request.kernel.preset.tensor_parallel = 8
            first = get_kernel(request, timeout=120)
            art = first.artifact
            check(art.cubin[:4] == b"\x7fELF" and len(art.cubin) > 1000,
                  "GetKernel returns a cubin (%d bytes)" % len(art.cubin))
            check(first.source == service_pb2.ARTIFACT_SOURCE_COMPILED,
                  "first call compiled it")
            check(art.arch == ARCH and len(art.key) == 64 and art.module_name,
                  "artifact names arch, key and module (%s)" % art.module_name)
            check(art.launch.block_threads > 0 and art.main_entry,
                  "artifact carries the launch configuration")
            second = get_kernel(request, timeout=30)
            check(second.source == service_pb2.ARTIFACT_SOURCE_MEMORY and
                  second.artifact.cubin == art.cubin,
                  "second call is a memory hit with identical bytes")

            bad = service_pb2.GetKernelRequest(arch=ARCH)
            bad.kernel.preset.name = "glm-5"
            bad.kernel.preset.tensor_parallel = 3
            try:
                get_kernel(bad, timeout=30)
                fail("tp 3 was accepted")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and
                      "tensor_parallel" in e.details(),
                      "bad spec: INVALID_ARGUMENT naming the field (%s)" % e.details())
            request.arch = "sm_99"
            try:
                get_kernel(request, timeout=30)
                fail("sm_99 was accepted")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.FAILED_PRECONDITION,
                      "bad arch: FAILED_PRECONDITION")
            channel.close()

            proc.send_signal(signal.SIGTERM)
            check(proc.wait(timeout=60) == 0, "SIGTERM: exit code 0")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                print(open(log_path).read(), file=sys.stderr)


if __name__ == "__main__":
    main()

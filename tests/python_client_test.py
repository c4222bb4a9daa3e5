#!/usr/bin/env python3
"""Tests of the kforge Python client package (python/kforge), no GPU needed:
retries and answer checks against scripted fake servers, a real
`kforge serve`, bundles read offline, the Python selector against
`kforge select`, and the input checks and launch planning of kforge.ops.

Usage: python_client_test.py PATH/TO/kforge PYTHON_DIR
(PYTHON_DIR holds the kforge package with its generated kforge/v1 modules.)
"""
import collections
import ctypes
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from concurrent import futures

KFORGE, PYTHON_DIR = sys.argv[1], sys.argv[2]
sys.path.insert(0, PYTHON_DIR)

import grpc  # noqa: E402

import kforge  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from kforge import bundle as kbundle  # noqa: E402
from kforge import ops  # noqa: E402
from kforge.client import backoff_delay  # noqa: E402
from kforge.driver import CombineParams, DecodeParams  # noqa: E402
from kforge.select import Device, Shape, select  # noqa: E402
from kforge.spec import arch_for_capability, check_arch_runs, infer_latent_dims  # noqa: E402
from kforge.testing import start_server, stop_server  # noqa: E402
from kforge.v1 import artifact_pb2, service_pb2  # noqa: E402

ARCH = "sm_90a"
SERVICE = "kforge.v1.KernelService"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_pair(arch=ARCH):
    """A manifest with one variant and the artifact that matches it."""
    spec = kforge.spec_from_preset("glm-5", 8)
    module = "sparse_mla_decode_fake_" + arch.replace("_", "")
    v = service_pb2.ManifestVariant(module_name=module, key="ab" * 32, spec=spec,
                                    main_entry="sparse_mla_decode_main",
                                    combine_entry="sparse_mla_decode_combine")
    v.tiling.num_head_groups, v.tiling.token_tile, v.tiling.head_tile = 1, 64, 16
    v.launch.block_threads, v.launch.combine_block_threads = 128, 128
    v.launch.ctas_per_sm, v.launch.min_tiles_per_split = 2, 2
    manifest = service_pb2.Manifest(format_version=1, arch=arch, variants=[v], choice_order=[0])
    art = artifact_pb2.KernelArtifact(
        format_version=1, module_name=module, key=v.key, arch=arch, spec=spec, tiling=v.tiling,
        launch=v.launch, main_entry=v.main_entry, combine_entry=v.combine_entry,
        cubin=b"\x7fELF" + bytes(60), params_bytes=ctypes.sizeof(DecodeParams),
        combine_params_bytes=ctypes.sizeof(CombineParams))
    art.cubin_info.arch = arch
    art.cubin_info.kernels.add(name=v.main_entry, param_bytes=art.params_bytes)
    art.cubin_info.kernels.add(name=v.combine_entry, param_bytes=art.combine_params_bytes)
    return manifest, art


class FakeServer:
    """A grpc.server answering GetManifest and GetKernel from scripts: each
    reply is a message or a grpc.StatusCode to abort with; the last one
    repeats."""

    def __init__(self, manifests=(), kernels=()):
        self.calls = collections.Counter()
        self.requests = collections.defaultdict(list)
        handlers = {
            "GetManifest": grpc.unary_unary_rpc_method_handler(
                self._handler("GetManifest", list(manifests)),
                request_deserializer=service_pb2.GetManifestRequest.FromString,
                response_serializer=service_pb2.Manifest.SerializeToString),
            "GetKernel": grpc.unary_unary_rpc_method_handler(
                self._handler("GetKernel", list(kernels)),
                request_deserializer=service_pb2.GetKernelRequest.FromString,
                response_serializer=service_pb2.GetKernelResponse.SerializeToString),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def _handler(self, name, replies):
        def handle(request, context):
            index = self.calls[name]
            self.calls[name] += 1
            self.requests[name].append(request)
            reply = replies[min(index, len(replies) - 1)]
            if isinstance(reply, grpc.StatusCode):
                context.abort(reply, f"scripted {reply.name}")
            return reply
        return handle

    def client(self, **options):
        options.setdefault("initial_backoff", 0.01)
        options.setdefault("max_backoff", 0.02)
        return kforge.Client(self.address, timeout=10, **options)

    def stop(self):
        self.server.stop(None)


class RetryAndAnswerTest(unittest.TestCase):
    def setUp(self):
        self.manifest, self.artifact = fake_pair()
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.stop()

    def fake(self, manifests=(), kernels=()):
        self.servers.append(FakeServer(manifests, kernels))
        return self.servers[-1]

    def kernel_reply(self, **changes):
        art = artifact_pb2.KernelArtifact()
        art.CopyFrom(self.artifact)
        for field, value in changes.items():
            setattr(art, field, value)
        return service_pb2.GetKernelResponse(artifact=art)

    def test_backoff_is_exponential_capped_and_jittered(self):
        rng = __import__("random").Random(7)
        delays = [backoff_delay(a, 0.1, 1.0, rng) for a in range(1, 9)]
        for attempt, d in enumerate(delays, 1):
            step = min(1.0, 0.1 * 2 ** (attempt - 1))
            self.assertTrue(step / 2 <= d <= step, (attempt, d))
        self.assertEqual(len(set(delays)), len(delays))  # jittered

    def test_server_down_is_unavailable_after_every_attempt(self):
        address = f"127.0.0.1:{free_port()}"
        client = kforge.Client(address, timeout=5, max_attempts=4, initial_backoff=0.1,
                               max_backoff=0.2)
        start = time.monotonic()
        with self.assertRaises(kforge.KforgeUnavailable) as cm:
            client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
        elapsed = time.monotonic() - start
        self.assertEqual(client.rpc_calls, 4)
        # Sleeps of at least half of 0.1, 0.2, 0.2; at most their sum plus
        # three quick connection refusals.
        self.assertGreaterEqual(elapsed, 0.25)
        self.assertLess(elapsed, 3.0)
        message = str(cm.exception)
        for part in (address, "4 attempts", "UNAVAILABLE", "kforge serve", "KFORGE_BUNDLE"):
            self.assertIn(part, message)
        self.assertIsInstance(cm.exception, kforge.KforgeError)

    def test_unavailable_and_resource_exhausted_are_retried(self):
        fake = self.fake(manifests=[grpc.StatusCode.UNAVAILABLE,
                                    grpc.StatusCode.RESOURCE_EXHAUSTED, self.manifest],
                         kernels=[grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE,
                                  self.kernel_reply()])
        client = fake.client(max_attempts=3)
        self.assertEqual(client.get_manifest(preset="glm-5", tp=8, arch=ARCH), self.manifest)
        self.assertEqual(client.get_kernel(self.manifest.variants[0], ARCH), self.artifact)
        self.assertEqual((fake.calls["GetManifest"], fake.calls["GetKernel"]), (3, 3))
        self.assertEqual(client.rpc_calls, 6)
        request = fake.requests["GetManifest"][-1]
        self.assertEqual((request.kernel.preset.name, request.kernel.preset.tensor_parallel,
                          request.arch, request.sm_count), ("glm-5", 8, ARCH, 0))
        request = fake.requests["GetKernel"][-1]
        self.assertEqual(request.kernel.spec, self.manifest.variants[0].spec)
        self.assertEqual(request.arch, ARCH)

    def test_too_few_attempts_is_unavailable(self):
        fake = self.fake(manifests=[grpc.StatusCode.UNAVAILABLE] * 2 + [self.manifest])
        with self.assertRaises(kforge.KforgeUnavailable) as cm:
            fake.client(max_attempts=2).get_manifest(preset="glm-5", tp=8, arch=ARCH)
        self.assertIn("scripted UNAVAILABLE", str(cm.exception))
        self.assertEqual(fake.calls["GetManifest"], 2)

    def test_other_codes_fail_at_once(self):
        fake = self.fake(manifests=[grpc.StatusCode.INVALID_ARGUMENT, self.manifest],
                         kernels=[grpc.StatusCode.NOT_FOUND, self.kernel_reply()])
        client = fake.client()
        with self.assertRaises(kforge.KforgeRpcError) as cm:
            client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
        self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")
        self.assertIn(fake.address, str(cm.exception))
        with self.assertRaises(kforge.KforgeNotFound):
            client.get_kernel(self.manifest.variants[0], ARCH)
        self.assertEqual((fake.calls["GetManifest"], fake.calls["GetKernel"]), (1, 1))

    def test_wrong_kernels_are_bad_answers(self):
        other_spec = kforge.spec_from_preset("glm-5", 4)
        cases = {
            "key": self.kernel_reply(key="cd" * 32),
            "module_name": self.kernel_reply(module_name="other"),
            "arch": self.kernel_reply(arch="sm_120a"),
            "empty cubin": self.kernel_reply(cubin=b""),
            "not an ELF": self.kernel_reply(cubin=b"MZ" + bytes(60)),
            "params_bytes": self.kernel_reply(params_bytes=128),
            "spec": service_pb2.GetKernelResponse(artifact=self.artifact),
        }
        cases["spec"].artifact.spec.CopyFrom(other_spec)
        missing = cases["does not export"] = self.kernel_reply()
        del missing.artifact.cubin_info.kernels[1]
        for what, reply in cases.items():
            with self.subTest(what):
                fake = self.fake(manifests=[self.manifest], kernels=[reply, self.kernel_reply()])
                client = fake.client()
                with self.assertRaises(kforge.KforgeBadAnswer) as cm:
                    client.get_kernel(self.manifest.variants[0], ARCH)
                self.assertIn(what, str(cm.exception))
                self.assertIn(fake.address, str(cm.exception))
                # Neither retried nor kept: the next call asks again.
                self.assertEqual(fake.calls["GetKernel"], 1)
                self.assertEqual(client.get_kernel(self.manifest.variants[0], ARCH),
                                 self.artifact)
                self.assertEqual(fake.calls["GetKernel"], 2)

    def test_wrong_manifests_are_bad_answers(self):
        other_arch, _ = fake_pair("sm_120a")
        empty = service_pb2.Manifest(arch=ARCH)
        for manifest, what in ((other_arch, "sm_120a"), (empty, "no variants")):
            fake = self.fake(manifests=[manifest])
            with self.assertRaises(kforge.KforgeBadAnswer) as cm:
                fake.client().get_manifest(preset="glm-5", tp=8, arch=ARCH)
            self.assertIn(what, str(cm.exception))

    def test_answers_are_kept_in_memory(self):
        fake = self.fake(manifests=[self.manifest], kernels=[self.kernel_reply()])
        client = fake.client()
        for _ in range(3):
            client.get_manifest(preset="glm-5", tp=8, arch="90a")
            client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
            client.get_kernel(self.manifest.variants[0], ARCH)
        self.assertEqual((fake.calls["GetManifest"], fake.calls["GetKernel"]), (1, 1))
        client.get_manifest(preset="glm-5", tp=4, arch=ARCH)  # another question
        self.assertEqual(fake.calls["GetManifest"], 2)

    def test_selector_arguments(self):
        client = kforge.Client(f"127.0.0.1:{free_port()}")
        for kwargs in ({"arch": ARCH}, {"preset": "glm-5", "spec": self.artifact.spec,
                                        "arch": ARCH},
                       {"spec": self.artifact.spec, "tp": 2, "arch": ARCH},
                       {"preset": "glm-5"}):
            with self.assertRaises(ValueError):
                client.get_manifest(**kwargs)
        self.assertEqual(client.rpc_calls, 0)


def write_bundle(directory, manifest, artifacts):
    """A bundle written by hand from runtime/bundle.h's layout comment, with
    runtime/bundle.cc's JSON options (proto field names, every field)."""
    files = {}
    for art in artifacts:
        files[f"kernels/{art.key}.kfa"] = art.SerializeToString(deterministic=True)
    first = manifest.variants[manifest.choice_order[0]].module_name
    files[f"manifests/{first}.json"] = kbundle.manifest_to_json(manifest).encode()
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(directory, rel)), exist_ok=True)
        with open(os.path.join(directory, rel), "wb") as f:
            f.write(data)
    with open(os.path.join(directory, "kforge-bundle.json"), "w") as f:
        f.write('{"format": "kforge-bundle", "format_version": 1}\n')
    with open(os.path.join(directory, "checksums.sha256"), "w") as f:
        for rel in sorted(files):
            f.write(f"{kbundle.sha256_hex(files[rel])}  {rel}\n")


class RealServerTest(unittest.TestCase):
    """Against `kforge serve` (compiles glm-5 TP8 for sm_90a, four s_q
    variants, about a second each)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kforge_pyclient_")
        cls.proc, cls.address = start_server(KFORGE, os.path.join(cls.tmp, "cache"),
                                             os.path.join(cls.tmp, "server.log"),
                                             args=("--workers", "2"))
        cls.client = kforge.Client(cls.address, timeout=120)
        cls.manifest = cls.client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
        cls.artifacts = cls.client.prefetch(cls.manifest)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        try:
            assert stop_server(cls.proc) == 0, "kforge serve did not exit cleanly on SIGTERM"
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_manifest_and_kernels(self):
        m = self.manifest
        self.assertEqual((m.arch, m.sm_count, len(m.variants)), (ARCH, 0, 4))
        self.assertEqual([v.spec.s_q for v in m.variants], [1, 2, 3, 4])
        # The Python preset table matches the server's.
        self.assertEqual(m.variants[m.choice_order[0]].spec, kforge.spec_from_preset("glm-5", 8))
        self.assertEqual([a.key for a in self.artifacts], [v.key for v in m.variants])
        for art in self.artifacts:
            self.assertGreater(len(art.cubin), 1000)
            # The loader's parameter blocks are the compiled kernel's.
            self.assertEqual((art.params_bytes, art.combine_params_bytes),
                             (ctypes.sizeof(DecodeParams), ctypes.sizeof(CombineParams)))

    def test_second_requests_make_no_rpc(self):
        before = self.client.rpc_calls
        self.assertEqual(self.client.get_manifest(preset="glm-5", tp=8, arch=ARCH), self.manifest)
        for v, art in zip(self.manifest.variants, self.artifacts):
            self.assertIs(self.client.get_kernel(v, ARCH), art)
        self.assertEqual(self.client.rpc_calls, before)

    def test_spec_selector_gives_the_same_manifest(self):
        with kforge.Client(self.address) as client:
            spec = kforge.spec_from_preset("glm-5", 8)
            self.assertEqual(client.get_manifest(spec=spec, arch=ARCH), self.manifest)

    def test_server_errors_name_the_field(self):
        with kforge.Client(self.address) as client:
            # Presets are the server's to check (a newer one may know more).
            with self.assertRaises(kforge.KforgeRpcError) as cm:
                client.get_manifest(preset="glm-5", tp=3, arch=ARCH)
            self.assertIn("tensor_parallel: got 3", str(cm.exception))
            spec = kforge.spec_from_preset("glm-5", 8)
            spec.topk = 0
            with self.assertRaises(kforge.KforgeRpcError) as cm:
                client.get_manifest(spec=spec, arch=ARCH)
            self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")
            self.assertIn("topk", str(cm.exception))

    def test_local_copy_survives_the_server(self):
        copy = os.path.join(self.tmp, "copy")
        with kforge.Client(self.address, local_copy_dir=copy) as client:
            client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
            client.prefetch(self.manifest)
        # The copy is a bundle in the C++ layout.
        offline = kforge.Bundle(copy)
        self.assertEqual(offline.get_manifest(preset="glm-5", tp=8, arch=ARCH), self.manifest)
        with open(os.path.join(copy, kbundle.manifest_path(self.manifest))) as f:
            self.assertIn('"sm_count": 0', f.read())
        # With the server gone: the manifest from the copy, kernels with no RPC.
        down = kforge.Client(f"127.0.0.1:{free_port()}", max_attempts=1, local_copy_dir=copy)
        self.assertEqual(down.get_manifest(preset="glm-5", tp=8, arch=ARCH), self.manifest)
        self.assertEqual(down.rpc_calls, 1)
        for v, art in zip(self.manifest.variants, self.artifacts):
            self.assertEqual(down.get_kernel(v, ARCH), art)
        self.assertEqual(down.rpc_calls, 1)
        # A damaged copy is not served: it is fetched again.
        flip_byte(os.path.join(copy, kbundle.kernel_path(self.artifacts[0].key)))
        down = kforge.Client(down.address, max_attempts=1, local_copy_dir=copy)
        with self.assertRaises(kforge.KforgeUnavailable):
            down.get_kernel(self.manifest.variants[0], ARCH)
        with kforge.Client(self.address, local_copy_dir=copy) as client:
            self.assertEqual(client.get_kernel(self.manifest.variants[0], ARCH), self.artifacts[0])
            self.assertEqual(client.rpc_calls, 1)
        kforge.Bundle(copy).get_kernel(self.manifest.variants[0], ARCH)  # rewritten whole

    def bundle(self, name):
        directory = os.path.join(self.tmp, name)
        write_bundle(directory, self.manifest, self.artifacts)
        return directory

    def test_bundle_reads_what_the_layout_says(self):
        b = kforge.Bundle(self.bundle("good"))
        self.assertEqual(b.get_manifest(preset="glm-5", tp=8, arch=ARCH), self.manifest)
        self.assertEqual(b.get_manifest(spec=kforge.spec_from_preset("glm-5", 8), arch="90a"),
                         self.manifest)
        mtp = kforge.spec_from_preset("glm-5", 8)
        mtp.s_q = 2  # not a first choice here, but a variant
        self.assertEqual(b.get_manifest(spec=mtp, arch=ARCH), self.manifest)
        self.assertEqual(b.prefetch(self.manifest), self.artifacts)
        with self.assertRaises(kforge.KforgeNotFound) as cm:
            b.get_manifest(preset="glm-5", tp=4, arch=ARCH)
        self.assertIn(self.manifest.variants[0].module_name, str(cm.exception))  # what it holds
        with self.assertRaises(kforge.KforgeNotFound):
            b.get_manifest(preset="glm-5", tp=8, arch="sm_120a")

    def test_bundle_flipped_byte_is_named(self):
        directory = self.bundle("flipped")
        rel = kbundle.kernel_path(self.artifacts[1].key)
        flip_byte(os.path.join(directory, rel))
        b = kforge.Bundle(directory)
        b.get_kernel(self.manifest.variants[0], ARCH)  # the others are fine
        with self.assertRaises(kforge.KforgeBadAnswer) as cm:
            b.get_kernel(self.manifest.variants[1], ARCH)
        self.assertIn(rel, str(cm.exception))
        self.assertIn("sha256", str(cm.exception))

    def test_bundle_problems_are_named(self):
        directory = self.bundle("missing")
        rel = kbundle.kernel_path(self.artifacts[2].key)
        os.unlink(os.path.join(directory, rel))
        with self.assertRaises(kforge.KforgeNotFound) as cm:
            kforge.Bundle(directory).get_kernel(self.manifest.variants[2], ARCH)
        self.assertIn(rel, str(cm.exception))

        directory = self.bundle("manifest")
        rel = kbundle.manifest_path(self.manifest)
        flip_byte(os.path.join(directory, rel))
        with self.assertRaises(kforge.KforgeBadAnswer) as cm:
            kforge.Bundle(directory)
        self.assertIn(rel, str(cm.exception))

        directory = self.bundle("unlisted")
        with open(os.path.join(directory, "checksums.sha256")) as f:
            lines = [line for line in f if "kernels/" not in line]
        with open(os.path.join(directory, "checksums.sha256"), "w") as f:
            f.writelines(lines)
        with self.assertRaises(kforge.KforgeBadAnswer) as cm:
            kforge.Bundle(directory).get_kernel(self.manifest.variants[0], ARCH)
        self.assertIn("not listed", str(cm.exception))

        directory = self.bundle("marker")
        marker = os.path.join(directory, "kforge-bundle.json")
        with open(marker, "w") as f:
            f.write('{"format": "kforge-bundle", "format_version": 2}\n')
        with self.assertRaisesRegex(kforge.KforgeError, "format_version 2"):
            kforge.Bundle(directory)
        os.unlink(marker)
        with self.assertRaisesRegex(kforge.KforgeError, "kforge-bundle.json is missing"):
            kforge.Bundle(directory)

    def test_bundle_serves_the_wrong_kernel_as_bad_answer(self):
        directory = self.bundle("swapped")
        # kernels/<key0>.kfa holding kernel 1, with a matching checksum.
        rel0 = kbundle.kernel_path(self.artifacts[0].key)
        data = self.artifacts[1].SerializeToString(deterministic=True)
        with open(os.path.join(directory, rel0), "wb") as f:
            f.write(data)
        sums = kbundle.read_checksums(directory)
        sums[rel0] = kbundle.sha256_hex(data)
        with open(os.path.join(directory, "checksums.sha256"), "w") as f:
            f.write(kbundle.format_checksums(sums))
        with self.assertRaises(kforge.KforgeBadAnswer) as cm:
            kforge.Bundle(directory).get_kernel(self.manifest.variants[0], ARCH)
        self.assertIn("key", str(cm.exception))
        self.assertIn(rel0, str(cm.exception))


def flip_byte(path, offset=100):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def run_kforge(*args):
    return subprocess.run([KFORGE, *args], capture_output=True, text=True, timeout=60)


def parse_select(text):
    """The fields of `kforge select`'s description (DescribeSelection)."""
    out = {"variant": int(re.search(r"^variant (\d+):", text, re.M).group(1)),
           "splits": int(re.search(r"^  splits +(\d+)$", text, re.M).group(1)),
           "workspace": int(re.search(r"^  workspace +(\d+) B$", text, re.M).group(1))}
    m = re.search(r"^  main +\S+ grid \((\d+), (\d+), (\d+)\) block (\d+) dynamic smem (\d+) B$",
                  text, re.M)
    out["grid"] = tuple(int(x) for x in m.group(1, 2, 3))
    out["block"], out["smem"] = int(m.group(4)), int(m.group(5))
    m = re.search(r"^  combine +\S+ grid \((\d+), (\d+)\) block (\d+)$", text, re.M)
    out["combine"] = (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None
    return out


def describe(sel):
    return {"variant": sel.variant_index, "splits": sel.num_splits,
            "workspace": sel.workspace_bytes, "grid": sel.grid, "block": sel.block_threads,
            "smem": sel.dynamic_smem_bytes,
            "combine": sel.combine_grid + (sel.combine_block_threads,)
            if sel.needs_combine else None}


def cli_manifest(preset, tp, arch, s_q):
    r = run_kforge("manifest", "--preset", preset, "--tp", str(tp), "--arch", arch,
                   "--s-q", str(s_q))
    if r.returncode != 0:
        raise AssertionError(f"kforge manifest failed: {r.stderr}")
    return json_format.Parse(r.stdout, service_pb2.Manifest())


class SelectorParityTest(unittest.TestCase):
    """kforge.select against runtime/selector.cc through `kforge select`."""

    SMS = 132

    def test_same_choice_and_launch_as_kforge_select(self):
        checked = 0
        for preset, tp, arch, s_q in ((p, t, a, s) for p in ("glm-5", "deepseek-v3.2")
                                      for t in (1, 8) for a in ("sm_90a", "sm_120a")
                                      for s in (1, 2)):
            manifest = cli_manifest(preset, tp, arch, s_q)
            spec = manifest.variants[manifest.choice_order[0]].spec
            for batch in (1, 7, 32, 128):
                with self.subTest(preset=preset, tp=tp, arch=arch, s_q=s_q, batch=batch):
                    r = run_kforge("select", "--preset", preset, "--tp", str(tp), "--arch",
                                   arch, "--sms", str(self.SMS), "--batch", str(batch),
                                   "--sq", str(s_q))
                    self.assertEqual(r.returncode, 0, r.stderr)
                    shape = Shape(batch=batch, s_q=s_q, num_q_heads=spec.num_q_heads,
                                  topk=spec.topk, page_block_size=spec.page_block_size)
                    sel = select(manifest, Device(arch, self.SMS), shape)
                    self.assertEqual(describe(sel), parse_select(r.stdout))
                    self.assertEqual(sel.variant.spec.s_q, s_q)
                    checked += 1
        self.assertEqual(checked, 64)

    def test_same_report_when_nothing_fits(self):
        manifest = cli_manifest("glm-5", 8, ARCH, 1)
        r = run_kforge("select", "--preset", "glm-5", "--tp", "8", "--arch", ARCH, "--sms",
                       "132", "--batch", "4", "--heads", "7", "--page-size", "32")
        self.assertEqual(r.returncode, 1)
        shape = Shape(batch=4, s_q=1, num_q_heads=7, topk=2048, page_block_size=32)
        with self.assertRaises(kforge.KforgeNotFound) as cm:
            select(manifest, Device(ARCH, 132), shape)
        self.assertEqual(str(cm.exception), r.stdout.strip())
        with self.assertRaises(kforge.KforgeNotFound) as cm:
            select(manifest, Device("sm_120a", 132), Shape(4, 1, 8, 2048, 64))
        self.assertIn("arch sm_120a (is sm_90a)", str(cm.exception))

    def test_bad_shapes_and_devices(self):
        manifest = cli_manifest("glm-5", 8, ARCH, 1)
        for device, shape, field in (
                (Device(ARCH, 0), Shape(1, 1, 8, 2048, 64), "device.sm_count"),
                (Device("", 132), Shape(1, 1, 8, 2048, 64), "device.arch"),
                (Device(ARCH, 132), Shape(0, 1, 8, 2048, 64), "shape.batch"),
                (Device(ARCH, 132), Shape(1, 1, 8, 2048, 64, kv_dtype=0), "shape.kv_dtype"),
                (Device(ARCH, 132), Shape(40000, 2, 8, 2048, 64), "grid limit")):
            with self.assertRaisesRegex(ValueError, re.escape(field)):
                select(manifest, device, shape)


def info(name, shape, strides=None, dtype="bfloat16", device=("cuda", 0), ptr=1 << 20,
         size=2):
    """A TensorInfo; contiguous strides unless given."""
    if strides is None:
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    return ops.TensorInfo(name, tuple(shape), tuple(strides), dtype, device, ptr, size)


class OpsChecksTest(unittest.TestCase):
    """kforge.ops input checks and launch planning (no torch, no GPU)."""

    def inputs(self, batch=4, s_q=1, heads=8, pages=40, gap=64, topk=2048):
        page = 64 * 576 + gap  # a page stride with a gap between pages
        return (info("q", (batch, s_q, heads, 576)),
                info("kv_cache", (pages, 64, 1, 576), (page, 576, 576, 1), ptr=1 << 30),
                info("indices", (batch, s_q, topk), dtype="int32", size=4, ptr=1 << 24))

    def test_good_inputs(self):
        q, kv, idx = self.inputs(s_q=2)
        dims = ops.check_decode_inputs(q, kv, idx)
        self.assertEqual((dims.batch, dims.s_q, dims.heads, dims.d_qk, dims.topk,
                          dims.num_pages, dims.page_block_size), (4, 2, 8, 576, 2048, 40, 64))
        self.assertEqual((dims.q_token_stride, dims.q_head_stride), (8 * 576, 576))
        self.assertEqual((dims.kv_page_stride, dims.kv_row_stride), (64 * 576 + 64, 576))
        self.assertEqual(dims.indices_token_stride, 2048)
        kv3 = info("kv_cache", (40, 64, 576), (64 * 576 + 64, 576, 1))
        self.assertEqual(ops.check_decode_inputs(q, kv3, idx), dims)
        # A transposed q ([s_q, batch] storage) cannot be read as tokens.
        qt = info("q", (4, 2, 8, 576), (8 * 576, 4 * 8 * 576, 576, 1))
        with self.assertRaisesRegex(ValueError, "q: dims 0 and 1"):
            ops.check_decode_inputs(qt, kv, idx)

    def expect(self, error, pattern, **replace):
        q, kv, idx = self.inputs()
        args = {"q": q, "kv": kv, "idx": idx}
        for name, value in replace.items():
            args[name] = value
        with self.assertRaisesRegex(error, pattern):
            ops.check_decode_inputs(args["q"], args["kv"], args["idx"])

    def test_bad_inputs(self):
        q, kv, idx = self.inputs()
        self.expect(TypeError, "q: expected dtype bfloat16, got float16",
                    q=q._replace(dtype="float16"))
        self.expect(TypeError, "indices: expected dtype int32, got int64",
                    idx=idx._replace(dtype="int64", element_size=8))
        self.expect(ValueError, "expected a CUDA tensor", q=q._replace(device=("cpu", None)),
                    kv=kv._replace(device=("cpu", None)), idx=idx._replace(device=("cpu", None)))
        self.expect(ValueError, "kv_cache is on cuda:1 but q on cuda:0",
                    kv=kv._replace(device=("cuda", 1)))
        self.expect(ValueError, r"q: expected \[batch, s_q, heads, d_qk\]",
                    q=info("q", (4, 8, 576)))
        self.expect(ValueError, "one latent KV head", kv=info("kv_cache", (40, 64, 2, 576)))
        self.expect(ValueError, "rows of 512 values", kv=info("kv_cache", (40, 64, 512)))
        self.expect(ValueError, r"indices: shape \[4, 2, 2048\]",
                    idx=info("indices", (4, 2, 2048), dtype="int32", size=4))
        self.expect(ValueError, "q: the last dim must be contiguous",
                    q=info("q", (4, 1, 8, 576), (8 * 576 * 2, 8 * 576 * 2, 576 * 2, 2)))
        self.expect(ValueError, "16-byte aligned", q=q._replace(data_ptr=(1 << 20) + 8))
        self.expect(ValueError, "kv_cache: stride 36868 elements",
                    kv=info("kv_cache", (40, 64, 576), (64 * 576 + 4, 576, 1)))
        self.expect(ValueError, "every dim must be >= 1", q=info("q", (0, 1, 8, 576)))

    def test_out_checks(self):
        dims = ops.check_decode_inputs(*self.inputs(batch=3, s_q=2))
        self.assertEqual(ops.check_out(info("out", (3, 2, 8, 512)), dims, 512), (8 * 512, 512))
        # Heads outermost is fine; a stride that folds rows onto each other is not.
        self.assertEqual(ops.check_out(info("out", (3, 2, 8, 512), (2 * 512, 512, 6 * 512, 1)),
                                       dims, 512), (512, 6 * 512))
        with self.assertRaisesRegex(ValueError, "rows overlap"):
            ops.check_out(info("out", (3, 2, 8, 512), (8 * 512, 4 * 512, 256, 1)), dims, 512)
        with self.assertRaisesRegex(ValueError, r"expected shape \[3, 2, 8, 512\]"):
            ops.check_out(info("out", (3, 2, 8, 576)), dims, 512)
        with self.assertRaisesRegex(TypeError, "float32"):
            ops.check_out(info("out", (3, 2, 8, 512), dtype="float32", size=4), dims, 512)

    def test_spec_from_inputs(self):
        dims = ops.check_decode_inputs(*self.inputs(s_q=2))
        spec = ops.spec_for_inputs(dims, 0.0625, True)
        want = kforge.spec_from_preset("glm-5", 8)
        want.s_q = 2
        self.assertEqual(spec, want)
        self.assertEqual(ops.spec_for_inputs(dims, 0.135234, False).softmax_scale,
                         kforge.spec_from_preset("deepseek-v3.2", 1).softmax_scale)
        for bad in (0.0, -1.0, float("nan")):
            with self.assertRaisesRegex(ValueError, "softmax_scale"):
                ops.spec_for_inputs(dims, bad, True)
        self.assertEqual(infer_latent_dims(576), (512, 64))
        self.assertEqual(infer_latent_dims(64), (64, 0))
        self.assertEqual(infer_latent_dims(512, 512), (512, 0))
        self.assertEqual(infer_latent_dims(512, 448), (448, 64))
        with self.assertRaisesRegex(ValueError, "pass out="):
            infer_latent_dims(512)
        for d_qk, d_v in ((600, None), (576, 500), (576, 448)):
            with self.assertRaises(ValueError):
                infer_latent_dims(d_qk, d_v)

    def test_inputs_against_spec(self):
        spec = kforge.spec_from_preset("glm-5", 8)
        dims = ops.check_decode_inputs(*self.inputs())
        ops.check_against_spec(dims, spec, 0.0625, True)
        ops.check_against_spec(dims, spec, None, False)
        for changed, pattern in ((dims._replace(heads=16), "heads"),
                                 (dims._replace(topk=1024), "topk"),
                                 (dims._replace(page_block_size=32), "page_block_size"),
                                 (dims._replace(d_qk=512), "d_qk")):
            with self.assertRaisesRegex(ValueError, pattern):
                ops.check_against_spec(changed, spec, None, False)
        with self.assertRaisesRegex(ValueError, "differs from the kernel's 0.0625"):
            ops.check_against_spec(dims, spec, 0.07, False)
        spec.return_lse = False
        with self.assertRaisesRegex(ValueError, "return_lse"):
            ops.check_against_spec(dims, spec, None, True)

    def test_launch_plan(self):
        manifest = cli_manifest("glm-5", 8, ARCH, 1)
        q, kv, idx = self.inputs(batch=32)
        dims = ops.check_decode_inputs(q, kv, idx)
        sel = select(manifest, Device(ARCH, 132), Shape(32, 1, 8, 2048, 64))
        self.assertGreater(sel.num_splits, 1)
        ws = 1 << 32
        ptrs = ops.Pointers(q=q.data_ptr, kv=kv.data_ptr, indices=idx.data_ptr, out=1 << 28,
                            lse=1 << 27, workspace=ws)
        plan = ops.plan_launch(sel, dims, (8 * 512, 512), ptrs)
        p = plan.main.params
        self.assertEqual((plan.main.grid, plan.main.block, plan.main.smem),
                         (sel.grid, sel.block_threads, sel.dynamic_smem_bytes))
        self.assertEqual((p.q, p.kv, p.indices, p.out, p.lse), tuple(ptrs[:5]))
        self.assertEqual((p.o_accum, p.lse_accum), (ws, ws + sel.num_splits * 32 * 8 * 512 * 4))
        self.assertEqual((p.kv_page_stride, p.kv_row_stride, p.num_kv_slots),
                         (64 * 576 + 64, 576, 40 * 64))
        self.assertEqual((p.num_tokens, p.num_splits), (32, sel.num_splits))
        self.assertEqual(p.tokens_per_split % 64, 0)
        self.assertGreaterEqual(p.tokens_per_split * sel.num_splits, 2048)
        c = plan.combine.params
        self.assertEqual((plan.combine.grid, plan.combine.block), ((32, 2, 1), 128))
        self.assertEqual((c.o_accum, c.lse_accum, c.out, c.lse, c.num_splits),
                         (p.o_accum, p.lse_accum, p.out, p.lse, p.num_splits))
        # One split (264 CTA slots, 256 tokens): no combine, no workspace, and
        # lse may be absent.
        sel1 = select(manifest, Device(ARCH, 132), Shape(256, 1, 8, 2048, 64))
        self.assertEqual((sel1.num_splits, sel1.workspace_bytes), (1, 0))
        dims = ops.check_decode_inputs(*self.inputs(batch=256))
        plan = ops.plan_launch(sel1, dims, (8 * 512, 512), ptrs._replace(lse=0, workspace=0))
        self.assertIsNone(plan.combine)
        self.assertEqual((plan.main.params.lse, plan.main.params.o_accum,
                          plan.main.params.tokens_per_split), (None, None, 2048))

    def test_arch_rules(self):
        self.assertEqual(arch_for_capability(9, 0), "sm_90a")
        self.assertEqual(arch_for_capability(12, 0), "sm_120a")
        self.assertEqual(arch_for_capability(8, 6), "sm_86")
        for arch, capability in (("sm_90a", (9, 0)), ("sm_80", (8, 6)), ("sm_80", (8, 9)),
                                 ("sm_86", (8, 6)), ("120a", (12, 0))):
            check_arch_runs(arch, capability)
        for arch, capability in (("sm_90a", (10, 0)), ("sm_120a", (12, 1)), ("sm_86", (8, 0)),
                                 ("sm_80", (9, 0))):
            with self.assertRaisesRegex(kforge.KforgeError, arch):
                check_arch_runs(arch, capability)


class PackageTest(unittest.TestCase):
    def test_import_without_generated_modules(self):
        """`import kforge` works with no kforge/v1; using a message says
        how to generate them."""
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(os.path.join(PYTHON_DIR, "kforge"), os.path.join(tmp, "kforge"),
                            ignore=shutil.ignore_patterns("v1", "__pycache__"))
            code = textwrap.dedent("""
                import kforge
                try:
                    kforge.Client("127.0.0.1:1")
                except kforge.KforgeError as e:
                    print(e)
            """)
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": tmp}, cwd=tmp, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("scripts/build.sh", r.stdout)

    def test_import_needs_no_torch_or_cuda(self):
        self.assertNotIn("torch", sys.modules)
        self.assertNotIn("cuda", sys.modules)

    def test_default_source_from_environment(self):
        with tempfile.TemporaryDirectory() as tmp:
            code = textwrap.dedent("""
                import kforge
                s = kforge.default_source()
                print(type(s).__name__, getattr(s, "address", getattr(s, "dir", "")))
            """)
            bundle_dir = os.path.join(tmp, "b")
            kbundle.LocalCopy(bundle_dir)  # an empty bundle
            env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")}
            env["PYTHONPATH"] = PYTHON_DIR
            for extra, want in (({}, "Client 127.0.0.1:50051"),
                                ({"KFORGE_SERVER": "10.0.0.1:7"}, "Client 10.0.0.1:7"),
                                ({"KFORGE_BUNDLE": bundle_dir}, f"Bundle {bundle_dir}")):
                r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                   env={**env, **extra}, timeout=60)
                self.assertEqual(r.stdout.strip(), want, r.stderr)
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               env={**env, "KFORGE_SERVER": "x:1", "KFORGE_BUNDLE": bundle_dir},
                               timeout=60)
            self.assertIn("both KFORGE_BUNDLE", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[3:])

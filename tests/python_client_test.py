#!/usr/bin/env python3
"""Tests of the kforge Python client package (python/kforge), no GPU needed:
retries and answer checks against scripted fake servers, a real
`kforge serve`, bundles read offline, launch plans made through the C ABI
against the C++ model library's own (launch_plan_dump, `kforge select`),
garbage into every C ABI call, and the tensor mapping of kforge.ops.

Usage: python_client_test.py PATH/TO/kforge PYTHON_DIR PATH/TO/launch_plan_dump
(PYTHON_DIR holds the kforge package with its generated kforge/v1 modules
and its native library kforge/_native/libkforge_capi.so.)
"""
import collections
import ctypes
import hashlib
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import unittest.mock
from concurrent import futures

KFORGE, PYTHON_DIR, PLAN_DUMP = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, PYTHON_DIR)

import grpc  # noqa: E402

import kforge  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from kforge import _capi  # noqa: E402
from kforge import bundle as kbundle  # noqa: E402
from kforge import ops  # noqa: E402
from kforge.client import backoff_delay  # noqa: E402
from kforge.kernel import module_cubins, read_artifact  # noqa: E402
from kforge.plan import Device, Shape, plan_decode, select  # noqa: E402
from kforge.spec import arch_for_capability, check_arch_runs, infer_latent_dims  # noqa: E402
from kforge.testing import start_server, stop_server  # noqa: E402
from kforge.v1 import artifact_pb2, service_pb2, spec_pb2  # noqa: E402

ARCH = "sm_90a"
SERVICE = "kforge.v1.KernelService"
TMP = tempfile.mkdtemp(prefix="kforge_pytest_")


def param_sizes():
    """sizeof(DecodeParams), sizeof(CombineParams) as the C++ side has them."""
    return tuple(_capi.lib().kforge_sizeof(n) for n in (b"DecodeParams", b"CombineParams"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_compiled = {}


def compiled(arch=ARCH, preset="glm-5", tp=8):
    """The artifact `kforge compile` writes for a preset (NVRTC, no GPU;
    the artifact checks read the cubin's ELF, so fakes will not do)."""
    key = (arch, preset, tp)
    if key not in _compiled:
        out = os.path.join(TMP, f"compiled_{arch}_{preset}_{tp}")
        r = run_kforge("compile", "--preset", preset, "--tp", str(tp), "--arch", arch, "-o", out)
        if r.returncode != 0:
            raise AssertionError(f"kforge compile failed: {r.stderr}")
        _compiled[key] = read_artifact(module_cubins(out)[0])
    art = artifact_pb2.KernelArtifact()
    art.CopyFrom(_compiled[key])
    return art


def fake_pair(arch=ARCH):
    """A manifest with one variant and the artifact that matches it."""
    art = compiled(arch)
    return _capi.manifest_for_artifact(art), art


class ModuleFilesTest(unittest.TestCase):
    """What `kforge compile` writes: <module>.cubin (image 0) and
    <module>.cubin.<i> beside it, read back together."""

    def test_images_are_read_together_and_a_missing_one_is_named(self):
        art = compiled()
        # glm-5 TP8 sm_90a: three programs (main + main_cluster; small +
        # cluster; combine)
        self.assertEqual(len(art.more_cubins), 2)
        out = os.path.join(TMP, f"compiled_{ARCH}_glm-5_8")
        cubins = module_cubins(out)
        self.assertEqual([os.path.basename(c) for c in cubins], [art.module_name + ".cubin"])
        self.assertTrue(os.path.exists(os.path.join(out, art.module_name + ".cubin.1")))
        self.assertEqual(read_artifact(cubins[0]).more_cubins[0], art.more_cubins[0])
        # Another directory with the image missing: an error naming it.
        other = os.path.join(TMP, "missing_image")
        os.makedirs(other, exist_ok=True)
        for suffix in (".cubin", ".json"):
            shutil.copy(os.path.join(out, art.module_name + suffix), other)
        with self.assertRaisesRegex(kforge.KforgeError, r"\.cubin\.1: cubin image 1 of 3"):
            read_artifact(os.path.join(other, art.module_name + ".cubin"))


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
                          request.arch), ("glm-5", 8, ARCH))
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
        # case -> (reply, what the message names: CheckArtifactForVariant's words)
        cases = {
            "key": (self.kernel_reply(key="cd" * 32), "key"),
            "module_name": (self.kernel_reply(module_name="other"), "module_name"),
            "arch": (self.kernel_reply(arch="sm_120a"), "arch"),
            "empty cubin": (self.kernel_reply(cubin=b""), 'cubin: expected "non-empty"'),
            "not an ELF": (self.kernel_reply(cubin=b"MZ" + bytes(60)), "cubin is unreadable"),
            "params_bytes": (self.kernel_reply(params_bytes=128), "params_bytes"),
            "spec": (service_pb2.GetKernelResponse(artifact=self.artifact), "spec"),
            "tiling": (self.kernel_reply(), "tiling"),
        }
        cases["spec"][0].artifact.spec.sparse_mla_decode.CopyFrom(other_spec)
        cases["tiling"][0].artifact.tiling.token_tile += 1
        # The right metadata around a cubin of other entries: the ELF is read.
        other = compiled(ARCH, "deepseek-v3.2", 1)
        if other.main_entry != self.artifact.main_entry:
            cases["does not export"] = (self.kernel_reply(cubin=other.cubin), "no such entry")
        for what, (reply, words) in cases.items():
            with self.subTest(what):
                fake = self.fake(manifests=[self.manifest], kernels=[reply, self.kernel_reply()])
                client = fake.client()
                with self.assertRaises(kforge.KforgeBadAnswer) as cm:
                    client.get_kernel(self.manifest.variants[0], ARCH)
                self.assertIn(words, str(cm.exception))
                self.assertIn(fake.address, str(cm.exception))
                # Neither retried nor kept: the next call asks again.
                self.assertEqual(fake.calls["GetKernel"], 1)
                self.assertEqual(client.get_kernel(self.manifest.variants[0], ARCH),
                                 self.artifact)
                self.assertEqual(fake.calls["GetKernel"], 2)

    def test_names_that_are_not_file_names_are_bad_answers(self):
        # Variant and kernel agree, but on a name that would leave a directory.
        for field in ("module_name", "key"):
            for name in ("../../escape", "a/b", ".hidden"):
                with self.subTest(field=field, name=name):
                    variant = service_pb2.ManifestVariant()
                    variant.CopyFrom(self.manifest.variants[0])
                    setattr(variant, field, name)
                    fake = self.fake(manifests=[self.manifest],
                                     kernels=[self.kernel_reply(**{field: name})])
                    with self.assertRaises(kforge.KforgeBadAnswer) as cm:
                        fake.client().get_kernel(variant, ARCH)
                    self.assertIn(f'{field}: got "', str(cm.exception))

    def test_wrong_manifests_are_bad_answers(self):
        other_arch, _ = fake_pair("sm_120a")
        empty = service_pb2.Manifest(arch=ARCH)
        for manifest, what in ((other_arch, "sm_120a"), (empty, "no variants")):
            fake = self.fake(manifests=[manifest])
            with self.assertRaises(kforge.KforgeBadAnswer) as cm:
                fake.client().get_manifest(preset="glm-5", tp=8, arch=ARCH)
            self.assertIn(what, str(cm.exception))

    def test_first_answers_only_when_asked_and_never_kept(self):
        partial = self.kernel_reply(partial=True)
        fake = self.fake(manifests=[self.manifest], kernels=[partial])
        with self.assertRaises(kforge.KforgeBadAnswer) as cm:
            fake.client().get_kernel(self.manifest.variants[0], ARCH)
        self.assertIn("first answer", str(cm.exception))
        self.assertFalse(fake.requests["GetKernel"][-1].first_answer)
        fake = self.fake(manifests=[self.manifest],
                         kernels=[partial, partial, self.kernel_reply()])
        client = fake.client(first_answer=True)
        for _ in range(2):
            self.assertTrue(client.get_kernel(self.manifest.variants[0], ARCH).partial)
            self.assertTrue(fake.requests["GetKernel"][-1].first_answer)
        for _ in range(2):
            self.assertFalse(client.get_kernel(self.manifest.variants[0], ARCH).partial)
        self.assertEqual(fake.calls["GetKernel"], 3)

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


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def manifest_to_json(manifest):
    """bundle/bundle.cc's ManifestJson options: proto field names, every
    field printed (zeros included), indented, newline at the end."""
    try:
        text = json_format.MessageToJson(manifest, preserving_proto_field_name=True,
                                         including_default_value_fields=True, indent=1)
    except TypeError:  # protobuf >= 5.26 renamed the option
        text = json_format.MessageToJson(manifest, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True, indent=1)
    return text + "\n"


def read_checksums(directory):
    """{relative path: sha256 hex} of DIR/checksums.sha256."""
    with open(os.path.join(directory, "checksums.sha256")) as f:
        return {line.split()[1]: line.split()[0] for line in f if line.strip()}


def write_checksums(directory, sums):
    with open(os.path.join(directory, "checksums.sha256"), "w") as f:
        f.write("".join(f"{sums[name]}  {name}\n" for name in sorted(sums)))


def bundle_format_version():
    """The format version the C++ BundleWriter writes (model/format.h)."""
    directory = tempfile.mkdtemp(dir=TMP)
    kbundle.LocalCopy(directory)
    with open(os.path.join(directory, "kforge-bundle.json")) as f:
        return json.load(f)["format_version"]


def write_bundle(directory, manifest, artifacts):
    """A bundle written by hand from bundle/bundle.h's layout comment, with
    bundle/bundle.cc's JSON options (proto field names, every field)."""
    files = {}
    for art in artifacts:
        files[f"kernels/{art.key}.kfa"] = art.SerializeToString(deterministic=True)
    first = manifest.variants[manifest.choice_order[0]].module_name
    files[f"manifests/{first}.json"] = manifest_to_json(manifest).encode()
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(directory, rel)), exist_ok=True)
        with open(os.path.join(directory, rel), "wb") as f:
            f.write(data)
    with open(os.path.join(directory, "kforge-bundle.json"), "w") as f:
        f.write('{"format": "kforge-bundle", "format_version": %d}\n' % bundle_format_version())
    write_checksums(directory, {rel: sha256_hex(data) for rel, data in files.items()})


class RealServerTest(unittest.TestCase):
    """Against `kforge serve` (compiles glm-5 at TP 8, 4 and 2 for sm_90a,
    about a second each)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kforge_pyclient_")
        cls.proc, cls.address = start_server(KFORGE, os.path.join(cls.tmp, "cache"),
                                             os.path.join(cls.tmp, "server.log"),
                                             args=("--workers", "2"))
        cls.client = kforge.Client(cls.address, timeout=120)
        cls.manifest = cls.client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
        cls.artifacts = cls.client.prefetch(cls.manifest)
        # Bundles that must hold several kernels: the manifest with glm-5 at
        # TP 4 and 2 appended as further variants (a real manifest has one).
        cls.multi = type(cls.manifest)()
        cls.multi.CopyFrom(cls.manifest)
        for tp in (4, 2):
            other = cls.client.get_manifest(preset="glm-5", tp=tp, arch=ARCH)
            cls.multi.choice_order.append(len(cls.multi.variants))
            cls.multi.variants.append(other.variants[0])
        cls.multi_artifacts = cls.client.prefetch(cls.multi)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        try:
            assert stop_server(cls.proc) == 0, "kforge serve did not exit cleanly on SIGTERM"
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_manifest_and_kernels(self):
        m = self.manifest
        # One variant: it serves every s_q.
        self.assertEqual((m.arch, len(m.variants)), (ARCH, 1))
        self.assertEqual([v.spec.sparse_mla_decode.s_q for v in m.variants], [0])
        # The Python preset table matches the server's.
        self.assertEqual(m.variants[m.choice_order[0]].spec.sparse_mla_decode,
                         kforge.spec_from_preset("glm-5", 8))
        self.assertEqual([a.key for a in self.artifacts], [v.key for v in m.variants])
        for art in self.artifacts:
            self.assertGreater(len(art.cubin), 1000)
            # The parameter blocks PlanDecode fills are the compiled kernel's.
            self.assertEqual((art.params_bytes, art.combine_params_bytes), param_sizes())

    def test_dsa_indexer_from_the_server(self):
        # kind="dsa-indexer" on a preset: the indexer's manifest and module,
        # checked like every kernel; its heads do not shrink with tp.
        from kforge.dsa_indexer import description_from_source
        description, images = description_from_source(self.client, "glm-5", ARCH, tp=8)
        self.assertEqual(description["module_name"],
                         f"dsa_indexer_h32_d128_topk2048_pb64_{ARCH.replace('_', '')}")
        self.assertEqual(description["spec"]["dsa_indexer"]["index_heads"], 32)
        self.assertEqual(description["indexer"]["logits_entry"], "dsa_indexer_logits")
        # Its cubin images: one a program (logits, top-k, cluster top-k on sm_90).
        self.assertEqual(len(images), 3)
        self.assertTrue(all(len(i) > 1000 for i in images))
        # The launches are the C++ plan's (kforge._capi.plan_indexer), with
        # the parameter blocks the module was compiled for.
        from google.protobuf import json_format
        from kforge import _capi
        spec = json_format.ParseDict(description["spec"], spec_pb2.KernelSpec(),
                                     ignore_unknown_fields=True).SerializeToString()
        launch = json_format.ParseDict(description["indexer"], artifact_pb2.IndexerLaunch(),
                                       ignore_unknown_fields=True).SerializeToString()
        rows, heads, context = 6, 32, 5000
        args = _capi.IndexerLogitsArgs(
            q=1 << 32, weights=2 << 32, index_cache=3 << 32, block_table=4 << 32,
            context_lens=5 << 32, logits=6 << 32, q_row_stride=heads * 128,
            weights_row_stride=heads, page_stride=64 * 132, block_table_stride=80,
            block_table_cols=80, logits_stride=context, logits_cols=context, batch=3, s_q=2,
            max_context=context)
        plan = _capi.plan_indexer("logits", spec, launch, args)
        self.assertEqual(plan.main_entry, "dsa_indexer_logits")
        self.assertEqual(len(plan.main_params), int(description["indexer"]["logits_params_bytes"]))
        self.assertEqual(plan.grid_y, rows)
        args.s_q = 5
        with self.assertRaisesRegex(ValueError, "s_q: got 5"):
            _capi.plan_indexer("logits", spec, launch, args)
        topk = _capi.IndexerTopkArgs(logits=6 << 32, context_lens=5 << 32, indices=7 << 32,
                                     logits_stride=context, indices_stride=2048, batch=3, s_q=2,
                                     slot_page_size=64, max_context=context)
        plan = _capi.plan_indexer("topk", spec, launch, topk)
        self.assertEqual(len(plan.main_params), int(description["indexer"]["topk_params_bytes"]))
        # Few rows on sm_90+: the cluster entry, its CTAs per row, launched
        # programmatically; the module description names the entry.
        cluster = description["indexer"]["topk_cluster"]
        self.assertEqual(plan.main_entry, cluster["entry"])
        self.assertEqual(plan.grid_x, rows * cluster["ctas"])
        self.assertTrue(plan.programmatic)
        topk.indices_stride = 100
        with self.assertRaisesRegex(ValueError, "indices_stride"):
            _capi.plan_indexer("topk", spec, launch, topk)
        # Prefill through the same structs: query_start's rows, s_q 0.
        args.s_q, args.rows, args.query_start = 0, 777, 8 << 32
        plan = _capi.plan_indexer("logits", spec, launch, args)
        self.assertEqual(plan.grid_y, 777)
        topk.indices_stride, topk.s_q, topk.rows, topk.query_start = 2048, 0, 777, 8 << 32
        plan = _capi.plan_indexer("topk", spec, launch, topk)
        self.assertEqual((plan.main_entry, plan.grid_x), ("dsa_indexer_topk", 777))
        topk.s_q = 1
        with self.assertRaisesRegex(ValueError, "s_q: got 1, supported 0 with query_start"):
            _capi.plan_indexer("topk", spec, launch, topk)
        with self.assertRaises(ValueError):
            self.client.get_manifest(preset="glm-5", arch=ARCH, kind="indexer")

    def test_one_module_loader_checks_entries_by_role(self):
        # kforge._module, the loader both families use (the C++
        # KernelModule through the C ABI): the entries the artifact lists
        # (the served cubin's kernels, each with the block its role takes),
        # checked before anything touches a driver, so the same refusals
        # come on this GPU-less machine.
        from kforge import _module
        from kforge.dsa_indexer import description_from_source
        from kforge.errors import KforgeBadAnswer, KforgeError, KforgeInvalidArgument
        art = self.artifacts[0]
        role_name = artifact_pb2.EntryRole.Name
        entries = [(e.name, role_name(e.role), e.params_bytes) for e in art.entries]
        self.assertEqual(sorted(name for name, _, _ in entries),
                         sorted(k.name for k in art.cubin_info.kernels))
        self.assertEqual(entries[0][:2], ("sparse_mla_decode_main", "ENTRY_ROLE_ATTENTION"))
        self.assertEqual(entries[-1][:2], ("sparse_mla_decode_combine", "ENTRY_ROLE_COMBINE"))
        self.assertEqual((entries[0][2], entries[-1][2]), param_sizes())
        self.assertTrue(art.cubin)

        def load(artifact, expected=_module.SPARSE_MLA_PARAMS, device=0):
            return _module.KernelModule(artifact, expected, device)

        with self.assertRaisesRegex(KforgeError, "role ENTRY_ROLE_ATTENTION, which this "
                                                 "runtime does not launch"):
            load(art, _module.DSA_INDEXER_PARAMS)
        bad = artifact_pb2.KernelArtifact()
        bad.CopyFrom(art)
        bad.entries[0].params_bytes = 8
        with self.assertRaisesRegex(KforgeError, r"entries\[sparse_mla_decode_main\]"
                                                 r"\.params_bytes = 8 but this runtime's "
                                                 r"sizeof\(DecodeParams\)"):
            load(bad)
        bad.CopyFrom(art)
        bad.entries[0].params_bytes = 0  # not recorded: the cubin's size still checks
        bad.cubin_info.kernels[0].param_bytes = 8
        with self.assertRaisesRegex(KforgeError, "takes 8 parameter bytes but this runtime "
                                                 "passes sizeof.DecodeParams."):
            load(bad)
        bad.CopyFrom(art)
        del bad.cubin_info.kernels[:]
        with self.assertRaisesRegex(KforgeBadAnswer, "cubin_info lists no kernel"):
            load(bad)
        bad.CopyFrom(art)
        del bad.entries[:]
        with self.assertRaisesRegex(KforgeError, "lists no entries"):
            load(bad)
        bad.CopyFrom(art)
        bad.cubin = b""
        with self.assertRaisesRegex(KforgeInvalidArgument, "carries no cubin"):
            load(bad)
        with self.assertRaisesRegex(ValueError, "device_ordinal: -1"):
            load(art, device=-1)
        # A good module: on a machine without a driver, the clear error
        # (and never at import).
        try:
            version = _module.driver()
        except KforgeError as e:
            self.assertIn("loading kforge kernels needs the CUDA driver", str(e))
            with self.assertRaisesRegex(KforgeError, "loading kforge kernels needs the CUDA "
                                                     "driver"):
                load(art)
        else:
            self.assertGreaterEqual(version, 12000)
            self.check_loaded_module(load, art)
        # The indexer's module, from its JSON description: its own roles.
        description, images = description_from_source(self.client, "glm-5", ARCH, tp=8)
        indexer = _module.artifact_of(description, images)
        self.assertEqual(_module.images_of(indexer), images)
        self.assertEqual([role_name(e.role) for e in indexer.entries],
                         ["ENTRY_ROLE_INDEXER_LOGITS", "ENTRY_ROLE_INDEXER_TOPK",
                          "ENTRY_ROLE_INDEXER_TOPK"])
        self.assertEqual(indexer.entries[0].params_bytes,
                         int(description["indexer"]["logits_params_bytes"]))
        with self.assertRaisesRegex(KforgeError, "ENTRY_ROLE_INDEXER_LOGITS"):
            load(indexer)
        try:
            load(indexer, _module.DSA_INDEXER_PARAMS).close()
        except KforgeError as e:  # no driver here: the checks passed
            self.assertIn("needs the CUDA driver", str(e))
        # The indexer no longer fills sparse MLA's entry fields.
        self.assertNotIn("main_entry", {k for k, v in description.items() if v})

    def check_loaded_module(self, load, art):
        """Where a driver and a GPU this sm_90a module runs on are present:
        the loaded module's entries and what its launch refuses before
        anything is enqueued."""
        from kforge.errors import KforgeError, KforgeInvalidArgument
        try:
            module = load(art)
        except KforgeError as e:
            print(f"loaded-module checks skipped: {e}", file=sys.stderr)
            return
        try:
            index, nbytes = module.entry("sparse_mla_decode_main")
            self.assertEqual((index, nbytes), (0, param_sizes()[0]))
            with self.assertRaisesRegex(KforgeError, "has no entry named 'nope'"):
                module.entry("nope")
            block = bytes(nbytes)
            with self.assertRaisesRegex(KforgeInvalidArgument, "params_size: 8 bytes"):
                module.launch(index, block, 8, 1, 1, 1, 128, 0, 0)
            with self.assertRaisesRegex(KforgeInvalidArgument, "entry 99"):
                module.launch(99, block, nbytes, 1, 1, 1, 128, 0, 0)
            try:  # no context is current here, unless something made one
                module.load_into_current_context()
            except KforgeError as e:
                self.assertIn("cuKernelGetFunction(", str(e))
        finally:
            module.close()
        with self.assertRaisesRegex(KforgeError, "used after close"):
            module.entry("sparse_mla_decode_combine")

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
            self.assertIn('"choice_order"', f.read())
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
        write_bundle(directory, self.multi, self.multi_artifacts)
        return directory

    def test_bundle_reads_what_the_layout_says(self):
        b = kforge.Bundle(self.bundle("good"))
        self.assertEqual(b.get_manifest(preset="glm-5", tp=8, arch=ARCH), self.multi)
        self.assertEqual(b.get_manifest(spec=kforge.spec_from_preset("glm-5", 8), arch="90a"),
                         self.multi)
        mtp = kforge.spec_from_preset("glm-5", 8)
        mtp.s_q = 2  # not a first choice here, but a variant
        self.assertEqual(b.get_manifest(spec=mtp, arch=ARCH), self.multi)
        self.assertEqual(b.prefetch(self.multi), self.multi_artifacts)
        with self.assertRaises(kforge.KforgeNotFound) as cm:
            b.get_manifest(preset="glm-5", tp=4, arch=ARCH)
        self.assertIn(self.multi.variants[0].module_name, str(cm.exception))  # what it holds
        with self.assertRaises(kforge.KforgeNotFound):
            b.get_manifest(preset="glm-5", tp=8, arch="sm_120a")

    def test_bundle_flipped_byte_is_named(self):
        directory = self.bundle("flipped")
        rel = kbundle.kernel_path(self.multi_artifacts[1].key)
        flip_byte(os.path.join(directory, rel))
        b = kforge.Bundle(directory)
        b.get_kernel(self.multi.variants[0], ARCH)  # the others are fine
        with self.assertRaises(kforge.KforgeBadAnswer) as cm:
            b.get_kernel(self.multi.variants[1], ARCH)
        self.assertIn(rel, str(cm.exception))
        self.assertIn("sha256", str(cm.exception))

    def test_bundle_problems_are_named(self):
        directory = self.bundle("missing")
        rel = kbundle.kernel_path(self.multi_artifacts[2].key)
        os.unlink(os.path.join(directory, rel))
        # Listed but missing is a damaged bundle (BundleSource: DATA_LOSS).
        with self.assertRaises(kforge.KforgeBadAnswer) as cm:
            kforge.Bundle(directory).get_kernel(self.multi.variants[2], ARCH)
        self.assertIn(rel, str(cm.exception))

        directory = self.bundle("manifest")
        rel = kbundle.manifest_path(self.multi)
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
            kforge.Bundle(directory).get_kernel(self.multi.variants[0], ARCH)
        self.assertIn("not listed", str(cm.exception))

        directory = self.bundle("marker")
        marker = os.path.join(directory, "kforge-bundle.json")
        with open(marker, "w") as f:
            f.write('{"format": "kforge-bundle", "format_version": 99}\n')
        with self.assertRaisesRegex(kforge.KforgeError, "format version 99"):
            kforge.Bundle(directory)
        os.unlink(marker)
        with self.assertRaisesRegex(kforge.KforgeError, "has no kforge-bundle.json"):
            kforge.Bundle(directory)

    def test_bundle_serves_the_wrong_kernel_as_bad_answer(self):
        directory = self.bundle("swapped")
        # kernels/<key0>.kfa holding kernel 1, with a matching checksum.
        rel0 = kbundle.kernel_path(self.multi_artifacts[0].key)
        data = self.multi_artifacts[1].SerializeToString(deterministic=True)
        with open(os.path.join(directory, rel0), "wb") as f:
            f.write(data)
        sums = read_checksums(directory)
        sums[rel0] = sha256_hex(data)
        write_checksums(directory, sums)
        with self.assertRaises(kforge.KforgeBadAnswer) as cm:
            kforge.Bundle(directory).get_kernel(self.multi.variants[0], ARCH)
        self.assertIn("key", str(cm.exception))
        self.assertIn(rel0, str(cm.exception))


def openssl(*args):
    subprocess.run(("openssl",) + args, check=True, capture_output=True)


class SecurityTest(unittest.TestCase):
    """TLS, bearer tokens and signed bundles through the Python package, with
    certificates and keys made by the openssl CLI at run time."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kforge_pysec_")
        p = lambda name: os.path.join(cls.tmp, name)  # noqa: E731
        cls.p = staticmethod(p)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=kforge py ca",
                "-keyout", p("ca.key"), "-out", p("ca.pem"))
        openssl("req", *ec, "-subj", "/CN=localhost", "-keyout", p("server.key"),
                "-out", p("server.csr"))
        with open(p("server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        openssl("x509", "-req", "-in", p("server.csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"),
                "-CAcreateserial", "-days", "1", "-extfile", p("server.ext"),
                "-out", p("server.pem"))
        cls.token = "py-" + os.urandom(16).hex()
        with open(p("tokens"), "w") as f:
            f.write(cls.token + "\n")
        os.chmod(p("tokens"), 0o600)  # kforge serve refuses a token file others can read
        cls.proc, cls.address = start_server(
            KFORGE, p("cache"), p("server.log"),
            args=("--workers", "1", "--tls-cert", p("server.pem"), "--tls-key", p("server.key"),
                  "--auth-token-file", p("tokens")))

    @classmethod
    def tearDownClass(cls):
        try:
            assert stop_server(cls.proc) == 0, "kforge serve did not exit cleanly on SIGTERM"
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_tls_and_token(self):
        p = self.p
        with kforge.Client(self.address, tls_ca=p("ca.pem"), token_file=p("tokens")) as client:
            manifest = client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
            self.assertEqual(manifest.arch, ARCH)
        with kforge.Client(self.address, tls_ca=p("ca.pem"), token=self.token) as client:
            client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
        for kwargs in ({}, {"token": "wrong-" + self.token}):
            with kforge.Client(self.address, tls_ca=p("ca.pem"), max_attempts=1,
                               **kwargs) as client:
                with self.assertRaises(kforge.KforgeRpcError) as cm:
                    client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
                self.assertEqual(cm.exception.code_name, "UNAUTHENTICATED")

    def test_plain_client_is_told_the_server_serves_tls(self):
        with kforge.Client(self.address, max_attempts=1) as client:
            with self.assertRaises(kforge.KforgeUnavailable) as cm:
                client.get_manifest(preset="glm-5", tp=8, arch=ARCH)
            self.assertIn("probably serves TLS", str(cm.exception))
        with self.assertRaises(ValueError):
            kforge.Client(self.address, token=self.token)  # never in plain text
        with self.assertRaises(kforge.KforgeError) as cm:
            kforge.Client(self.address, tls_ca=os.path.join(self.tmp, "missing.pem"))
        self.assertIn("tls_ca", str(cm.exception))

    def test_bundle_trust(self):
        p = self.p
        for name in ("signer", "other"):
            subprocess.run([KFORGE, "keygen", "--out", p(name)], check=True, capture_output=True)
        with open(p("one.json"), "w") as f:
            f.write('{"models": [{"preset": "glm-5", "tp": [8]}], "archs": ["%s"]}' % ARCH)
        subprocess.run([KFORGE, "prebuild", p("one.json"), "--out", p("bundle"), "-j", "1",
                        "--sign", p("signer.key")], check=True, capture_output=True)
        bundle = kforge.Bundle(p("bundle"), trust=p("signer.pub"))
        manifest = bundle.get_manifest(preset="glm-5", tp=8, arch=ARCH)
        self.assertGreater(len(bundle.get_kernel(manifest.variants[0], ARCH).cubin), 1000)
        with self.assertRaises(kforge.KforgeError) as cm:
            kforge.Bundle(p("bundle"), trust=p("other.pub"))
        self.assertIn("is not a signature", str(cm.exception))
        os.remove(os.path.join(p("bundle"), "checksums.sha256.sig"))
        kforge.Bundle(p("bundle"))  # no trust key: unsigned is fine
        with self.assertRaises(kforge.KforgeError) as cm:
            kforge.Bundle(p("bundle"), trust=p("signer.pub"))
        self.assertIn("is not signed", str(cm.exception))


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
           "splits": int(re.search(r"^  splits +(\d+)", text, re.M).group(1)),
           "workspace": int(re.search(r"^  workspace +(\d+) B$", text, re.M).group(1))}
    m = re.search(r"^  main +(\S+)(?: \(small-batch path\))?"
                  r"( \(clusters of \d+ splits, merged in the kernel\))? grid \((\d+), (\d+), (\d+)\) "
                  r"block (\d+) dynamic smem (\d+) B$", text, re.M)
    out["entry"], out["cluster"] = m.group(1), m.group(2) is not None
    out["grid"] = tuple(int(x) for x in m.group(3, 4, 5))
    out["block"], out["smem"] = int(m.group(6)), int(m.group(7))
    m = re.search(r"^  combine +\S+ grid \((\d+), (\d+)\) block (\d+)$", text, re.M)
    out["combine"] = (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None
    return out


def describe(sel):
    return {"variant": sel.variant_index, "splits": sel.num_splits,
            "entry": sel.plan.main_entry, "cluster": sel.plan.cluster,
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
    """kforge.select (the C++ Select through the C ABI) against `kforge
    select`'s description of the same selection."""

    SMS = 132

    def test_same_choice_and_launch_as_kforge_select(self):
        checked = 0
        clustered = 0
        for preset, tp, arch, s_q in ((p, t, a, s) for p in ("glm-5", "deepseek-v3.2")
                                      for t in (1, 8) for a in ("sm_90a", "sm_120a")
                                      for s in (1, 2)):
            manifest = cli_manifest(preset, tp, arch, s_q)
            spec = manifest.variants[manifest.choice_order[0]].spec.sparse_mla_decode
            # Cluster capacity unknown (0) and the H200's 7.
            for batch, clusters in ((b, c) for b in (1, 7, 32, 128) for c in (0, 7)):
                with self.subTest(preset=preset, tp=tp, arch=arch, s_q=s_q, batch=batch,
                                  clusters=clusters):
                    r = run_kforge("select", "--preset", preset, "--tp", str(tp), "--arch",
                                   arch, "--sms", str(self.SMS), "--batch", str(batch),
                                   "--sq", str(s_q), "--clusters", str(clusters))
                    self.assertEqual(r.returncode, 0, r.stderr)
                    shape = Shape(batch=batch, s_q=s_q, num_q_heads=spec.num_q_heads,
                                  topk=spec.topk, page_block_size=spec.page_block_size)
                    sel = select(manifest, Device(arch, self.SMS, 0, clusters), shape)
                    self.assertEqual(describe(sel), parse_select(r.stdout))
                    self.assertEqual(sel.num_tokens, batch * s_q)
                    checked += 1
                    clustered += sel.plan.cluster
        self.assertEqual(checked, 128)
        self.assertGreater(clustered, 0)

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
        max_splits = select(manifest, Device(ARCH, 132), Shape(1, 1, 8, 2048, 64)).max_splits
        for device, shape, field in (
                (Device(ARCH, 0), Shape(1, 1, 8, 2048, 64), "device.sm_count"),
                (Device("", 132), Shape(1, 1, 8, 2048, 64), "device.arch"),
                (Device(ARCH, 132), Shape(0, 1, 8, 2048, 64), "shape.batch"),
                (Device(ARCH, 132), Shape(1, 1, 8, 2048, 64, kv_dtype=0), "shape.kv_dtype"),
                (Device(ARCH, 132), Shape(40000, 2, 8, 2048, 64), "grid limit"),
                (Device(ARCH, 132, forced_num_splits=-1), Shape(1, 1, 8, 2048, 64),
                 "device.forced_num_splits"),
                (Device(ARCH, 132, forced_num_splits=max_splits + 1), Shape(1, 1, 8, 2048, 64),
                 f"supported 1..{max_splits}")):
            with self.assertRaisesRegex(ValueError, re.escape(field)):
                select(manifest, device, shape)

    def test_forced_splits(self):
        manifest = cli_manifest("glm-5", 8, ARCH, 1)
        shape = Shape(256, 1, 8, 2048, 64)
        self.assertEqual(select(manifest, Device(ARCH, 132), shape).num_splits, 1)
        # One split per token tile at most (glm-5 TP8 on sm_90a: 2048 / 32).
        tile = manifest.variants[0].tiling.token_tile
        self.assertEqual(select(manifest, Device(ARCH, 132), shape).max_splits, 2048 // tile)
        for forced in (1, 2, 7, 2048 // tile):
            sel = select(manifest, Device(ARCH, 132, forced), shape)
            self.assertEqual((sel.num_splits, sel.grid[1]), (forced, forced))
            self.assertGreaterEqual(sel.tokens_per_split * forced, 2048)
            self.assertEqual(sel.needs_combine, forced > 1)


# The addresses tests/launch_plan_dump.cc plans with.
DUMP_Q, DUMP_KV, DUMP_INDICES, DUMP_OUT, DUMP_LSE, DUMP_WORKSPACE = (
    0x10000000, 0x20000000, 0x30000000, 0x40000000, 0x50000000, 0x60000000)
DUMP_PAGES, DUMP_PAGE_GAP = 64, 64


def spec_manifest(arch, heads, topk=2048, page=64, return_lse=True, scale=0.0625):
    """`kforge manifest` for a spec (written to a file), as (manifest, path)."""
    spec = {"num_q_heads": heads,
            "kv_lora_rank": 512, "rope_dim": 64, "topk": topk, "s_q": 1,
            "kv_cache_dtype": "KV_CACHE_DTYPE_BF16", "page_block_size": page,
            "softmax_scale": scale, "return_lse": return_lse}
    name = f"{arch}_h{heads}_k{topk}_p{page}_{return_lse}"
    spec_path = os.path.join(TMP, f"spec_{name}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    r = run_kforge("manifest", "--spec", spec_path, "--arch", arch)
    if r.returncode != 0:
        raise AssertionError(f"kforge manifest failed: {r.stderr}")
    path = os.path.join(TMP, f"manifest_{name}.json")
    with open(path, "w") as f:
        f.write(r.stdout)
    return json_format.Parse(r.stdout, service_pb2.Manifest()), path


def python_decode_plan(manifest, device, batch, s_q):
    """PlanDecode through the package's tensor mapping, for the tensors
    launch_plan_dump describes."""
    spec = manifest.variants[0].spec.sparse_mla_decode
    heads, d_v, pbs = spec.num_q_heads, spec.kv_lora_rank, spec.page_block_size
    d_qk = d_v + spec.rope_dim
    q = info("q", (batch, s_q, heads, d_qk), ptr=DUMP_Q)
    kv = info("kv_cache", (DUMP_PAGES, pbs, d_qk), (pbs * d_qk + DUMP_PAGE_GAP, d_qk, 1),
              ptr=DUMP_KV)
    idx = info("indices", (batch, s_q, spec.topk), dtype="int32", size=4, ptr=DUMP_INDICES)
    out = info("out", (batch, s_q, heads, d_v), ptr=DUMP_OUT)
    dims = ops.check_decode_inputs(q, kv, idx)
    args = ops.make_decode_args(q, kv, idx, dims, out, ops.check_out(out, dims),
                                DUMP_LSE if spec.return_lse else 0, spec.softmax_scale,
                                spec.kv_cache_dtype)
    return plan_decode(manifest, device, args, DUMP_WORKSPACE)


class PlanParityTest(unittest.TestCase):
    """The same grid of shapes through the C++ model library
    (tests/launch_plan_dump.cc) and through the Python package: identical
    launch plans (variant, grid, splits, tokens per split, workspace, smem,
    parameter bytes) and identical errors."""

    ARCHS = ("sm_90a", "sm_80", "sm_86", "sm_100a", "sm_120a")
    HEADS = (1, 5, 8, 16, 24, 32, 64, 100, 128)
    CASES = [(sms, forced, batch, s_q) for sms in (1, 108, 132, 170)
             for forced in (0, 1, 2, 5, 32, 10000)
             for batch in (1, 2, 7, 16, 33, 128, 256) for s_q in (1, 2, 3, 4)]

    def check_manifest(self, arch, heads, **spec):
        manifest, path = spec_manifest(arch, heads, **spec)
        lines = "".join(f"{arch} {sms} {forced} {batch} {s_q}\n"
                        for sms, forced, batch, s_q in self.CASES)
        r = subprocess.run([PLAN_DUMP, path], input=lines, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout.splitlines()
        self.assertEqual(len(out), 2 * len(self.CASES))
        spec_ = manifest.variants[0].spec.sparse_mla_decode
        plans = 0
        for i, (sms, forced, batch, s_q) in enumerate(self.CASES):
            device = Device(arch, sms, forced)
            shape = Shape(batch, s_q, spec_.num_q_heads, spec_.topk, spec_.page_block_size)
            for line, make in ((out[2 * i], lambda: select(manifest, device, shape)),
                               (out[2 * i + 1],
                                lambda: python_decode_plan(manifest, device, batch, s_q))):
                what, rest = line.split(" ", 1)
                case = f"{arch} heads {heads} {spec}: {what} sms {sms} forced {forced} " \
                       f"batch {batch} s_q {s_q}"
                if rest.startswith("error "):
                    code, message = rest[len("error "):].split(" ", 1)
                    with self.assertRaises(kforge.KforgeError, msg=case) as cm:
                        make()
                    self.assertEqual(str(cm.exception), message, case)
                    self.assertEqual(getattr(cm.exception, "code", None) or
                                     {kforge.KforgeNotFound: 5}.get(type(cm.exception)),
                                     int(code), case)
                    continue
                want = json_format.Parse(rest, artifact_pb2.LaunchPlan())
                got = make().plan
                self.assertEqual(got, want, case)
                if what == "decode":
                    self.assertEqual(len(got.main_params), param_sizes()[0], case)
                    self.assertEqual(len(got.combine_params),
                                     param_sizes()[1] if got.needs_combine else 0, case)
                plans += 1
        return plans

    def test_grid(self):
        plans = 0
        for arch in self.ARCHS:
            for heads in self.HEADS:
                plans += self.check_manifest(arch, heads)
        # topk and page sizes off the presets, no lse.
        plans += self.check_manifest("sm_90a", 16, topk=63, page=16, return_lse=False)
        plans += self.check_manifest("sm_120a", 64, topk=2049, page=32, scale=0.135234)
        self.assertGreater(plans, 10000)


def random_struct(cls, rng):
    data = bytes(rng.getrandbits(8) for _ in range(ctypes.sizeof(cls)))
    return cls.from_buffer_copy(data)


class CapiGarbageTest(unittest.TestCase):
    """Hostile input into every C ABI call: an error code with a message,
    never a crash (this process would die)."""

    def setUp(self):
        self.lib = _capi.lib()
        self.rng = random.Random(1234)
        manifest, self.art = fake_pair()
        self.manifest = manifest.SerializeToString()

    def expect_error(self, name, *args):
        error = ctypes.c_void_p()
        code = getattr(self.lib, "kforge_" + name)(*args, ctypes.byref(error))
        self.assertNotEqual(code, 0, (name, args))
        self.assertTrue(error.value, name)
        message = ctypes.string_at(error.value).decode("utf-8", "replace")
        self.lib.kforge_free(error.value)
        self.assertTrue(message, name)
        return code, message

    def blobs(self):
        """Garbage messages as (pointer, size): random bytes, truncated and
        bit-flipped real messages, a NULL with a size, and sizes far beyond
        the buffer (refused before anything is read)."""
        real = [self.manifest, self.art.SerializeToString()]
        out = [bytes(self.rng.getrandbits(8) for _ in range(n)) for n in (1, 7, 64, 4096)]
        for data in real:
            out.append(data[:len(data) // 2])
            flipped = bytearray(data)
            for _ in range(16):
                flipped[self.rng.randrange(len(flipped))] ^= 0xFF
            out.append(bytes(flipped))
        pairs = [_capi.buffer(b) for b in out]
        small = _capi.buffer(b"\x08\x01")[0]
        pairs += [(None, 5), (small, 1 << 40), (small, (1 << 64) - 1)]
        return pairs

    def test_every_call_refuses_garbage(self):
        lib, err = self.lib, None
        out, size = ctypes.POINTER(ctypes.c_uint8)(), ctypes.c_size_t()
        string = ctypes.c_void_p()
        dev = _capi.device(ARCH, 132)
        shape = Shape(4, 1, 8, 2048, 64).c_struct()
        args = random_struct(_capi.DecodeArgs, self.rng)
        variant = _capi.serialized(_capi.manifest_for_artifact(self.art).variants[0])
        expected = (_capi.EntryParams * 2)(_capi.EntryParams(1, 0, 0, b"DecodeParams"),
                                           _capi.EntryParams(2, 0, 0, b"CombineParams"))
        handle = ctypes.c_void_p()
        del err
        refs = (ctypes.byref(out), ctypes.byref(size))
        for blob in self.blobs():
            for name, call in (
                    ("validate_spec", lambda b: (*b,)),
                    ("normalize_spec", lambda b: (*b, *refs)),
                    ("select", lambda b: (*b, ctypes.byref(dev), ctypes.byref(shape), *refs)),
                    ("plan_decode", lambda b: (*b, ctypes.byref(dev), ctypes.byref(args), 0,
                                               *refs)),
                    ("workspace_bytes_for", lambda b: (*b, ctypes.byref(dev), 64,
                                                       ctypes.byref(ctypes.c_uint64()))),
                    ("kv_layout", lambda b: (*b, ctypes.byref(ctypes.c_int32()),
                                             ctypes.byref(ctypes.c_int32()))),
                    ("check_artifact", lambda b: (*b, ARCH.encode(), *b)),
                    ("check_artifact", lambda b: (*variant, ARCH.encode(), *b)),
                    ("manifest_for_artifact", lambda b: (*b, *refs)),
                    ("bundle_manifest_path", lambda b: (*b, ctypes.byref(string))),
                    ("module_load", lambda b: (*b, expected, 2, 0, ctypes.byref(handle)))):
                with self.subTest(name=name, size=blob[1]):
                    error = ctypes.c_void_p()
                    code = getattr(lib, "kforge_" + name)(*call(blob), ctypes.byref(error))
                    if code == 0:  # garbage that parses as an acceptable message
                        continue
                    self.assertTrue(error.value)
                    lib.kforge_free(error.value)
        # A text spec of random bytes, and one far longer than its buffer.
        for text in (bytes(self.rng.getrandbits(8) for _ in range(300)), b"{", b"num_q_heads:"):
            self.expect_error("parse_spec", text, len(text), *refs)
        self.expect_error("parse_spec", b"x", 1 << 40, *refs)
        self.expect_error("parse_spec", None, 3, *refs)

    def test_nulls_and_extremes(self):
        lib = self.lib
        out, size = ctypes.POINTER(ctypes.c_uint8)(), ctypes.c_size_t()
        refs = (ctypes.byref(out), ctypes.byref(size))
        string = ctypes.c_void_p()
        m = _capi.buffer(self.manifest)
        dev = _capi.device(ARCH, 132)
        shape = Shape(4, 1, 8, 2048, 64).c_struct()
        for tp in (0, -1, 3, 2 ** 31 - 1, -2 ** 31):
            self.expect_error("spec_from_preset", b"glm-5", tp, 0, *refs)
        self.expect_error("spec_from_preset", b"glm-5", 1, 99, *refs)  # no such dtype
        self.expect_error("spec_from_preset", None, 1, 0, *refs)
        self.expect_error("spec_from_preset", b"no-such-model", 1, 0, *refs)
        self.expect_error("spec_from_preset", b"glm-5", 1, 0, None, None)
        self.expect_error("presets", None)
        for name in (None, b"", b"sm_", b"sm_999z", b"\xff\xfe", b"x" * 100000):
            self.expect_error("canonical_arch", name, ctypes.byref(string))
        self.expect_error("canonical_arch", b"sm_90a", None)
        for major, minor in ((0, 0), (-1, 5), (2 ** 31 - 1, 2 ** 31 - 1), (7, 5)):
            self.expect_error("arch_for_capability", major, minor, ctypes.byref(string))
        for arch, cc in ((None, (9, 0)), (b"sm_90a", (8, 0)), (b"garbage", (9, 0)),
                         (b"sm_80", (-2 ** 31, 0))):
            self.expect_error("check_device_arch", arch, *cc)
        # Devices and shapes: NULLs, NULL arch, extreme values.
        self.expect_error("select", *m, None, ctypes.byref(shape), *refs)
        self.expect_error("select", *m, ctypes.byref(dev), None, *refs)
        self.expect_error("select", *m, ctypes.byref(_capi.Device(None, 132, 0)),
                          ctypes.byref(shape), *refs)
        self.expect_error("select", *m, ctypes.byref(dev), ctypes.byref(shape), None, None)
        for field in ("batch", "s_q", "num_q_heads", "topk", "page_block_size", "kv_dtype"):
            for value in (0, -1, 2 ** 31 - 1, -2 ** 31):
                bad = Shape(4, 1, 8, 2048, 64).c_struct()
                setattr(bad, field, value)
                self.expect_error("select", *m, ctypes.byref(dev), ctypes.byref(bad), *refs)
        for sms, forced in ((0, 0), (-2 ** 31, 0), (132, -1), (132, 2 ** 31 - 1),
                            (132, -2 ** 31)):
            d = _capi.device(ARCH, sms, forced)
            self.expect_error("select", *m, ctypes.byref(d), ctypes.byref(shape), *refs)
        # No overflow in the launch rule at the largest SM count.
        sel = select(_capi.manifest_for_artifact(self.art), Device(ARCH, 2 ** 31 - 1),
                     Shape(1, 1, 8, 2048, 64))
        self.assertTrue(1 < sel.num_splits <= sel.max_splits, sel)
        # Decode arguments: every field at extremes, and random structs.
        for _ in range(300):
            args = random_struct(_capi.DecodeArgs, self.rng)
            error = ctypes.c_void_p()
            code = lib.kforge_plan_decode(*m, ctypes.byref(dev), ctypes.byref(args),
                                          self.rng.getrandbits(64), *refs, ctypes.byref(error))
            self.assertNotEqual(code, 0)
            lib.kforge_free(error.value)
        self.expect_error("plan_decode", *m, ctypes.byref(dev), None, 0, *refs)
        # Strides whose products overflow int64 fail their checks, not wrap.
        q = info("q", (4, 1, 8, 576), ptr=DUMP_Q)
        kv = info("kv_cache", (64, 64, 576), ptr=DUMP_KV)
        idx = info("indices", (4, 1, 2048), dtype="int32", size=4, ptr=DUMP_INDICES)
        out = info("out", (4, 1, 8, 512), ptr=DUMP_OUT)
        dims = ops.check_decode_inputs(q, kv, idx)
        for field, value in (("q_head_stride", 2 ** 62), ("kv_row_stride", 2 ** 62),
                             ("out_head_stride", 2 ** 62), ("q_token_stride", -2 ** 63)):
            args = ops.make_decode_args(q, kv, idx, dims, out, ops.check_out(out, dims), 0,
                                        0.0625)
            setattr(args, field, value)
            code, message = self.expect_error("plan_decode", *m, ctypes.byref(dev),
                                              ctypes.byref(args), 0, *refs)
            self.assertEqual(code, _capi.INVALID_ARGUMENT, message)
        for max_tokens in (0, -1, -2 ** 31):
            self.expect_error("workspace_bytes_for", *m, ctypes.byref(dev), max_tokens,
                              ctypes.byref(ctypes.c_uint64()))
        self.expect_error("workspace_bytes_for", *m, ctypes.byref(dev), 8, None)
        # Bundles: missing, unreadable and hostile paths, NULL handles.
        handle = ctypes.c_void_p()
        for path in (None, b"", b"/nonexistent/kforge", b"/proc/self/mem", b"\xff" * 5000,
                     b"/etc/passwd"):
            self.expect_error("bundle_open", path, ctypes.byref(handle))
        self.expect_error("bundle_open", TMP.encode(), None)
        for call, args in (("bundle_manifest", (None, 0, *refs)),
                           ("bundle_get_manifest", (None, *m, ARCH.encode(), *refs)),
                           ("bundle_get_kernel", (None, *m, ARCH.encode(), *refs)),
                           ("bundle_writer_has_kernel", (None, b"k", ctypes.byref(ctypes.c_int32()))),
                           ("bundle_writer_add_kernel", (None, *m)),
                           ("bundle_writer_add_manifest", (None, *m)),
                           ("bundle_writer_finish", ()),
                           ("bundle_kernel_path", (None, ctypes.byref(string))),
                           ("verify_bundle", (None, ctypes.byref(ctypes.c_int32()),
                                              ctypes.byref(string)))):
            if call == "bundle_writer_finish":
                self.expect_error(call, None)
            else:
                self.expect_error(call, *args)
        for path in (None, b"/proc/kforge/x", b"/etc/passwd"):
            self.expect_error("bundle_writer_open", path, 1, ctypes.byref(handle))
        lib.kforge_bundle_close(None)
        lib.kforge_bundle_writer_close(None)
        lib.kforge_free(None)
        # Kernel modules: NULL handles, outputs and roles; bad sizes.
        art = _capi.serialized(self.art)
        block = ctypes.create_string_buffer(64)
        for call, args in (
                ("module_entry", (None, b"x", ctypes.byref(ctypes.c_int32()), None)),
                ("module_load_into_current_context", (None,)),
                ("module_set_max_dynamic_smem", (None, 0, 1 << 16)),
                ("module_allow_non_portable_cluster", (None, 0)),
                ("module_max_active_clusters", (None, 0, 1, 1, 1, 128, 0,
                                                ctypes.byref(ctypes.c_int32()))),
                ("module_launch", (None, 0, block, 64, 1, 1, 1, 128, 0, None, 0)),
                ("module_load", (*art, None, 2, 0, ctypes.byref(handle))),
                ("module_load", (*art, None, 0, 0, ctypes.byref(handle))),
                ("module_load", (*art, (_capi.EntryParams * 1)(), 1, 0, ctypes.byref(handle))),
                ("module_load", (*art, (_capi.EntryParams * 1)(_capi.EntryParams(1, 0, 0, None)),
                                 1, 0, ctypes.byref(handle))),
                ("module_load", (*art, (_capi.EntryParams * 1)(
                    _capi.EntryParams(1, 0, 0, b"NoSuchParams")), 1, 0, ctypes.byref(handle))),
                ("module_load", (*art, (_capi.EntryParams * 1)(_capi.EntryParams(99, 0, 8, None)),
                                 1, 0, ctypes.byref(handle))),
                ("module_load", (*art, (_capi.EntryParams * 1)(
                    _capi.EntryParams(1, 0, 1 << 62, None)), 1, 0, ctypes.byref(handle))),
                ("module_load", (*art, (_capi.EntryParams * 1)(_capi.EntryParams(1, 0, 8, None)),
                                 1, -2 ** 31, ctypes.byref(handle))),
                ("module_load", (*art, (_capi.EntryParams * 1)(_capi.EntryParams(1, 0, 8, None)),
                                 1, 0, None)),
                ("cuda_driver_version", (None,))):
            code, _ = self.expect_error(call, *args)
            self.assertEqual(code, _capi.INVALID_ARGUMENT, call)
        lib.kforge_module_close(None)
        # A real bundle handle given garbage.
        directory = os.path.join(TMP, "garbage_bundle")
        copy = kbundle.LocalCopy(directory)
        copy.add_manifest(_capi.manifest_for_artifact(self.art))
        copy.add_kernel(self.art)
        source = _capi.BundleSource(directory)
        for index in (-1, 1, 2 ** 31 - 1):
            self.expect_error("bundle_manifest", source.handle, index, *refs)
        for blob in self.blobs():
            self.expect_error("bundle_get_kernel", source.handle, *blob, ARCH.encode(), *refs)
        self.expect_error("bundle_get_kernel", source.handle, *m, None, *refs)
        writer = _capi.BundleWriter(directory, per_write=True)
        for key in (b"../../etc/passwd", b"", b".hidden", b"a/b"):
            has = ctypes.c_int32(7)
            error = ctypes.c_void_p()
            self.assertEqual(lib.kforge_bundle_writer_has_kernel(
                writer.handle, key, ctypes.byref(has), ctypes.byref(error)), 0)
            self.assertEqual(has.value, 0)
        bad = artifact_pb2.KernelArtifact()
        bad.CopyFrom(self.art)
        bad.key = "../../escape"
        self.expect_error("bundle_writer_add_kernel", writer.handle, *_capi.serialized(bad))
        self.assertEqual(kforge.verify_bundle(directory), [])
        for blob in self.blobs():
            error = ctypes.c_void_p()
            if lib.kforge_bundle_writer_add_manifest(writer.handle, *blob,
                                                     ctypes.byref(error)) != 0:
                self.assertTrue(error.value)
                lib.kforge_free(error.value)


def info(name, shape, strides=None, dtype="bfloat16", device=("cuda", 0), ptr=1 << 20,
         size=2):
    """A TensorInfo; contiguous strides unless given."""
    if strides is None:
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    return ops.TensorInfo(name, tuple(shape), tuple(strides), dtype, device, ptr, size)


# templates/kforge/sparse_mla/common/params.h DecodeParams / CombineParams.
DECODE_PARAMS = (("q", "kv", "indices", "out", "lse", "o_accum", "lse_accum", "topk_length",
                  "sink", "extra_kv", "extra_indices", "extra_topk_length", "q_token_stride",
                  "q_head_stride", "kv_page_stride", "kv_row_stride", "num_kv_slots",
                  "indices_stride", "out_token_stride", "out_head_stride",
                  "extra_kv_page_stride", "extra_kv_row_stride", "extra_num_kv_slots",
                  "extra_indices_stride", "num_tokens", "num_splits", "tokens_per_split",
                  "topk_length_tokens"),
                 "<12Q12q4i")
DECODE_POINTERS = 12  # the pointer fields, first
COMBINE_PARAMS = (("o_accum", "lse_accum", "out", "lse", "sink", "out_token_stride",
                   "out_head_stride", "num_tokens", "num_splits", "column_slices", "reserved"),
                  "<5Q2q4i")


def unpack_decode_params(data):
    return dict(zip(DECODE_PARAMS[0], struct.unpack(DECODE_PARAMS[1], data)))


def unpack_combine_params(data):
    return dict(zip(COMBINE_PARAMS[0], struct.unpack(COMBINE_PARAMS[1], data)))


class ParseSpecTest(unittest.TestCase):
    """Spec files reach Python through the C++ parser (kforge_parse_spec):
    the KernelSpec form, and the flat form of a sparse MLA spec."""

    def test_kernel_spec_and_flat_forms(self):
        nested = _capi.parse_spec('{"dsa_indexer": {"index_heads": 32, "index_head_dim": 128,'
                                  ' "topk": 2048, "page_block_size": 64}}')
        self.assertEqual(nested.WhichOneof("kind"), "dsa_indexer")
        self.assertEqual(nested.dsa_indexer.index_heads, 32)
        sparse = _capi.parse_spec('{"num_q_heads": 16, "kv_cache_dtype": "fp8_ds_mla"}')
        self.assertEqual(sparse.WhichOneof("kind"), "sparse_mla_decode")
        self.assertEqual(sparse.sparse_mla_decode.num_q_heads, 16)
        # An older file naming the sparse kind reads as before; a flat
        # indexer is refused saying how to write it.
        self.assertEqual(_capi.parse_spec("kind: ATTENTION_KIND_SPARSE_MLA_DECODE num_q_heads: 16"
                                          " kv_cache_dtype: fp8_ds_mla"), sparse)
        with self.assertRaisesRegex(kforge.KforgeInvalidArgument, r"dsa_indexer \{ index_heads"):
            _capi.parse_spec("kind: ATTENTION_KIND_DSA_INDEXER index_heads: 32 topk: 2048")
        # validate_spec and normalize_spec take the KernelSpec of either kind.
        kforge.spec.validate_spec(nested)
        self.assertEqual(_capi.normalize_spec(nested).dsa_indexer.index_heads, 32)
        with self.assertRaisesRegex(kforge.KforgeInvalidArgument, "index_heads: got 0"):
            kforge.spec.validate_spec(spec_pb2.DsaIndexerSpec(topk=1, page_block_size=64,
                                                              index_head_dim=128))


class OpsChecksTest(unittest.TestCase):
    """kforge.ops's tensor mapping and the checks PlanDecode makes of what it
    maps (no torch, no GPU)."""

    def inputs(self, batch=4, s_q=1, heads=8, pages=40, gap=64, topk=2048):
        page = 64 * 576 + gap  # a page stride with a gap between pages
        return (info("q", (batch, s_q, heads, 576)),
                info("kv_cache", (pages, 64, 1, 576), (page, 576, 576, 1), ptr=1 << 30),
                info("indices", (batch, s_q, topk), dtype="int32", size=4, ptr=1 << 24))

    def plan(self, q=None, kv=None, idx=None, out=None, lse=0, scale=0.0625, batch=4, s_q=1,
             sms=132, workspace=1 << 32, topk_length=None, sink=None):
        """PlanDecode for glm-5 TP8 on sm_90a (the inputs' defaults
        replaced by any given; topk_length and sink TensorInfos or None)."""
        dq, dkv, didx = self.inputs(batch=batch, s_q=s_q)
        q, kv, idx = q or dq, kv or dkv, idx or didx
        dims = ops.check_decode_inputs(q, kv, idx)
        out = out or info("out", (*q.shape[:-1], 512), ptr=1 << 28)
        tokens = ops.check_topk_length(topk_length, dims) if topk_length else 0
        if sink:
            ops.check_sink(sink, dims)
        args = ops.make_decode_args(q, kv, idx, dims, out, ops.check_out(out, dims), lse, scale,
                                    1, topk_length.data_ptr if topk_length else 0,
                                    sink.data_ptr if sink else 0, tokens)
        return plan_decode(self.manifest, Device(ARCH, sms), args, workspace)

    @classmethod
    def setUpClass(cls):
        cls.manifest = cli_manifest("glm-5", 8, ARCH, 1)

    def test_good_inputs(self):
        q, kv, idx = self.inputs(s_q=2)
        dims = ops.check_decode_inputs(q, kv, idx)
        self.assertEqual((dims.batch, dims.s_q, dims.heads, dims.d_qk, dims.topk,
                          dims.num_kv_slots, dims.page_block_size), (4, 2, 8, 576, 2048, 40 * 64,
                                                                     64))
        self.assertEqual((dims.q_token_stride, dims.q_head_stride), (8 * 576, 576))
        self.assertEqual((dims.kv_page_stride, dims.kv_row_stride), (64 * 576 + 64, 576))
        self.assertEqual(dims.indices_token_stride, 2048)
        kv3 = info("kv_cache", (40, 64, 576), (64 * 576 + 64, 576, 1))
        self.assertEqual(ops.check_decode_inputs(q, kv3, idx), dims)
        # A transposed q ([s_q, batch] storage) cannot be read as tokens.
        qt = info("q", (4, 2, 8, 576), (8 * 576, 4 * 8 * 576, 576, 1))
        with self.assertRaisesRegex(ValueError, "q: dims 0 and 1"):
            ops.check_decode_inputs(qt, kv, idx)
        self.plan(q, kv, idx, s_q=2)

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
                    q=info("q", (4, 8, 576, 1, 1)))
        self.expect(ValueError, "one latent KV head", kv=info("kv_cache", (40, 64, 2, 576)))
        self.expect(ValueError, "rows of 512 values", kv=info("kv_cache", (40, 64, 512)))
        self.expect(ValueError, r"indices: shape \[4, 2, 2048\]",
                    idx=info("indices", (4, 2, 2048), dtype="int32", size=4))
        self.expect(ValueError, "q: the last dim must be contiguous",
                    q=info("q", (4, 1, 8, 576), (8 * 576 * 2, 8 * 576 * 2, 576 * 2, 2)))
        self.expect(ValueError, "every dim must be >= 1", q=info("q", (0, 1, 8, 576)))
        # Alignment is PlanDecode's (16 bytes for q and kv rows).
        with self.assertRaisesRegex(kforge.KforgeInvalidArgument, "q: 0x100008 is not 16-byte"):
            self.plan(q=q._replace(data_ptr=(1 << 20) + 8))
        with self.assertRaisesRegex(ValueError, "kv_page_stride: got 36868 elements"):
            self.plan(kv=info("kv_cache", (40, 64, 576), (64 * 576 + 4, 576, 1)))

    def test_out_checks(self):
        dims = ops.check_decode_inputs(*self.inputs(batch=3, s_q=2))
        self.assertEqual(ops.check_out(info("out", (3, 2, 8, 512)), dims), (8 * 512, 512))
        self.plan(batch=3, s_q=2)
        # Out needs 4-byte alignment only (two bf16 per store), not 16 as the
        # old Python check had it.
        self.plan(out=info("out", (4, 1, 8, 512), (8 * 514, 8 * 514, 514, 1), ptr=(1 << 28) + 4))
        with self.assertRaisesRegex(ValueError, "out: 0x10000002 is not 4-byte aligned"):
            self.plan(out=info("out", (4, 1, 8, 512), ptr=(1 << 28) + 2))
        # Heads outermost: rows are head-inner in PlanDecode's model.
        with self.assertRaisesRegex(ValueError, "out_token_stride"):
            self.plan(batch=3, s_q=2,
                      out=info("out", (3, 2, 8, 512), (2 * 512, 512, 6 * 512, 1)))
        with self.assertRaisesRegex(ValueError, "out_head_stride.*overlap"):
            self.plan(batch=3, s_q=2,
                      out=info("out", (3, 2, 8, 512), (8 * 512, 4 * 512, 256, 1)))
        with self.assertRaisesRegex(ValueError, "d_v: got 576, the kernels are built for 512"):
            self.plan(batch=3, s_q=2, out=info("out", (3, 2, 8, 576)))
        with self.assertRaisesRegex(ValueError, r"out: expected shape \[3, 2, 8"):
            ops.check_out(info("out", (3, 1, 8, 512)), dims)
        with self.assertRaisesRegex(TypeError, "float32"):
            ops.check_out(info("out", (3, 2, 8, 512), dtype="float32", size=4), dims)

    def test_fp8_presets_and_cache_layout(self):
        # The record size comes from C++ (KvLayoutOf); presets bring their
        # scale convention (pow2 for DeepSeek-V3.2, arbitrary for GLM-5).
        glm = kforge.spec_from_preset("glm-5", 8, kv_dtype="fp8_ds_mla")
        ds = kforge.spec_from_preset("deepseek-v3.2", 8, kv_dtype="fp8_ds_mla")
        self.assertEqual((glm.kv_cache_dtype, glm.kv_scale_format), (2, 2))
        self.assertEqual((ds.kv_cache_dtype, ds.kv_scale_format), (2, 1))
        self.assertEqual(kforge.kv_row_bytes_for(glm), 656)
        self.assertIsNone(kforge.kv_row_bytes_for(kforge.spec_from_preset("glm-5", 8)))
        sel = kforge.spec.selector(preset="glm-5", tp=8, kv_dtype="fp8_ds_mla")
        self.assertEqual(sel.preset.kv_cache_dtype, 2)
        with self.assertRaises(kforge.KforgeInvalidArgument):
            kforge.spec_from_preset("glm-5", 8, kv_dtype="fp4")
        # Scale-format names are the C++ parser's (one list, model/spec.cc).
        value = kforge.spec.kv_scale_format_value
        self.assertEqual([value(n) for n in ("pow2", "ARBITRARY", "KV_SCALE_FORMAT_POW2", None, 2)],
                         [1, 2, 1, 0, 2])
        for bad in ("pow3", ""):
            with self.assertRaisesRegex(kforge.KforgeInvalidArgument, "pow2"):
                value(bad)

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
        with self.assertRaisesRegex(ValueError, "pass kv_lora_rank=448 or kv_lora_rank=512 "
                                                r"\(or rope_dim=64 / rope_dim=0\)"):
            infer_latent_dims(512)
        for d_qk, d_v in ((600, None), (576, 500), (576, 448)):
            with self.assertRaises(ValueError):
                infer_latent_dims(d_qk, d_v)

    def test_inputs_against_spec(self):
        self.plan(lse=1 << 27)
        self.plan(scale=0.0625 * (1 + 5e-7))  # PlanDecode's 1e-6 relative tolerance
        for inputs, pattern in ((self.inputs(heads=16), "num_q_heads"),
                                (self.inputs(topk=1024), "topk")):
            with self.assertRaisesRegex(ValueError, pattern):
                self.plan(*inputs, out=info("out", (*inputs[0].shape[:-1], 512)))
        with self.assertRaisesRegex(ValueError, "page_block_size"):
            self.plan(kv=info("kv_cache", (40, 32, 576)))
        with self.assertRaisesRegex(ValueError, "d_qk"):
            q, kv, idx = self.inputs()
            self.plan(q=info("q", (4, 1, 8, 512)), kv=info("kv_cache", (40, 64, 512)))
        with self.assertRaisesRegex(ValueError, "softmax_scale: got 0.07, the kernels are "
                                                "compiled with 0.0625"):
            self.plan(scale=0.07)
        with self.assertRaisesRegex(ValueError, "softmax_scale"):
            self.plan(scale=0.0625 * (1 + 3e-6))

    def test_launch_plan(self):
        q, kv, idx = self.inputs(batch=32)
        ws = 1 << 32
        sel = self.plan(q, kv, idx, lse=1 << 27, batch=32, workspace=ws)
        self.assertGreater(sel.num_splits, 1)
        want = select(self.manifest, Device(ARCH, 132), Shape(32, 1, 8, 2048, 64)).plan
        got = artifact_pb2.LaunchPlan()
        got.CopyFrom(sel.plan)
        got.ClearField("main_params")
        got.ClearField("combine_params")
        self.assertEqual(got, want)
        # templates/kforge/sparse_mla/common/params.h DecodeParams / CombineParams.
        p = unpack_decode_params(sel.main_params)
        self.assertEqual((p["q"], p["kv"], p["indices"], p["out"], p["lse"]),
                         (q.data_ptr, kv.data_ptr, idx.data_ptr, 1 << 28, 1 << 27))
        self.assertEqual((p["o_accum"], p["lse_accum"]),
                         (ws, ws + sel.num_splits * 32 * 8 * 512 * 4))
        self.assertEqual((p["kv_page_stride"], p["kv_row_stride"], p["num_kv_slots"]),
                         (64 * 576 + 64, 576, 40 * 64))
        self.assertEqual((p["num_tokens"], p["num_splits"]), (32, sel.num_splits))
        self.assertEqual(p["tokens_per_split"] % 64, 0)
        self.assertGreaterEqual(p["tokens_per_split"] * sel.num_splits, 2048)
        c = unpack_combine_params(sel.combine_params)
        # 32 tokens x 8 heads is a small combine: 4 warps (column slices) per
        # head, 32 warps, 8 blocks of 4.
        self.assertEqual(c["column_slices"], 4)
        self.assertEqual((sel.combine_grid, sel.combine_block_threads), ((32, 8), 128))
        self.assertEqual((c["o_accum"], c["lse_accum"], c["out"], c["lse"], c["num_splits"]),
                         (p["o_accum"], p["lse_accum"], p["out"], p["lse"], p["num_splits"]))
        # One split (264 CTA slots, 256 tokens): no combine, no workspace, and
        # lse may be absent.
        sel1 = self.plan(batch=256, workspace=0)
        self.assertEqual((sel1.num_splits, sel1.workspace_bytes, sel1.combine_params),
                         (1, 0, b""))
        p1 = unpack_decode_params(sel1.main_params)
        self.assertEqual((p1["lse"], p1["o_accum"], p1["tokens_per_split"]), (0, 0, 2048))
        self.assertEqual((p1["topk_length"], p1["sink"], p1["topk_length_tokens"]), (0, 0, 1))
        self.assertEqual((p["topk_length"], p["sink"], p["topk_length_tokens"]), (0, 0, 1))
        self.assertEqual(c["sink"], 0)

    def test_topk_length_and_sink_checks(self):
        dims1 = ops.check_decode_inputs(*self.inputs())
        dims2 = ops.check_decode_inputs(*self.inputs(s_q=2))

        def tl(shape, strides=None, **kw):
            kw.setdefault("ptr", 1 << 26)
            return info("topk_length", shape, strides, dtype=kw.pop("dtype", "int32"), size=4,
                        **kw)

        def sk(shape, strides=None, **kw):
            kw.setdefault("ptr", 1 << 25)
            return info("sink", shape, strides, dtype=kw.pop("dtype", "float32"), size=4, **kw)

        # One length per query token ([batch, s_q] or flat), or per request.
        for shape, dims, tokens in (((4, 2), dims2, 1), ((8,), dims2, 1), ((4,), dims2, 2),
                                    ((4,), dims1, 1), ((4, 1), dims1, 1)):
            self.assertEqual(ops.check_topk_length(tl(shape), dims), tokens, shape)
        # A dim of size 1 may have any stride (torch's contiguity).
        self.assertEqual(ops.check_topk_length(tl((4, 1), (1, 3)), dims1), 1)
        with self.assertRaisesRegex(TypeError, "topk_length: expected dtype int32, got int64"):
            ops.check_topk_length(tl((4, 2), dtype="int64"), dims2)
        for shape in ((4, 3), (2,), (8, 1), (4, 2, 1), (1, 8)):
            with self.assertRaisesRegex(ValueError, r"topk_length: expected shape \[batch, s_q\] "
                                                    r"= \[4, 2\], \[batch \* s_q\] = \[8\]"):
                ops.check_topk_length(tl(shape), dims2)
        for shape, strides in (((4, 2), (1, 4)), ((8,), (2,)), ((4,), (2,)), ((4, 2), (4, 1))):
            with self.assertRaisesRegex(ValueError, "topk_length: must be contiguous"):
                ops.check_topk_length(tl(shape, strides), dims2)
        with self.assertRaisesRegex(ValueError, "topk_length is on cuda:1, the inputs on cuda:0"):
            ops.check_topk_length(tl((4, 2), device=("cuda", 1)), dims2)
        with self.assertRaisesRegex(ValueError, "topk_length is on cpu, the inputs on cuda:0"):
            ops.check_topk_length(tl((4, 2), device=("cpu", None)), dims2)
        ops.check_sink(sk((8,)), dims1)
        with self.assertRaisesRegex(TypeError, "sink: expected dtype float32, got bfloat16"):
            ops.check_sink(sk((8,), dtype="bfloat16"), dims1)
        for shape, strides in (((16,), None), ((1, 8), None), ((8,), (2,)), ((4, 1, 8), None)):
            with self.assertRaisesRegex(ValueError, r"sink: expected a contiguous \[num_q_heads\] "
                                                    r"= \[8\] tensor"):
                ops.check_sink(sk(shape, strides), dims1)
        with self.assertRaisesRegex(ValueError, "sink is on cuda:2"):
            ops.check_sink(sk((8,), device=("cuda", 2)), dims1)
        # PlanDecode copies both pointers (and the tokens per length) into the
        # blocks, the combine's sink too; alignment is its to check.
        for sms, shape, want_tokens in ((132, (4,), 2), (132, (4, 2), 1), (1, (8,), 1)):
            with self.subTest(sms=sms, shape=shape):
                sel = self.plan(s_q=2, sms=sms, lse=1 << 27, topk_length=tl(shape), sink=sk((8,)))
                p = unpack_decode_params(sel.main_params)
                self.assertEqual((p["topk_length"], p["sink"], p["topk_length_tokens"]),
                                 (1 << 26, 1 << 25, want_tokens))
                if sel.needs_combine:
                    self.assertEqual(unpack_combine_params(sel.combine_params)["sink"], 1 << 25)
        self.assertGreater(self.plan(batch=32, sink=sk((8,))).num_splits, 1)
        c = unpack_combine_params(self.plan(batch=32, sink=sk((8,))).combine_params)
        self.assertEqual(c["sink"], 1 << 25)
        with self.assertRaisesRegex(kforge.KforgeInvalidArgument,
                                    "topk_length: 0x4000002 is not 4-byte aligned"):
            self.plan(topk_length=tl((4,), ptr=(1 << 26) + 2))
        with self.assertRaisesRegex(kforge.KforgeInvalidArgument,
                                    "sink: 0x2000001 is not 4-byte aligned"):
            self.plan(sink=sk((8,), ptr=(1 << 25) + 1))
        # topk_length_tokens other than 1 or s_q is PlanDecode's to refuse.
        q, kv, idx = self.inputs(s_q=2)
        out = info("out", (4, 2, 8, 512), ptr=1 << 28)
        for tokens, ok in ((0, True), (1, True), (2, True), (3, False), (-1, False)):
            args = ops.make_decode_args(q, kv, idx, dims2, out, ops.check_out(out, dims2), 0,
                                        0.0625, 1, 1 << 26, 0, tokens)
            if ok:
                plan_decode(self.manifest, Device(ARCH, 132), args, 1 << 32)
                continue
            with self.assertRaisesRegex(kforge.KforgeInvalidArgument, "topk_length_tokens"):
                plan_decode(self.manifest, Device(ARCH, 132), args, 1 << 32)

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
        self.assertEqual(kforge.spec.canonical_arch(" SM_90A"), "sm_90a")
        self.assertEqual(kforge.spec.canonical_arch("sm_75z"), "sm_75z")  # as given
        self.assertEqual(sorted(kforge.PRESETS), ["deepseek-v3.2", "glm-5"])
        self.assertEqual(kforge.PRESETS["glm-5"].num_q_heads, 64)


FakeDtype = collections.namedtuple("FakeDtype", "name")
FakeDtype.__str__ = lambda self: "torch." + self.name
FakeDevice = collections.namedtuple("FakeDevice", "type index")
BF16, FP32, I32, U8 = (FakeDtype(n) for n in ("bfloat16", "float32", "int32", "uint8"))
SIZES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "uint8": 1}


class FakeTensor:
    """The metadata of a torch tensor that kforge reads (shape, stride(),
    dtype, device, data_ptr(), element_size()); no data."""

    def __init__(self, shape, ptr, dtype=BF16, strides=None, device=FakeDevice("cuda", 0)):
        self.shape, self.dtype, self.device, self._ptr = tuple(shape), dtype, device, ptr
        if strides is None:
            strides, step = [], 1
            for n in reversed(shape):
                strides.insert(0, step)
                step *= n
        self._strides = tuple(strides)

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self._ptr

    def element_size(self):
        return SIZES[self.dtype.name]

    def at(self, ptr=None, **changes):
        """A copy at another address (and other metadata)."""
        t = FakeTensor(self.shape, self._ptr if ptr is None else ptr, self.dtype, self._strides,
                       self.device)
        for name, value in changes.items():
            setattr(t, "_strides" if name == "strides" else name, value)
        return t


class ExtraCachePlanTest(unittest.TestCase):
    """A spec with an extra KV cache (extra_kv): the tensor mapping fills
    the extra DecodeArgs, PlanDecode checks them, and PlanCache writes the
    extra pointers on a hit as PlanDecode would."""

    SCALE = 0.0625

    @classmethod
    def setUpClass(cls):
        from kforge import launch
        cls.launch = launch
        spec = {"num_q_heads": 8,
                "kv_lora_rank": 512, "rope_dim": 64, "topk": 2048,
                "kv_cache_dtype": "KV_CACHE_DTYPE_BF16", "page_block_size": 64,
                "softmax_scale": cls.SCALE, "return_lse": True,
                "extra_kv": {"kv_cache_dtype": "KV_CACHE_DTYPE_FP8_DS_MLA",
                             "kv_scale_format": "KV_SCALE_FORMAT_POW2", "topk": 128,
                             "page_block_size": 16}}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(spec, f)
        try:
            r = run_kforge("manifest", "--spec", f.name, "--arch", ARCH)
        finally:
            os.unlink(f.name)
        if r.returncode != 0:
            raise AssertionError(f"kforge manifest failed: {r.stderr}")
        cls.manifest = json_format.Parse(r.stdout, service_pb2.Manifest())
        cls.spec = cls.manifest.variants[0].spec.sparse_mla_decode
        cls.device = Device(ARCH, 132)
        cls.extra_row_bytes = ops.extra_kv_row_bytes_for(cls.spec)

    def make_args(self, q, kv, idx, out, lse, topk_length, sink, scale, extra):
        return ops.call_args(q, kv, idx, out, lse, scale, 1, None, 0, topk_length=topk_length,
                             sink=sink, extra=extra, extra_kv_dtype=2,
                             extra_row_bytes=self.extra_row_bytes)

    def call(self, batch=4, base=1 << 36, x_rows=656, x_topk=128, x_length=None):
        q = FakeTensor((batch, 1, 8, 576), base)
        kv = FakeTensor((40, 64, 576), base + (1 << 32))
        idx = FakeTensor((batch, 1, 2048), base + (2 << 32), I32)
        out = FakeTensor((batch, 1, 8, 512), base + (3 << 32))
        lse = FakeTensor((batch, 1, 8), base + (4 << 32), FP32)
        x_kv = FakeTensor((30, 16, x_rows), base + (7 << 32), U8,
                          strides=(16 * x_rows + 64, x_rows, 1))
        x_idx = FakeTensor((batch, 1, x_topk), base + (8 << 32), I32)
        x_len = FakeTensor(x_length, base + (9 << 32), I32) if x_length else None
        return [q, kv, idx, out, lse, None, None], (x_kv, x_idx, x_len)

    def test_record_size_of_the_extra_format(self):
        # The C++ ExtraKvLayoutOf, through the C ABI.
        self.assertEqual(self.extra_row_bytes, 656)
        plain = cli_manifest("glm-5", 8, ARCH, 1).variants[0].spec.sparse_mla_decode
        self.assertIsNone(ops.extra_kv_row_bytes_for(plain))
        from kforge import _capi
        with self.assertRaisesRegex(ValueError, "extra_kv: unset"):
            _capi.kv_layout(plain.SerializeToString(), extra=True)

    def test_the_mapping_fills_the_extra_fields_and_plan_decode_takes_them(self):
        tensors, extra = self.call(x_length=(4,))
        args = self.make_args(*tensors, self.SCALE, extra)
        self.assertEqual(args.extra_kv, extra[0].data_ptr())
        self.assertEqual(args.extra_indices, extra[1].data_ptr())
        self.assertEqual(args.extra_topk_length, extra[2].data_ptr())
        self.assertEqual((args.extra_topk, args.extra_page_block_size, args.extra_num_kv_slots),
                         (128, 16, 30 * 16))
        self.assertEqual((args.extra_kv_row_stride, args.extra_kv_page_stride),
                         (656, 16 * 656 + 64))
        self.assertEqual(args.extra_indices_stride, 128)
        self.assertEqual(args.extra_kv_dtype, 2)
        plan_decode(self.manifest, self.device, args, 1 << 40)
        # Without the extra cache PlanDecode names the missing pointer.
        with self.assertRaisesRegex(ValueError, "extra_kv: null"):
            plan_decode(self.manifest, self.device, self.make_args(*tensors, self.SCALE, None))

    def test_bad_extra_tensors_are_named(self):
        tensors, (x_kv, x_idx, x_len) = self.call()
        cases = (
            ((x_kv.at(dtype=BF16), x_idx, None), TypeError, "extra_kv_cache"),
            ((x_kv.at(shape=(30, 16, 600), strides=(16 * 600, 600, 1)), x_idx, None), ValueError,
             "extra_kv_cache: records of 600 bytes"),
            ((x_kv, x_idx.at(shape=(3, 1, 128)), None), ValueError, "extra_indices"),
            ((x_kv, x_idx.at(dtype=FP32), None), TypeError, "extra_indices"),
            ((x_kv, x_idx, FakeTensor((5,), 1 << 40, I32)), ValueError, "extra_topk_length"),
        )
        for extra, error, text in cases:
            with self.subTest(text=text):
                with self.assertRaisesRegex(error, text):
                    self.make_args(*tensors, self.SCALE, extra)
        # A topk_length per request and an extra_topk_length per token
        # cannot share DecodeArgs.topk_length_tokens.
        q = FakeTensor((4, 2, 8, 576), 1 << 36)
        idx = FakeTensor((4, 2, 2048), 3 << 36, I32)
        out = FakeTensor((4, 2, 8, 512), 4 << 36)
        x_idx2 = FakeTensor((4, 2, 128), 5 << 36, I32)
        with self.assertRaisesRegex(ValueError, "both per token or both per request"):
            self.make_args(q, tensors[1], idx, out, None, FakeTensor((4,), 6 << 36, I32), None,
                           self.SCALE, (x_kv, x_idx2, FakeTensor((4, 2), 7 << 36, I32)))

    def test_hits_write_the_extra_pointers(self):
        cache = self.launch.PlanCache(self.manifest, self.device, self.make_args)
        tensors, extra = self.call(batch=64, x_length=(64,))
        plan, pointers = cache.lookup(*tensors, self.SCALE, extra)
        for shift in (512, 1 << 20, 3 << 30):
            moved = [t.at(t.data_ptr() + shift) if t else None for t in tensors]
            x_moved = tuple(t.at(t.data_ptr() + 2 * shift) for t in extra)
            again, pointers = cache.lookup(*moved, self.SCALE, x_moved)
            self.assertIs(again, plan)
            self.assertEqual(cache.misses, 1)
            workspace = 1 << 41 if plan.workspace_bytes else 0
            plan.bind(pointers, workspace)
            want = plan_decode(self.manifest, self.device,
                               self.make_args(*moved, self.SCALE, x_moved), workspace)
            self.assertEqual(plan.blocks(), (want.main_params, want.combine_params))
        # No extra_topk_length: another signature.
        cache.lookup(*tensors, self.SCALE, extra[:2] + (None,))
        self.assertEqual(cache.misses, 2)


class PlanCacheTest(unittest.TestCase):
    """kforge.launch.PlanCache as SparseMlaDecoder uses it (same make_args),
    on tensor metadata: a cached plan serves only calls whose every checked
    property is unchanged, and the blocks it writes are PlanDecode's."""

    SCALE = 0.0625

    @classmethod
    def setUpClass(cls):
        from kforge import launch
        cls.launch = launch
        cls.manifest = cli_manifest("glm-5", 8, ARCH, 1)
        cls.device = Device(ARCH, 132)
        cls.rng = random.Random(11)

    def cache(self):
        def make_args(q, kv, idx, out, lse, topk_length, sink, scale, extra):
            return ops.call_args(q, kv, idx, out, lse, scale, 1, None, 0,
                                 topk_length=topk_length, sink=sink, extra=extra)
        return self.launch.PlanCache(self.manifest, self.device, make_args)

    def call(self, batch=32, lse=True, base=1 << 36, s_q=1, topk_length=None, sink=False):
        """Tensors of a glm-5 TP8 call (paged cache with a gap), 512-byte
        aligned like torch's allocations: q, kv, indices, out, lse, and
        topk_length ("token": [batch, s_q], "flat": [batch * s_q],
        "request": [batch]) and sink when asked for."""
        page = 64 * 576 + 64
        q = FakeTensor((batch, s_q, 8, 576), base)
        kv = FakeTensor((40, 64, 576), base + (1 << 32), strides=(page, 576, 1))
        idx = FakeTensor((batch, s_q, 2048), base + (2 << 32), I32)
        out = FakeTensor((batch, s_q, 8, 512), base + (3 << 32))
        lse_t = FakeTensor((batch, s_q, 8), base + (4 << 32), FP32) if lse else None
        shape = {None: None, "token": (batch, s_q), "flat": (batch * s_q,),
                 "request": (batch,)}[topk_length]
        tl = FakeTensor(shape, base + (5 << 32), I32) if shape else None
        sk = FakeTensor((8,), base + (6 << 32), FP32) if sink else None
        return [q, kv, idx, out, lse_t, tl, sk]

    @staticmethod
    def full(tensors):
        """A call's 7 tensors (topk_length and sink None when not given)."""
        return list(tensors) + [None] * (7 - len(tensors))

    def fresh(self, tensors, workspace):
        """What PlanDecode makes for these tensors and workspace."""
        q, kv, idx, out, lse, tl, sk = self.full(tensors)
        args = ops.call_args(q, kv, idx, out, lse, self.SCALE, 1, None, 0, topk_length=tl,
                             sink=sk)
        return plan_decode(self.manifest, self.device, args, workspace)

    def moved(self, tensors):
        """The same tensors at other addresses of the same alignment class."""
        shift = self.rng.randrange(1, 1 << 20) * 512
        return [t.at(t.data_ptr() + shift + 512 * i) if t else None
                for i, t in enumerate(tensors)]

    def check_hit(self, cache, tensors, misses):
        plan, pointers = cache.lookup(*self.full(tensors), self.SCALE)
        self.assertEqual(cache.misses, misses)
        workspace = (1 << 40) + self.rng.randrange(1 << 16) * 256 if plan.workspace_bytes else 0
        plan.bind(pointers, workspace)
        want = self.fresh(tensors, workspace)
        self.assertEqual(plan.blocks(), (want.main_params, want.combine_params))
        self.assertEqual(plan.workspace_bytes, want.workspace_bytes if want.needs_combine else 0)
        self.assertEqual(plan.launch[:3], want.grid)
        return plan

    def test_a_first_answer_is_planned_as_the_module_it_is(self):
        # glm-5 TP8 sm_90a as a server's first answer: its main and combine
        # entries only (what CheckAnswerForVariant accepts of it).
        full = compiled()
        partial = artifact_pb2.KernelArtifact()
        partial.CopyFrom(full)
        partial.partial = True
        partial.ClearField("small_batch")
        partial.ClearField("cluster")
        del partial.entries[:]
        partial.entries.extend(e for e in full.entries
                               if e.name in (full.main_entry, full.combine_entry))

        class Loaded:
            artifact = partial
            max_active_clusters = 0

        def make_args(q, kv, idx, out, lse, topk_length, sink, scale, extra):
            return ops.call_args(q, kv, idx, out, lse, scale, 1, None, 0,
                                 topk_length=topk_length, sink=sink, extra=extra)
        whole = self.launch.PlanCache(self.manifest, self.device, make_args)
        plan, _ = whole.lookup(*self.call(batch=4), self.SCALE)
        self.assertTrue(plan.selection.plan.small_batch)  # the module's own choice at 4
        first = self.launch.PlanCache(self.manifest, self.device, make_args, lambda v: Loaded)
        for batch in (1, 4, 256):
            with self.subTest(batch=batch):
                plan, _ = first.lookup(*self.call(batch=batch), self.SCALE)
                self.assertEqual(plan.selection.plan.main_entry, full.main_entry)
                self.assertFalse(plan.selection.plan.small_batch)
                self.assertFalse(plan.selection.plan.cluster)
        self.assertEqual(first.manifest.manifest.variants[0].small_batch.entry, "")
        self.assertEqual(self.manifest.variants[0].small_batch.entry, "sparse_mla_decode_small")

        # The whole module in the first answer's place (SparseMlaDecoder.
        # refresh): planned as the decoder's manifest has it again, the
        # first answer's plans dropped.
        class Whole:
            artifact = full
            max_active_clusters = 0

        self.assertTrue(first.note_kernel(Whole))
        self.assertEqual(len(first), 0)
        self.assertEqual(first.manifest.manifest, self.manifest)
        self.assertFalse(first.note_kernel(Whole))  # nothing left to change
        first._kernel_for = lambda v: Whole
        plan, _ = first.lookup(*self.call(batch=4), self.SCALE)
        self.assertTrue(plan.selection.plan.small_batch)
        self.assertIs(plan.kernel, Whole)

    def test_hits_write_what_plan_decode_makes(self):
        for batch, lse in ((32, True), (32, False), (1, True), (256, False)):
            with self.subTest(batch=batch, lse=lse):
                cache = self.cache()
                tensors = self.call(batch, lse)
                first = self.check_hit(cache, tensors, 1)
                self.assertEqual(first.combine is not None, batch < 256)
                for _ in range(20):
                    tensors = self.moved(tensors)
                    self.assertIs(self.check_hit(cache, tensors, 1), first)

    def test_topk_length_and_sink_hits(self):
        # Both pointers are written into the blocks on a hit like q's (the
        # combine's sink too), and topk_length_tokens follows the shape.
        for batch, s_q, topk_length, sink, lse, tokens in (
                (32, 1, "token", True, True, 1), (32, 2, "request", True, False, 2),
                (2, 4, "flat", False, True, 1), (256, 1, None, True, True, 1),
                (4, 2, "token", True, True, 1), (1, 4, "request", False, False, 4),
                (128, 1, "request", True, True, 1)):
            with self.subTest(batch=batch, s_q=s_q, topk_length=topk_length, sink=sink):
                cache = self.cache()
                tensors = self.call(batch, lse, s_q=s_q, topk_length=topk_length, sink=sink)
                first = self.check_hit(cache, tensors, 1)
                for _ in range(10):
                    tensors = self.moved(tensors)
                    self.assertIs(self.check_hit(cache, tensors, 1), first)
                p = unpack_decode_params(first.main.buffer.raw)
                tl, sk = tensors[5:]
                self.assertEqual((p["topk_length"], p["sink"], p["topk_length_tokens"]),
                                 (tl.data_ptr() if tl else 0, sk.data_ptr() if sk else 0,
                                  tokens))
                if first.combine is not None:
                    c = unpack_combine_params(first.combine.buffer.raw)
                    self.assertEqual(c["sink"], sk.data_ptr() if sk else 0)

    def test_a_changed_signature_is_planned_again(self):
        cache = self.cache()
        base = self.call(32)
        self.check_hit(cache, base, 1)
        q, kv, idx, out, lse = base[:5]
        tl = FakeTensor((32, 1), (1 << 36) + (5 << 32), I32)
        sk = FakeTensor((8,), (1 << 36) + (6 << 32), FP32)
        changes = {
            "batch": self.call(64),
            "no lse": [q, kv, idx, out, None],
            "q head stride": [FakeTensor((32, 1, 8, 576), q.data_ptr(),
                                         strides=(8 * 640, 8 * 640, 640, 1)), kv, idx, out, lse],
            "kv page stride": [q, kv.at(strides=(64 * 576 + 128, 576, 1)), idx, out, lse],
            "kv 4-dim": [q, FakeTensor((40, 64, 1, 576), kv.data_ptr(),
                                       strides=(64 * 576 + 64, 576, 576, 1)), idx, out, lse],
            "out strides": [q, kv, idx, out.at(strides=(8 * 520, 8 * 520, 520, 1)), lse],
            "indices stride": [q, kv, idx.at(strides=(4096, 4096, 1)), out, lse],
            "out 4 bytes off 16": [q, kv, idx, out.at(out.data_ptr() + 4), lse],
            "topk_length": [q, kv, idx, out, lse, tl],
            "topk_length flat": [q, kv, idx, out, lse, tl.at(shape=(32,), strides=(1,))],
            "topk_length 4 bytes off 16": [q, kv, idx, out, lse, tl.at(tl.data_ptr() + 4)],
            "sink": [q, kv, idx, out, lse, None, sk],
            "sink 4 bytes off 16": [q, kv, idx, out, lse, None, sk.at(sk.data_ptr() + 4)],
            "both": [q, kv, idx, out, lse, tl, sk],
            "both, no lse": [q, kv, idx, out, None, tl, sk],
        }
        misses = 1
        for name, tensors in changes.items():
            with self.subTest(name):
                misses += 1
                self.check_hit(cache, tensors, misses)
                self.check_hit(cache, self.moved(tensors), misses)
        self.check_hit(cache, self.moved(base), misses)  # the first plan is still there

    def test_calls_a_cached_plan_does_not_cover_are_checked(self):
        cache = self.cache()
        base = self.call(32, topk_length="token", sink=True)
        self.check_hit(cache, base, 1)
        q, kv, idx, out, lse, tl, sk = base
        bad = {
            "q: 0x1000000008 is not 16-byte aligned": [q.at(q.data_ptr() + 8), kv, idx, out, lse],
            "kv: .* is not 16-byte aligned": [q, kv.at(kv.data_ptr() + 4), idx, out, lse],
            "out: .* is not 4-byte aligned": [q, kv, idx, out.at(out.data_ptr() + 2), lse],
            "lse: .* is not 4-byte aligned": [q, kv, idx, out, lse.at(lse.data_ptr() + 2)],
            "indices: .* is not 4-byte aligned": [q, kv, idx.at(idx.data_ptr() + 2), out, lse],
            "q: null": [q.at(0), kv, idx, out, lse],
            "kv_page_stride: got 36868 elements": [q, kv.at(strides=(64 * 576 + 4, 576, 1)),
                                                   idx, out, lse],
            "q: expected dtype bfloat16, got float16": [q.at(dtype=FakeDtype("float16")), kv,
                                                        idx, out, lse],
            "out: expected dtype bfloat16, got float32": [q, kv, idx, out.at(dtype=FP32), lse],
            "lse: expected dtype float32": [q, kv, idx, out, lse.at(dtype=BF16)],
            "kv_cache is on cuda:1 but q on cuda:0": [q, kv.at(device=FakeDevice("cuda", 1)),
                                                      idx, out, lse],
            "q is on cuda:1, this decoder on cuda:0": [
                t.at(device=FakeDevice("cuda", 1)) for t in base],
            "lse is on cuda:1": [q, kv, idx, out, lse.at(device=FakeDevice("cuda", 1))],
            "lse: expected a contiguous": [q, kv, idx, out, lse.at(strides=(16, 16, 1))],
            "out_head_stride.*overlap": [q, kv, idx, out.at(strides=(8 * 512, 8 * 512, 256, 1)),
                                         lse],
            "topk_length: 0x.* is not 4-byte aligned": [q, kv, idx, out, lse,
                                                        tl.at(tl.data_ptr() + 2), sk],
            "sink: 0x.* is not 4-byte aligned": [q, kv, idx, out, lse, tl,
                                                 sk.at(sk.data_ptr() + 2)],
            "topk_length: expected dtype int32, got float32": [q, kv, idx, out, lse,
                                                               tl.at(dtype=FP32), sk],
            "sink: expected dtype float32, got int32": [q, kv, idx, out, lse, tl,
                                                        sk.at(dtype=I32)],
            r"topk_length: expected shape \[batch, s_q\]": [
                q, kv, idx, out, lse, tl.at(shape=(32, 2), strides=(2, 1)), sk],
            "topk_length: must be contiguous": [q, kv, idx, out, lse,
                                                tl.at(shape=(32,), strides=(2,)), sk],
            r"sink: expected a contiguous \[num_q_heads\] = \[8\]": [
                q, kv, idx, out, lse, tl, sk.at(shape=(16,), strides=(1,))],
            "sink: expected a contiguous": [q, kv, idx, out, lse, tl, sk.at(strides=(2,))],
            "topk_length is on cuda:1, the inputs on cuda:0": [
                q, kv, idx, out, lse, tl.at(device=FakeDevice("cuda", 1)), sk],
            "sink is on cpu, the inputs on cuda:0": [
                q, kv, idx, out, lse, tl, sk.at(device=FakeDevice("cpu", None))],
        }
        for pattern, tensors in bad.items():
            tensors = tensors + [tl, sk] if len(tensors) == 5 else tensors
            with self.subTest(pattern):
                with self.assertRaisesRegex((ValueError, TypeError), pattern):
                    cache.lookup(*tensors, self.SCALE)
        with self.assertRaisesRegex(ValueError, "softmax_scale: got 0.07"):
            cache.lookup(*base, 0.07)
        self.assertEqual((cache.misses, len(cache)), (1, 1))  # nothing bad was kept
        self.check_hit(cache, self.moved(base), 1)

    def test_a_plan_that_bind_cannot_reproduce_is_refused(self):
        # A binding that put kv where q goes: the check against a second
        # PlanDecode catches it before the plan is kept or launched.
        launch = self.launch
        swapped = (("q", 1), ("kv", 0)) + launch._MAIN_FIELDS[2:]
        cache = self.cache()
        with unittest.mock.patch.object(launch, "_MAIN_FIELDS", swapped):
            with self.assertRaisesRegex(kforge.KforgeError, "does not reproduce"):
                cache.lookup(*self.call(32), self.SCALE)
        # topk_length and sink swapped, or the combine's sink not written.
        fields = dict(launch._MAIN_FIELDS)
        swapped = tuple((f, {"topk_length": fields["sink"], "sink": fields["topk_length"]}.get(
            f, source)) for f, source in launch._MAIN_FIELDS)
        with unittest.mock.patch.object(launch, "_MAIN_FIELDS", swapped):
            with self.assertRaisesRegex(kforge.KforgeError, "does not reproduce"):
                cache.lookup(*self.call(256, topk_length="token", sink=True), self.SCALE)
        no_sink = tuple(f for f in launch._COMBINE_FIELDS if f[0] != "sink")
        with unittest.mock.patch.object(launch, "_COMBINE_FIELDS", no_sink):
            with self.assertRaisesRegex(kforge.KforgeError, "does not reproduce"):
                cache.lookup(*self.call(32, sink=True), self.SCALE)
            cache.lookup(*self.call(32), self.SCALE)  # null sink: nothing to write
        self.assertEqual(len(cache), 1)
        cache = self.cache()
        # Nor a workspace laid out differently from PlanDecode's.
        wrong = launch._COMBINE_FIELDS[:1] + (("lse_accum", 4),) + launch._COMBINE_FIELDS[2:]
        with unittest.mock.patch.object(launch, "_COMBINE_FIELDS", wrong):
            with self.assertRaisesRegex(kforge.KforgeError, "does not reproduce"):
                cache.lookup(*self.call(32), self.SCALE)
        self.assertEqual(len(cache), 0)
        self.check_hit(cache, self.call(32), 1)

    def test_offsets_and_modulus_from_the_library(self):
        # templates/kforge/sparse_mla/common/params.h: twelve pointers first in
        # DecodeParams, five in CombineParams.
        self.assertEqual([_capi.offsetof("DecodeParams", f)
                          for f in DECODE_PARAMS[0][:DECODE_POINTERS]],
                         list(range(0, 8 * DECODE_POINTERS, 8)))
        self.assertEqual([_capi.offsetof("CombineParams", f) for f in COMBINE_PARAMS[0][:5]],
                         [0, 8, 16, 24, 32])
        self.assertEqual(param_sizes(), (struct.calcsize(DECODE_PARAMS[1]),
                                         struct.calcsize(COMBINE_PARAMS[1])))
        # Every pointer field of a block is one kforge.launch writes.
        self.assertEqual(sorted(f for f, _ in self.launch._MAIN_FIELDS),
                         sorted(DECODE_PARAMS[0][:DECODE_POINTERS]))
        self.assertEqual(sorted(f for f, _ in self.launch._COMBINE_FIELDS),
                         sorted(COMBINE_PARAMS[0][:5]))
        self.assertEqual(ctypes.sizeof(_capi.DecodeArgs), _capi.lib().kforge_sizeof(
            b"KforgeDecodeArgs"))
        self.assertEqual(_capi.DecodeArgs.topk_length_tokens.offset, 7 * 8 + 8 * 4)
        for struct_name, field in (("DecodeParams", "num_tokens"), ("Nope", "q"),
                                   ("CombineParams", "q"), ("CombineParams", "topk_length"),
                                   ("DecodeParams", "topk_length_tokens")):
            with self.assertRaisesRegex(kforge.KforgeError, "no pointer field"):
                _capi.offsetof(struct_name, field)
        lib = _capi.lib()
        self.assertEqual(lib.kforge_offsetof(None, b"q"), _capi._SIZE_MAX)
        self.assertEqual(lib.kforge_offsetof(b"DecodeParams", None), _capi._SIZE_MAX)
        self.assertEqual(_capi.decode_pointer_modulus(), 16)


class LatentSplitTest(unittest.TestCase):
    """d_qk with two kv_lora_rank + rope_dim splits: the keywords that say
    which, through kforge.sparse_mla_decode's own path."""

    def inputs(self, d_qk):
        return (FakeTensor((2, 1, 8, d_qk), 1 << 30),
                FakeTensor((40, 64, d_qk), 1 << 31),
                FakeTensor((2, 1, 2048), 1 << 32, I32))

    def test_ambiguous_width_names_the_keywords(self):
        for d_qk, (r0, p0), (r1, p1) in ((512, (448, 64), (512, 0)),
                                         (320, (256, 64), (320, 0))):
            with self.subTest(d_qk=d_qk):
                with self.assertRaises(ValueError) as cm:
                    kforge.sparse_mla_decode(*self.inputs(d_qk), 0.0625, source=object())
                message = str(cm.exception)
                for word in (f"kv_lora_rank={r0}", f"kv_lora_rank={r1}", f"rope_dim={p0}",
                             f"rope_dim={p1}", "out="):
                    self.assertIn(word, message)

    def test_keywords_pick_the_split(self):
        dims = ops.check_decode_inputs(*(ops.tensor_info(n, t) for n, t in
                                         zip(("q", "kv_cache", "indices"), self.inputs(512))))
        for kwargs, want in (({"kv_lora_rank": 448}, (448, 64)), ({"rope_dim": 64}, (448, 64)),
                             ({"kv_lora_rank": 512}, (512, 0)), ({"rope_dim": 0}, (512, 0)),
                             ({"kv_lora_rank": 448, "rope_dim": 64}, (448, 64)),
                             ({"d_v": 448, "kv_lora_rank": 448}, (448, 64))):
            with self.subTest(**kwargs):
                spec = ops.spec_for_inputs(dims, 0.0625, True, **kwargs)
                self.assertEqual((spec.kv_lora_rank, spec.rope_dim), want)
        self.assertEqual(infer_latent_dims(320, kv_lora_rank=256), (256, 64))
        self.assertEqual(infer_latent_dims(576, rope_dim=64), (512, 64))
        for kwargs, pattern in (({"kv_lora_rank": 448, "rope_dim": 0}, "disagree"),
                                ({"d_v": 512, "kv_lora_rank": 448}, "out= with last dim 512"),
                                ({"kv_lora_rank": 300}, "kv_lora_rank 300 \\+ rope_dim 212"),
                                ({"rope_dim": 512}, "not a spec")):
            with self.subTest(**kwargs):
                with self.assertRaisesRegex(ValueError, pattern):
                    ops.spec_for_inputs(dims, 0.0625, True, **kwargs)

    def test_keyword_reaches_the_decoder(self):
        # Past the split, the next step builds the decoder, which needs torch
        # (absent here): the keyword resolved it. With torch, this machine
        # has no GPU, so it is the device that fails instead.
        import importlib.util
        if importlib.util.find_spec("torch") is not None:
            self.skipTest("PyTorch is installed: the decoder would try the GPU")
        with self.assertRaisesRegex(kforge.KforgeError, "needs PyTorch"):
            kforge.sparse_mla_decode(*self.inputs(512), 0.0625, source=object(),
                                     kv_lora_rank=448)


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
    try:
        unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[4:])
    finally:
        shutil.rmtree(TMP, ignore_errors=True)

"""gRPC client of a kforge server (proto/kforge/v1/service.proto).

RPCs are called by method name with the generated message classes, so no
gRPC code generator is needed. Transient failures (UNAVAILABLE: server down
or restarting; RESOURCE_EXHAUSTED: compile queue full) are retried with
exponential backoff and jitter; every other status fails at once. Every
answer is checked against what was asked before it is returned and kept in
memory, so a second request for the same manifest or kernel makes no RPC.
"""

import logging
import random
import threading
import time

from kforge import _capi
from kforge._proto import pb
from kforge.bundle import LocalCopy
from kforge.errors import KforgeError, KforgeNotFound, KforgeRpcError, KforgeUnavailable
from kforge.source import KernelSource, check_artifact, check_manifest
from kforge.spec import canonical_arch, kernel_spec, selector

_SERVICE = "/kforge.v1.KernelService/"
_RETRIED = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")
# Cubins are tens of KB; the default 4 MB limit would be close for a large
# future kernel, and a RESOURCE_EXHAUSTED from it would be retried in vain.
_MAX_MESSAGE_BYTES = 256 << 20

_log = logging.getLogger("kforge")


def backoff_delay(attempt, initial, maximum, rng):
    """Sleep before retry number `attempt` (1-based): the exponential step
    min(maximum, initial * 2^(attempt-1)) with "equal jitter" (uniform in its
    upper half), so that clients restarted together spread out while each
    still waits at least half a step."""
    step = min(maximum, initial * (2 ** (attempt - 1)))
    return step / 2 + rng.uniform(0, step / 2)


class Client(KernelSource):
    """A kforge server's manifests and kernels.

    address: host:port of `kforge serve`. timeout: seconds one attempt may
    take (a compile on the server counts). max_attempts: tries per request.
    initial_backoff, max_backoff: seconds between tries (see backoff_delay).
    local_copy_dir: optional directory in the bundle layout where every
    answer is also written; kernels are read from it before asking the server
    and manifests when the server is unavailable.
    tls_ca: PEM file of the CA the server's certificate must chain to (turns
    TLS on); tls_cert, tls_key: a client certificate and its key for a server
    that asks for one (mTLS). token / token_file: a bearer token sent as
    `authorization: Bearer ...`; only over TLS. first_answer: on a server's
    miss, take a kernel as soon as its main and combine entries are compiled
    (artifact.partial: correct for every shape, without the small-batch and
    cluster paths); a first answer is neither kept nor copied locally, so
    asking again gets the whole module once the server has cached it.

    What is not given comes from the environment: KFORGE_SERVER (else
    127.0.0.1:50051), KFORGE_LOCAL_COPY_DIR, KFORGE_TLS_CA, KFORGE_TLS_CERT
    with KFORGE_TLS_KEY, KFORGE_TOKEN or KFORGE_TOKEN_FILE, KFORGE_FIRST_ANSWER
    (1 or 0). That rule, its
    checks (errors name the argument or the variable) and the reading of the
    files (regular files, size-capped) are the C++ client's
    (runtime/client_settings.h, through the C ABI).
    """

    def __init__(self, address=None, timeout=120.0, max_attempts=5,
                 initial_backoff=0.1, max_backoff=5.0, local_copy_dir=None, tls_ca=None,
                 tls_cert=None, tls_key=None, token=None, token_file=None, first_answer=None):
        if max_attempts < 1:
            raise ValueError(f"max_attempts: must be >= 1, got {max_attempts}")
        if timeout <= 0 or initial_backoff < 0 or max_backoff < initial_backoff:
            raise ValueError(f"timeout {timeout} must be > 0 and 0 <= initial_backoff "
                             f"{initial_backoff} <= max_backoff {max_backoff}")
        try:
            import grpc
        except ImportError as e:
            raise KforgeError(f"kforge.Client needs the 'grpcio' package ({e}); "
                              "without a server use kforge.Bundle(dir)") from e
        self._grpc = grpc
        msgs = pb().service_pb2
        settings = _capi.client_settings({
            "address": address, "local_copy_dir": local_copy_dir, "tls_ca": tls_ca,
            "tls_cert": tls_cert, "tls_key": tls_key, "token": token, "token_file": token_file,
            "first_answer": None if first_answer is None else ("1" if first_answer else "0")})
        self.address = settings["server"]
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.first_answer = settings.get("first_answer") == "1"
        self.rpc_calls = 0  # attempts made, for tests and metrics
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._manifests = {}
        self._kernels = {}
        self._local = LocalCopy(settings["local_copy_dir"]) if settings["local_copy_dir"] else None
        self._channel = self._connect(grpc, settings)
        self._get_manifest = self._channel.unary_unary(
            _SERVICE + "GetManifest",
            request_serializer=msgs.GetManifestRequest.SerializeToString,
            response_deserializer=msgs.Manifest.FromString)
        self._get_kernel = self._channel.unary_unary(
            _SERVICE + "GetKernel",
            request_serializer=msgs.GetKernelRequest.SerializeToString,
            response_deserializer=msgs.GetKernelResponse.FromString)

    def _connect(self, grpc, settings):
        """A channel with the security the settings hold (files already read
        and checked by the C++ rule)."""
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)]
        self.tls = settings["tls"]
        if not self.tls:
            return grpc.insecure_channel(self.address, options=options)
        pem = lambda key: settings[key].encode() or None  # noqa: E731
        credentials = grpc.ssl_channel_credentials(
            root_certificates=pem("root_certificates"), private_key=pem("private_key"),
            certificate_chain=pem("certificate_chain"))
        if settings["token"]:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(settings["token"]))
        return grpc.secure_channel(self.address, credentials, options=options)

    def _transport_hint(self, details):
        """What an UNAVAILABLE most likely means (runtime/channel.h
        ExplainTransportError says the same for the C++ clients)."""
        details = details or ""
        if not self.tls and "Connection refused" not in details and any(
                s in details for s in ("Socket closed", "Connection reset", "Broken pipe", "EOF")):
            return (" (the server closed a plain-text connection: it probably serves TLS; "
                    "give its CA with tls_ca= or KFORGE_TLS_CA)")
        if self.tls and any(s in details for s in ("andshake", "SSL", "ssl")):
            return (" (the TLS handshake failed: the server may serve plain text, its "
                    "certificate may not chain to tls_ca or name this address, or it wants a "
                    "client certificate: tls_cert=, tls_key= or KFORGE_TLS_CERT, KFORGE_TLS_KEY)")
        return ""

    def __repr__(self):
        return f"Client({self.address!r})"

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _where(self):
        return f"kforge server at {self.address}"

    def _call(self, method, request, what):
        """One RPC with the retry policy; `what` names it in errors."""
        start = time.monotonic()
        for attempt in range(1, self.max_attempts + 1):
            with self._lock:
                self.rpc_calls += 1
            try:
                return method(request, timeout=self.timeout)
            except self._grpc.RpcError as e:
                code, details = e.code().name, e.details()
                if code not in _RETRIED:
                    raise self._refused(what, code, details) from None
                if attempt < self.max_attempts:
                    delay = backoff_delay(attempt, self.initial_backoff, self.max_backoff,
                                          self._rng)
                    _log.info("kforge: %s: %s (%s), attempt %d of %d, retrying in %.2fs",
                              what, code, details, attempt, self.max_attempts, delay)
                    time.sleep(delay)
        raise KforgeUnavailable(
            f"{what}: {self._where()} gave no answer in {self.max_attempts} attempts over "
            f"{time.monotonic() - start:.1f}s; last error {code}: {details}"
            f"{self._transport_hint(details)}. Start a server "
            f"(`kforge serve --listen {self.address}`), point kforge at a running one "
            "(Client(address=...) or KFORGE_SERVER), or use a bundle written by `kforge "
            "prebuild` (Bundle(dir) or KFORGE_BUNDLE)")

    def _refused(self, what, code, details):
        message = f"{what}: {self._where()} answered {code}: {details}"
        if code == "DEADLINE_EXCEEDED":
            message += (f" (each attempt may take {self.timeout}s; a first compile can take "
                        "longer: raise Client(timeout=...))")
        if code == "NOT_FOUND":
            return KforgeNotFound(message)
        return KforgeRpcError(message, code, details)

    def get_manifest(self, preset=None, tp=None, spec=None, arch=None, kv_dtype=None, kind=None):
        """The selection manifest for a preset and tensor-parallel degree, or
        for a spec, on `arch` (the split count is the selector's, per device)."""
        if arch is None:
            raise ValueError("arch= is required (e.g. arch='sm_90a')")
        sel = selector(preset=preset, tp=tp, spec=spec, kv_dtype=kv_dtype, kind=kind)
        key = (sel.SerializeToString(deterministic=True), canonical_arch(arch))
        with self._lock:
            manifest = self._manifests.get(key)
        if manifest is not None:
            return manifest
        request = pb().service_pb2.GetManifestRequest(kernel=sel, arch=arch)
        try:
            manifest = self._call(self._get_manifest, request, f"GetManifest({arch})")
        except KforgeUnavailable as e:
            manifest = self._local.manifest(sel, arch) if self._local else None
            if manifest is None:
                raise
            _log.warning("kforge: %s; using the manifest in the local copy %s", e,
                         self._local.dir)
        else:
            check_manifest(manifest, arch, self._where())
            if self._local:
                self._local.add_manifest(manifest)
        with self._lock:
            self._manifests[key] = manifest
        return manifest

    def get_kernel(self, variant, arch):
        """The compiled kernel (cubin included) of one manifest variant."""
        key = (variant.key, canonical_arch(arch))
        with self._lock:
            artifact = self._kernels.get(key)
        if artifact is None and self._local:
            artifact = self._local.kernel(variant, arch)
        if artifact is None:
            request = pb().service_pb2.GetKernelRequest(arch=arch,
                                                        first_answer=self.first_answer)
            request.kernel.spec.CopyFrom(kernel_spec(variant.spec))
            answer = self._call(self._get_kernel, request,
                                f"GetKernel({variant.module_name}, {arch})")
            artifact = answer.artifact
            check_artifact(variant, arch, artifact, self._where(),
                           accept_partial=self.first_answer)
            if artifact.partial:
                return artifact  # asked again, the whole module once cached
            if self._local:
                self._local.add_kernel(artifact)
        with self._lock:
            self._kernels[key] = artifact
        return artifact

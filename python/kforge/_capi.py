"""kforge's C ABI (capi/kforge_capi.h) through ctypes: the model and bundle
rules (presets, arch spellings, the selector, the decode plan with its
argument checks and parameter blocks, artifact checks, the bundle format)
and the kernel module loader (kforge._module) exist once, in C++, and the
package calls them here.

The library is libkforge_capi.so, which the build copies into
kforge/_native/ (git-ignored, like the kforge/v1 message modules); the
KFORGE_CAPI_LIB environment variable names another copy (a file, or a
directory holding libkforge_capi.so), e.g. one staged for another machine.
It is loaded on first use, so `import kforge` works without it.

Every call returns an absl status code and a message; a failure becomes the
kforge exception for its code (see raise_for). Messages cross as
serialized kforge.v1 protobufs.
"""

import ctypes
import json
import os
import threading

from kforge._proto import pb
from kforge.errors import (KforgeBadAnswer, KforgeError, KforgeInvalidArgument,
                           KforgeNotFound)

ENV_VAR = "KFORGE_CAPI_LIB"
LIB_NAME = "libkforge_capi.so"
CAPI_VERSION = 14  # KFORGE_CAPI_VERSION this module mirrors

# absl::StatusCode values.
OK, INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE, DATA_LOSS = 0, 3, 5, 9, 11, 15

_c_bytes = ctypes.POINTER(ctypes.c_uint8)


class Device(ctypes.Structure):
    """KforgeDevice (model/selector.h DeviceInfo)."""
    _fields_ = [("arch", ctypes.c_char_p), ("sm_count", ctypes.c_int32),
                ("forced_num_splits", ctypes.c_int32), ("max_active_clusters", ctypes.c_int32)]


class Shape(ctypes.Structure):
    """KforgeShape (model/selector.h RuntimeShape)."""
    _fields_ = [(name, ctypes.c_int32) for name in
                ("batch", "s_q", "num_q_heads", "topk", "page_block_size", "kv_dtype")]


class DecodeArgs(ctypes.Structure):
    """KforgeDecodeArgs (model/decode_plan.h DecodeArgs): device addresses
    (0: absent, for lse, topk_length and sink), sizes and strides in
    elements. topk_length_tokens: query tokens per topk_length entry (1 or
    0: one per token; s_q: one per request); reserved 0."""
    _fields_ = ([(name, ctypes.c_uint64) for name in
                 ("q", "kv", "indices", "out", "lse", "topk_length", "sink")] +
                [(name, ctypes.c_int32) for name in
                 ("batch", "s_q", "num_q_heads", "d_qk", "d_v", "topk", "page_block_size",
                  "kv_dtype", "topk_length_tokens", "reserved")] +
                [(name, ctypes.c_int64) for name in
                 ("num_kv_slots", "q_token_stride", "q_head_stride", "kv_page_stride",
                  "kv_row_stride", "indices_stride", "out_token_stride", "out_head_stride")] +
                [("softmax_scale", ctypes.c_double)] +
                # The extra KV cache (spec extra_kv); all 0 without one.
                [(name, ctypes.c_uint64) for name in
                 ("extra_kv", "extra_indices", "extra_topk_length")] +
                [(name, ctypes.c_int32) for name in
                 ("extra_topk", "extra_page_block_size", "extra_kv_dtype", "extra_reserved")] +
                [(name, ctypes.c_int64) for name in
                 ("extra_num_kv_slots", "extra_kv_page_stride", "extra_kv_row_stride",
                  "extra_indices_stride")])


class IndexerLogitsArgs(ctypes.Structure):
    """KforgeIndexerLogitsArgs (model/indexer_plan.h IndexerLogitsArgs):
    device addresses, strides in elements (bytes for q and the cache)."""
    _fields_ = ([(name, ctypes.c_uint64) for name in
                 ("q", "weights", "index_cache", "block_table", "context_lens", "logits")] +
                [(name, ctypes.c_int64) for name in
                 ("q_row_stride", "weights_row_stride", "page_stride", "block_table_stride",
                  "block_table_cols", "logits_stride", "logits_cols")] +
                [(name, ctypes.c_int32) for name in
                 ("batch", "s_q", "max_context", "rows")] +
                [("query_start", ctypes.c_uint64)])


class IndexerTopkArgs(ctypes.Structure):
    """KforgeIndexerTopkArgs (model/indexer_plan.h IndexerTopkArgs)."""
    _fields_ = ([(name, ctypes.c_uint64) for name in
                 ("logits", "context_lens", "indices", "block_table", "slots")] +
                [(name, ctypes.c_int64) for name in
                 ("logits_stride", "indices_stride", "block_table_stride", "slots_stride")] +
                [(name, ctypes.c_int32) for name in
                 ("batch", "s_q", "slot_page_size", "max_context")] +
                [("query_start", ctypes.c_uint64)] +
                [(name, ctypes.c_int32) for name in ("rows", "reserved")])


class EntryParams(ctypes.Structure):
    """KforgeEntryParams (runtime/kernel_module.h EntryParams): what a
    caller passes to the entries of one role. params_bytes 0: the size of
    the block struct_name names, as the library was built."""
    _fields_ = [("role", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("params_bytes", ctypes.c_uint64), ("struct_name", ctypes.c_char_p)]


# (name, argument types) of every function; each returns int32 except where
# _RESTYPES says otherwise.
_ERR = ctypes.POINTER(ctypes.c_char_p)
_OUT = [ctypes.POINTER(_c_bytes), ctypes.POINTER(ctypes.c_size_t)]
_STR_OUT = ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES = {
    "kforge_capi_version": [],
    "kforge_sizeof": [ctypes.c_char_p],
    "kforge_free": [ctypes.c_void_p],
    "kforge_offsetof": [ctypes.c_char_p, ctypes.c_char_p],
    "kforge_decode_pointer_modulus": [],
    "kforge_spec_from_preset": [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, *_OUT,
                                _STR_OUT],
    "kforge_parse_kv_dtype": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32), _STR_OUT],
    "kforge_parse_kv_scale_format": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32), _STR_OUT],
    "kforge_validate_spec": [_c_bytes, ctypes.c_size_t, _STR_OUT],
    "kforge_normalize_spec": [_c_bytes, ctypes.c_size_t, *_OUT, _STR_OUT],
    "kforge_parse_spec": [ctypes.c_char_p, ctypes.c_size_t, *_OUT, _STR_OUT],
    "kforge_presets": [_STR_OUT, _STR_OUT],
    "kforge_canonical_arch": [ctypes.c_char_p, _STR_OUT, _STR_OUT],
    "kforge_arch_for_capability": [ctypes.c_int32, ctypes.c_int32, _STR_OUT, _STR_OUT],
    "kforge_check_device_arch": [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, _STR_OUT],
    "kforge_select": [_c_bytes, ctypes.c_size_t, ctypes.POINTER(Device), ctypes.POINTER(Shape),
                      *_OUT, _STR_OUT],
    "kforge_plan_decode": [_c_bytes, ctypes.c_size_t, ctypes.POINTER(Device),
                           ctypes.POINTER(DecodeArgs), ctypes.c_uint64, *_OUT, _STR_OUT],
    "kforge_plan_indexer_logits": [_c_bytes, ctypes.c_size_t, _c_bytes, ctypes.c_size_t,
                                   ctypes.POINTER(IndexerLogitsArgs), *_OUT, _STR_OUT],
    "kforge_plan_indexer_topk": [_c_bytes, ctypes.c_size_t, _c_bytes, ctypes.c_size_t,
                                 ctypes.POINTER(IndexerTopkArgs), *_OUT, _STR_OUT],
    "kforge_kv_layout": [_c_bytes, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32),
                         ctypes.POINTER(ctypes.c_int32), _STR_OUT],
    "kforge_extra_kv_layout": [_c_bytes, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32),
                               ctypes.POINTER(ctypes.c_int32), _STR_OUT],
    "kforge_workspace_bytes_for": [_c_bytes, ctypes.c_size_t, ctypes.POINTER(Device),
                                   ctypes.c_int32, ctypes.POINTER(ctypes.c_uint64), _STR_OUT],
    "kforge_check_artifact": [_c_bytes, ctypes.c_size_t, ctypes.c_char_p, _c_bytes,
                              ctypes.c_size_t, _STR_OUT],
    "kforge_check_answer": [_c_bytes, ctypes.c_size_t, ctypes.c_char_p, _c_bytes,
                            ctypes.c_size_t, ctypes.c_int32, _STR_OUT],
    "kforge_manifest_for_artifact": [_c_bytes, ctypes.c_size_t, *_OUT, _STR_OUT],
    "kforge_bundle_kernel_path": [ctypes.c_char_p, _STR_OUT, _STR_OUT],
    "kforge_bundle_manifest_path": [_c_bytes, ctypes.c_size_t, _STR_OUT, _STR_OUT],
    "kforge_bundle_open": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), _STR_OUT],
    "kforge_bundle_open_trusted": [ctypes.c_char_p, ctypes.c_char_p,
                                   ctypes.POINTER(ctypes.c_void_p), _STR_OUT],
    "kforge_read_credential_file": [ctypes.c_char_p, ctypes.c_char_p, _STR_OUT, _STR_OUT],
    "kforge_read_token_file": [ctypes.c_char_p, ctypes.c_char_p, _STR_OUT, _STR_OUT],
    "kforge_client_settings": [ctypes.c_char_p, ctypes.c_int32, _STR_OUT, _STR_OUT],
    "kforge_bundle_close": [ctypes.c_void_p],
    "kforge_bundle_manifest": [ctypes.c_void_p, ctypes.c_int32, *_OUT, _STR_OUT],
    "kforge_bundle_get_manifest": [ctypes.c_void_p, _c_bytes, ctypes.c_size_t, ctypes.c_char_p,
                                   *_OUT, _STR_OUT],
    "kforge_bundle_get_kernel": [ctypes.c_void_p, _c_bytes, ctypes.c_size_t, ctypes.c_char_p,
                                 *_OUT, _STR_OUT],
    "kforge_bundle_writer_open": [ctypes.c_char_p, ctypes.c_int32,
                                  ctypes.POINTER(ctypes.c_void_p), _STR_OUT],
    "kforge_bundle_writer_close": [ctypes.c_void_p],
    "kforge_bundle_writer_has_kernel": [ctypes.c_void_p, ctypes.c_char_p,
                                        ctypes.POINTER(ctypes.c_int32), _STR_OUT],
    "kforge_bundle_writer_add_kernel": [ctypes.c_void_p, _c_bytes, ctypes.c_size_t, _STR_OUT],
    "kforge_bundle_writer_add_manifest": [ctypes.c_void_p, _c_bytes, ctypes.c_size_t, _STR_OUT],
    "kforge_bundle_writer_finish": [ctypes.c_void_p, _STR_OUT],
    "kforge_verify_bundle": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32), _STR_OUT, _STR_OUT],
    "kforge_cuda_driver_version": [ctypes.POINTER(ctypes.c_int32), _STR_OUT],
    "kforge_module_load": [_c_bytes, ctypes.c_size_t, ctypes.POINTER(EntryParams), ctypes.c_size_t,
                           ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), _STR_OUT],
    "kforge_module_close": [ctypes.c_void_p],
    "kforge_module_entry": [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32),
                            ctypes.POINTER(ctypes.c_uint64), _STR_OUT],
    "kforge_module_load_into_current_context": [ctypes.c_void_p, _STR_OUT],
    "kforge_module_set_max_dynamic_smem": [ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint32,
                                           _STR_OUT],
    "kforge_module_allow_non_portable_cluster": [ctypes.c_void_p, ctypes.c_int32, _STR_OUT],
    "kforge_module_max_active_clusters": [ctypes.c_void_p, ctypes.c_int32, *[ctypes.c_uint32] * 5,
                                          ctypes.POINTER(ctypes.c_int32), _STR_OUT],
    # params: bytes, a ctypes buffer or an address; stream: a CUstream as an int.
    "kforge_module_launch": [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t,
                             *[ctypes.c_uint32] * 5, ctypes.c_void_p, ctypes.c_int32, _STR_OUT],
}
_RESTYPES = {"kforge_sizeof": ctypes.c_size_t, "kforge_offsetof": ctypes.c_size_t,
             "kforge_free": None,
             "kforge_bundle_close": None, "kforge_bundle_writer_close": None,
             "kforge_module_close": None}

_lib = None
_lock = threading.Lock()


def library_path():
    """Where the library is looked for: $KFORGE_CAPI_LIB (a file or a
    directory), else kforge/_native/libkforge_capi.so."""
    path = os.environ.get(ENV_VAR)
    if path:
        return os.path.join(path, LIB_NAME) if os.path.isdir(path) else path
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native", LIB_NAME)


def lib():
    """The loaded library, its functions typed; KforgeError saying how to
    get it when it is missing or does not match this package."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            raise KforgeError(
                f"kforge's native library cannot be loaded ({e}). The build writes it to "
                f"python/kforge/_native/{LIB_NAME} (run scripts/build.sh, or build the "
                f"kforge_capi target); ${ENV_VAR} may name another copy") from None
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(handle, name)
            fn.argtypes = argtypes
            fn.restype = _RESTYPES.get(name, ctypes.c_int32)
        version = handle.kforge_capi_version()
        if version != CAPI_VERSION:
            raise KforgeError(f"{path}: C ABI version {version}, this package binds version "
                              f"{CAPI_VERSION}; rebuild kforge_capi from the same tree")
        for struct in (Device, Shape, DecodeArgs, IndexerLogitsArgs, IndexerTopkArgs,
                       EntryParams):
            name = "Kforge" + struct.__name__
            if handle.kforge_sizeof(name.encode()) != ctypes.sizeof(struct):
                raise KforgeError(f"{path}: {name} is {handle.kforge_sizeof(name.encode())} "
                                  f"bytes there, {ctypes.sizeof(struct)} here")
        _lib = handle
        return _lib


def raise_for(code, message):
    """The exception for an absl status code: INVALID_ARGUMENT and
    OUT_OF_RANGE -> KforgeInvalidArgument (also a ValueError), NOT_FOUND ->
    KforgeNotFound, DATA_LOSS -> KforgeBadAnswer, others KforgeError."""
    if code in (INVALID_ARGUMENT, OUT_OF_RANGE):
        raise KforgeInvalidArgument(message, code)
    if code == NOT_FOUND:
        raise KforgeNotFound(message)
    if code == DATA_LOSS:
        raise KforgeBadAnswer(message)
    error = KforgeError(message)
    error.code = code
    raise error


def _take_string(pointer):
    """A library-allocated C string as str, freed."""
    if not pointer.value:
        return ""
    try:
        return ctypes.string_at(pointer.value).decode("utf-8", "replace")
    finally:
        lib().kforge_free(pointer.value)


def call(name, *args, bytes_out=False, strings_out=0):
    """Calls kforge_<name>(*args, [outputs], &error): returns the output
    bytes (bytes_out) and/or strings (strings_out of them), or raises."""
    fn = getattr(lib(), "kforge_" + name)
    extra, data, size, strings = [], _c_bytes(), ctypes.c_size_t(0), []
    if bytes_out:
        extra += [ctypes.byref(data), ctypes.byref(size)]
    for _ in range(strings_out):
        strings.append(ctypes.c_void_p())
        extra.append(ctypes.byref(strings[-1]))
    error = ctypes.c_void_p()
    code = fn(*args, *extra, ctypes.byref(error))
    message = _take_string(error)
    if code != OK:
        raise_for(code, message or f"kforge_{name} failed with status code {code}")
    outputs = []
    if bytes_out:
        try:
            outputs.append(ctypes.string_at(data, size.value))
        finally:
            lib().kforge_free(data)
    outputs += [_take_string(s) for s in strings]
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def buffer(data):
    """(pointer, size) arguments for bytes."""
    data = bytes(data)
    return ctypes.cast(ctypes.c_char_p(data), _c_bytes), len(data)


def serialized(message):
    return buffer(message.SerializeToString(deterministic=True))


def parse(cls, data):
    message = cls()
    message.ParseFromString(data)
    return message


_SIZE_MAX = ctypes.c_size_t(-1).value


def offsetof(struct_name, field):
    """offsetof(struct_name, field) of a parameter block's pointer field as
    the library was built (kforge_offsetof)."""
    offset = lib().kforge_offsetof(struct_name.encode(), field.encode())
    if offset == _SIZE_MAX:
        raise KforgeError(f"kforge_offsetof: {struct_name} has no pointer field {field!r}")
    return offset


def decode_pointer_modulus():
    """kDecodePointerModulus: a plan holds for pointers null where its own
    were and equal to them modulo this."""
    return lib().kforge_decode_pointer_modulus()


def device(arch, sm_count, forced_num_splits=0, max_active_clusters=0):
    return Device(str(arch).encode(), int(sm_count), int(forced_num_splits or 0),
                  int(max_active_clusters or 0))


# ---------------------------------------------------------------- the calls

def spec_from_preset(name, tensor_parallel, kv_dtype=0):
    return parse(pb().spec_pb2.AttentionSpec,
                 call("spec_from_preset", str(name).encode(), int(tensor_parallel),
                      int(kv_dtype), bytes_out=True))


def parse_kv_dtype(name):
    """ParseKvDtype: a KvCacheDtype value from a name ("bf16", "fp8_ds_mla",
    ...; any case; or a KV_CACHE_DTYPE_* name)."""
    out = ctypes.c_int32(0)
    call("parse_kv_dtype", str(name).encode(), ctypes.byref(out))
    return out.value


def parse_kv_scale_format(name):
    """ParseKvScaleFormat: a KvScaleFormat value from "pow2" / "arbitrary"
    (any case; or a KV_SCALE_FORMAT_* name)."""
    out = ctypes.c_int32(0)
    call("parse_kv_scale_format", str(name).encode(), ctypes.byref(out))
    return out.value


def validate_spec(kernel_spec):
    """The case's validation of a KernelSpec (model/spec.h NormalizeKernelSpec)."""
    call("validate_spec", *serialized(kernel_spec))


def normalize_spec(kernel_spec):
    """NormalizeKernelSpec: a KernelSpec in, its normalized KernelSpec out."""
    return parse(pb().spec_pb2.KernelSpec,
                 call("normalize_spec", *serialized(kernel_spec), bytes_out=True))


def parse_spec(text):
    """A spec file's text (JSON or text proto; the KernelSpec form or the
    flat form of a sparse MLA spec: model/spec.h ParseSpecText) as a
    KernelSpec."""
    data = text.encode() if isinstance(text, str) else bytes(text)
    return parse(pb().spec_pb2.KernelSpec,
                 call("parse_spec", data, len(data), bytes_out=True))


def preset_names():
    return call("presets", strings_out=1).split()


def canonical_arch(name):
    return call("canonical_arch", str(name).encode(), strings_out=1)


def arch_for_capability(major, minor):
    return call("arch_for_capability", int(major), int(minor), strings_out=1)


def check_device_arch(arch, major, minor):
    call("check_device_arch", str(arch).encode(), int(major), int(minor))


def select(manifest_bytes, dev, shape):
    return parse(pb().artifact_pb2.LaunchPlan,
                 call("select", *buffer(manifest_bytes), ctypes.byref(dev),
                      ctypes.byref(shape), bytes_out=True))


def plan_decode(manifest_bytes, dev, args, workspace):
    return parse(pb().artifact_pb2.LaunchPlan,
                 call("plan_decode", *buffer(manifest_bytes), ctypes.byref(dev),
                      ctypes.byref(args), int(workspace), bytes_out=True))


def plan_indexer(kind, spec_bytes, launch_bytes, args):
    """PlanIndexerLogits (kind "logits", args an IndexerLogitsArgs) or
    PlanIndexerTopk ("topk", IndexerTopkArgs) for a module's serialized
    spec and IndexerLaunch: a LaunchPlan (main_entry, grid, block, shared
    memory, main_params = the parameter block)."""
    return parse(pb().artifact_pb2.LaunchPlan,
                 call(f"plan_indexer_{kind}", *buffer(spec_bytes), *buffer(launch_bytes),
                      ctypes.byref(args), bytes_out=True))


def kv_layout(spec_bytes, extra=False):
    """KvLayoutOf (or, with extra, ExtraKvLayoutOf: the spec's extra cache):
    (bytes of one token's cache record, bytes per element the cache's
    strides count)."""
    row, elem = ctypes.c_int32(0), ctypes.c_int32(0)
    call("extra_kv_layout" if extra else "kv_layout", *buffer(spec_bytes), ctypes.byref(row),
         ctypes.byref(elem))
    return row.value, elem.value


def workspace_bytes_for(manifest_bytes, dev, max_tokens):
    out = ctypes.c_uint64(0)
    call("workspace_bytes_for", *buffer(manifest_bytes), ctypes.byref(dev), int(max_tokens),
         ctypes.byref(out))
    return out.value


def check_artifact(variant, arch, artifact, accept_partial=False):
    call("check_answer", *serialized(variant), str(arch).encode(), *serialized(artifact),
         1 if accept_partial else 0)


def manifest_for_artifact(artifact):
    return parse(pb().service_pb2.Manifest,
                 call("manifest_for_artifact", *serialized(artifact), bytes_out=True))


def bundle_kernel_path(key):
    return call("bundle_kernel_path", str(key).encode(), strings_out=1)


def bundle_manifest_path(manifest):
    return call("bundle_manifest_path", *serialized(manifest), strings_out=1)


def verify_bundle(directory):
    """[(path, message)] of every problem VerifyBundle finds; [] = good."""
    count = ctypes.c_int32(0)
    report = call("verify_bundle", os.fsencode(directory), ctypes.byref(count), strings_out=1)
    return [tuple(line.split("\t", 1)) for line in report.splitlines() if line]


class _Handle:
    """An opaque handle closed by `closer` when collected or closed."""

    def __init__(self, opener, closer, *args):
        handle = ctypes.c_void_p()
        call(opener, *args, ctypes.byref(handle))
        self._handle, self._closer = handle, closer
        self._lib = lib()

    @property
    def handle(self):
        if self._handle is None:
            raise KforgeError("used after close()")
        return self._handle

    def close(self):
        if self._handle is not None:
            getattr(self._lib, "kforge_" + self._closer)(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


def read_credential_file(path, what):
    """base/credentials.h ReadCredentialFile: a PEM file's text."""
    return call("read_credential_file", os.fsencode(path), what.encode(), strings_out=1)


def read_token_file(path, what):
    """base/credentials.h ReadTokenFile: the file's first bearer token."""
    return call("read_token_file", os.fsencode(path), what.encode(), strings_out=1)


def client_settings(given, allow_bundle=False):
    """runtime/client_settings.h: a client's settings from `given` (a dict
    by the keys "address", "bundle", "trust", "local_copy_dir", "tls_ca",
    "tls_cert", "tls_key", "token", "token_file"; None = not given), else
    the KFORGE_* environment variables, checked, with the TLS and token
    files read: a dict with "server", "bundle", "trust" (the bundle's
    signer's public key file; "" = none), "local_copy_dir", "tls",
    "root_certificates", "certificate_chain", "private_key" (PEM text) and
    "token" ("" = none). Errors name the argument or the variable."""
    given = {key: os.fsdecode(value) if key != "token" else value
             for key, value in given.items() if value is not None}
    text = call("client_settings", json.dumps(given).encode(), 1 if allow_bundle else 0,
                strings_out=1)
    return json.loads(text)


class BundleSource(_Handle):
    """bundle/bundle.h BundleSource (with a trust key: only a bundle signed by it)."""

    def __init__(self, directory, trust=None):
        if trust is None:
            super().__init__("bundle_open", "bundle_close", os.fsencode(directory))
        else:
            super().__init__("bundle_open_trusted", "bundle_close", os.fsencode(directory),
                             os.fsencode(trust))

    def manifests(self):
        out, index = [], 0
        while True:
            try:
                data = call("bundle_manifest", self.handle, index, bytes_out=True)
            except KforgeInvalidArgument as e:
                if e.code == OUT_OF_RANGE:
                    return out
                raise
            out.append(parse(pb().service_pb2.Manifest, data))
            index += 1

    def get_manifest(self, selector, arch):
        return parse(pb().service_pb2.Manifest,
                     call("bundle_get_manifest", self.handle, *serialized(selector),
                          str(arch).encode(), bytes_out=True))

    def get_kernel(self, variant, arch):
        return parse(pb().artifact_pb2.KernelArtifact,
                     call("bundle_get_kernel", self.handle, *serialized(variant),
                          str(arch).encode(), bytes_out=True))


class BundleWriter(_Handle):
    """bundle/bundle.h BundleWriter; per_write=True is BundleLocking::kPerWrite."""

    def __init__(self, directory, per_write):
        super().__init__("bundle_writer_open", "bundle_writer_close", os.fsencode(directory),
                         1 if per_write else 0)

    def has_kernel(self, key):
        has = ctypes.c_int32(0)
        call("bundle_writer_has_kernel", self.handle, str(key).encode(), ctypes.byref(has))
        return bool(has.value)

    def add_kernel(self, artifact):
        call("bundle_writer_add_kernel", self.handle, *serialized(artifact))

    def add_manifest(self, manifest):
        call("bundle_writer_add_manifest", self.handle, *serialized(manifest))

    def finish(self):
        call("bundle_writer_finish", self.handle)

"""kforge Python client: fetch sparse MLA kernels from a kforge server or a
bundle, pick the variant and launch configuration for a shape, and run them
on PyTorch tensors.

    import kforge
    kforge.configure(address="127.0.0.1:50051")   # or bundle="/path/to/bundle"
    out, lse = kforge.sparse_mla_decode(q, kv_cache, indices, 0.0625,
                                        return_lse=True)

Every rule (presets, arch names, selection, launch math, argument checks,
the bundle format, artifact checks) and the kernel module loader are
kforge's C++ model, bundle and runtime libraries, bound through its C ABI
(kforge/_native/libkforge_capi.so, see kforge._capi). Importing kforge needs
neither that library, torch, a CUDA driver, grpcio nor the generated
message modules (kforge/v1/*_pb2.py, written by the build): each is loaded
when first used, with an error saying what is missing.
"""

from kforge.bundle import Bundle, verify_bundle
from kforge.dsa_indexer import DsaIndexer, dsa_indexer_topk
from kforge.client import Client
from kforge.errors import (KforgeBadAnswer, KforgeError, KforgeInvalidArgument, KforgeNotFound,
                           KforgeRpcError, KforgeUnavailable)
from kforge.kernel import Kernel
from kforge.fp8 import dequantize_fp8_ds_mla, quantize_fp8_ds_mla
from kforge.ops import (SparseMlaDecoder, configure, default_source, kv_row_bytes_for,
                        sparse_mla_decode)
from kforge.plan import Device, Selection, Shape, plan_decode, select, workspace_bytes_for
from kforge.spec import PRESETS, spec_from_preset

__all__ = ["Bundle", "Client", "Device", "DsaIndexer", "Kernel", "dequantize_fp8_ds_mla",
           "dsa_indexer_topk", "kv_row_bytes_for",
           "quantize_fp8_ds_mla", "KforgeBadAnswer", "KforgeError",
           "KforgeInvalidArgument", "KforgeNotFound", "KforgeRpcError", "KforgeUnavailable",
           "PRESETS", "Selection", "Shape", "SparseMlaDecoder", "configure", "default_source",
           "plan_decode", "prefetch", "select", "spec_from_preset", "sparse_mla_decode",
           "verify_bundle", "workspace_bytes_for"]


def prefetch(manifest, arch=None, source=None):
    """Fetches every variant's kernel of `manifest` from `source` (default:
    the configured one); returns the artifacts in variant order."""
    return (source if source is not None else default_source()).prefetch(manifest, arch)


def __getattr__(name):
    # kforge.__version__ is CMake's project() version, written into
    # kforge/_version.py at configure time; looked up on first use so that
    # importing kforge still needs nothing generated.
    if name == "__version__":
        from kforge._version import __version__
        return __version__
    raise AttributeError(f"module 'kforge' has no attribute {name!r}")

"""kforge Python client: fetch sparse MLA kernels from a kforge server or a
bundle, pick the variant and launch configuration for a shape, and run them
on PyTorch tensors.

    import kforge
    kforge.configure(address="127.0.0.1:50051")   # or bundle="/path/to/bundle"
    out, lse = kforge.sparse_mla_decode(q, kv_cache, indices, 0.0625,
                                        return_lse=True)

Importing kforge needs neither torch, cuda-python nor grpcio, nor the
generated message modules (kforge/v1/*_pb2.py, written by scripts/build.sh):
each is imported when first used, with an error saying what is missing.
"""

from kforge.bundle import Bundle
from kforge.client import Client
from kforge.errors import (KforgeBadAnswer, KforgeError, KforgeNotFound, KforgeRpcError,
                           KforgeUnavailable)
from kforge.ops import SparseMlaDecoder, configure, default_source, sparse_mla_decode
from kforge.select import Device, Selection, Shape
from kforge.spec import PRESETS, spec_from_preset

__all__ = ["Bundle", "Client", "Device", "KforgeBadAnswer", "KforgeError", "KforgeNotFound",
           "KforgeRpcError", "KforgeUnavailable", "PRESETS", "Selection", "Shape",
           "SparseMlaDecoder", "configure", "default_source", "prefetch", "spec_from_preset",
           "sparse_mla_decode"]


def prefetch(manifest, arch=None, source=None):
    """Fetches every variant's kernel of `manifest` from `source` (default:
    the configured one); returns the artifacts in variant order."""
    return (source if source is not None else default_source()).prefetch(manifest, arch)

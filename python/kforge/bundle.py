"""Bundles: directories of prebuilt kernels and manifests used with no server.

The format (layout, checksums, marker, version) and its checks are
bundle/bundle.h's, reached through the C ABI: Bundle reads one with
BundleSource (`kforge prebuild` writes them), LocalCopy keeps a Client's
answers with BundleWriter in the same layout, so that kernels survive a
restart and manifests a server outage. verify_bundle is `kforge verify`.
"""

import logging
import os
import threading

from kforge import _capi
from kforge.errors import KforgeError, KforgeNotFound
from kforge.source import KernelSource
from kforge.spec import selector

_log = logging.getLogger("kforge")


def first_choice(manifest):
    """The variant the manifest ranks first."""
    return manifest.variants[manifest.choice_order[0] if manifest.choice_order else 0]


def kernel_path(key):
    """BundleKernelPath: "kernels/<key>.kfa"."""
    return _capi.bundle_kernel_path(key)


def manifest_path(manifest):
    """BundleManifestPath: "manifests/<first-choice module_name>.json"."""
    return _capi.bundle_manifest_path(manifest)


def verify_bundle(directory):
    """VerifyBundle: [(path, message)] for every problem; [] = good."""
    return _capi.verify_bundle(os.fspath(directory))


class Bundle(KernelSource):
    """Reads manifests and kernels from a bundle directory, no server.

    Opening checks the marker and format version and reads and verifies
    every manifest; kernels are read on demand, checked against
    checksums.sha256 and their variant, and kept in memory. Every error
    names the file. trust: an Ed25519 public key file (PEM, `kforge keygen`);
    a bundle not signed by it (`kforge prebuild --sign`) is refused."""

    def __init__(self, directory, trust=None):
        self.dir = os.fspath(directory)
        self._source = _capi.BundleSource(self.dir, None if trust is None else os.fspath(trust))
        self.manifests = self._source.manifests()
        self._lock = threading.Lock()  # a BundleSource handle: one thread at a time

    def __repr__(self):
        return f"Bundle({self.dir!r})"

    def get_manifest(self, preset=None, tp=None, spec=None, arch=None, kv_dtype=None, kind=None):
        if arch is None:
            raise ValueError("arch= is required (e.g. arch='sm_90a')")
        sel = selector(preset=preset, tp=tp, spec=spec, kv_dtype=kv_dtype, kind=kind)
        with self._lock:
            return self._source.get_manifest(sel, arch)

    def get_kernel(self, variant, arch):
        with self._lock:
            return self._source.get_kernel(variant, arch)


class LocalCopy:
    """A Client's copy of what it fetched, in the bundle layout (readable
    with Bundle), written by BundleWriter with per-write locking (the C++
    client's local copy), so several processes (Python or C++) may share
    one directory. Damaged or unlisted files read as absent: they are
    fetched again."""

    def __init__(self, directory):
        self.dir = os.fspath(directory)
        self._lock = threading.Lock()  # a BundleWriter: one thread at a time
        self._writer = _capi.BundleWriter(self.dir, per_write=True)
        with self._lock:
            self._writer.finish()  # an empty copy is a readable bundle

    def add_kernel(self, artifact):
        with self._lock:
            self._writer.add_kernel(artifact)
            self._writer.finish()

    def add_manifest(self, manifest):
        with self._lock:
            self._writer.add_manifest(manifest)
            self._writer.finish()

    def _read(self, what, read):
        try:
            return read(_capi.BundleSource(self.dir))
        except KforgeNotFound:
            return None
        except KforgeError as e:
            _log.warning("kforge: ignoring the local copy of %s in %s: %s", what, self.dir, e)
            return None

    def kernel(self, variant, arch):
        """The stored kernel of `variant`, or None when absent or damaged."""
        return self._read(variant.module_name, lambda b: b.get_kernel(variant, arch))

    def manifest(self, sel, arch):
        """The stored manifest for a selector on `arch`, or None."""
        return self._read(f"the manifest for {arch}", lambda b: b.get_manifest(sel, arch))

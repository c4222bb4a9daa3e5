"""What a kernel source (a server, a bundle) offers, and the checks every
answer passes before an engine may load it (bundle/kernel_source.h; the
checks are the C++ ones, through the C ABI)."""

import concurrent.futures

from kforge import _capi
from kforge.errors import KforgeBadAnswer, KforgeError
from kforge.spec import canonical_arch


class KernelSource:
    """get_manifest(preset=, tp= | spec=, arch=) and get_kernel(variant,
    arch); implemented by Client (a server) and Bundle (a directory)."""

    def get_manifest(self, preset=None, tp=None, spec=None, arch=None, kv_dtype=None, kind=None):
        raise NotImplementedError

    def get_kernel(self, variant, arch):
        raise NotImplementedError

    def prefetch(self, manifest, arch=None):
        """Fetches the kernel of every variant of `manifest` (so that later
        get_kernel calls are answered from memory); returns them in variant
        order. One thread per variant: a server compiles them in parallel,
        so a cold start waits for the slowest, not the sum."""
        arch = arch or manifest.arch
        variants = list(manifest.variants)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(variants))) as pool:
            return list(pool.map(lambda v: self.get_kernel(v, arch), variants))


def _bad(where, what):
    return KforgeBadAnswer(f"{where} answered {what}")


def check_manifest(manifest, arch, where):
    """Raises KforgeBadAnswer unless `manifest` is for `arch`, with the
    variants and in-range first choice that using it relies on (the C++
    client's check: BundleManifestPath)."""
    arch = canonical_arch(arch)
    if canonical_arch(manifest.arch) != arch:
        raise _bad(where, f"a manifest for arch {manifest.arch!r}, asked for {arch}")
    try:
        _capi.bundle_manifest_path(manifest)
    except KforgeError as e:
        raise _bad(where, f"a bad manifest: {e}") from None


def check_artifact(variant, arch, artifact, where, accept_partial=False):
    """Raises KforgeBadAnswer naming the first mismatch unless `artifact` is
    the kernel `variant` names for `arch` (CheckArtifactForVariant: key,
    module, arch, entries, spec, tiling, launch rule, parameter block sizes,
    and the cubin's own ELF); with accept_partial, or a first answer of it
    (artifact.partial, CheckAnswerForVariant)."""
    try:
        _capi.check_artifact(variant, arch, artifact, accept_partial)
    except KforgeError as e:
        raise _bad(where, f"a wrong kernel: {e}") from None

"""What a kernel source (a server, a bundle) offers, and the checks every
answer passes before an engine may load it (runtime/kernel_source.h)."""

import concurrent.futures
import ctypes

from kforge.driver import CombineParams, DecodeParams
from kforge.errors import KforgeBadAnswer
from kforge.spec import canonical_arch

_ELF_MAGIC = b"\x7fELF"


class KernelSource:
    """get_manifest(preset=, tp= | spec=, arch=) and get_kernel(variant,
    arch); implemented by Client (a server) and Bundle (a directory)."""

    def get_manifest(self, preset=None, tp=None, spec=None, arch=None):
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


def _one_line(message):
    from google.protobuf import text_format
    return text_format.MessageToString(message, as_one_line=True)


def _bad(where, what):
    return KforgeBadAnswer(f"{where} answered {what}")


def check_manifest(manifest, arch, where):
    """Raises KforgeBadAnswer unless `manifest` is usable for `arch`."""
    arch = canonical_arch(arch)
    if canonical_arch(manifest.arch) != arch:
        raise _bad(where, f"a manifest for arch {manifest.arch!r}, asked for {arch}")
    if not manifest.variants:
        raise _bad(where, f"a manifest with no variants (arch {arch})")
    for i, index in enumerate(manifest.choice_order):
        if index >= len(manifest.variants):
            raise _bad(where, f"a manifest whose choice_order[{i}] = {index} is out of "
                              f"range ({len(manifest.variants)} variants)")


def check_artifact(variant, arch, artifact, where):
    """Raises KforgeBadAnswer naming the first mismatch unless `artifact` is
    the kernel `variant` names for `arch`: same key, module, arch, entry
    points, spec, tiling and launch rule, parameter blocks of the sizes this
    loader fills, and a non-empty ELF cubin built for `arch` that exports
    both entries with those sizes (CheckArtifactForVariant in C++; the cubin
    facts come from the artifact's cubin_info, not a reparse of the ELF)."""
    arch = canonical_arch(arch)
    asked = f"(asked for {variant.module_name} on {arch})"
    for field, want, got in (("key", variant.key, artifact.key),
                             ("module_name", variant.module_name, artifact.module_name),
                             ("arch", arch, artifact.arch),
                             ("main_entry", variant.main_entry, artifact.main_entry),
                             ("combine_entry", variant.combine_entry, artifact.combine_entry),
                             # The parameter blocks the loader fills (kforge.driver).
                             ("params_bytes", ctypes.sizeof(DecodeParams), artifact.params_bytes),
                             ("combine_params_bytes", ctypes.sizeof(CombineParams),
                              artifact.combine_params_bytes)):
        if want != got:
            raise _bad(where, f"a kernel whose {field} is {got!r}, expected {want!r} {asked}")
    for field in ("spec", "tiling", "launch"):
        if getattr(variant, field) != getattr(artifact, field):
            raise _bad(where, f"a kernel whose {field} differs from the manifest's {asked}: "
                              f"manifest {{{_one_line(getattr(variant, field))}}}, "
                              f"kernel {{{_one_line(getattr(artifact, field))}}}")
    if not artifact.cubin:
        raise _bad(where, f"a kernel with an empty cubin {asked}")
    if not artifact.cubin.startswith(_ELF_MAGIC):
        raise _bad(where, f"a kernel whose cubin is not an ELF file {asked}")
    if artifact.cubin_info.arch != arch:
        raise _bad(where, f"a cubin built for {artifact.cubin_info.arch!r} {asked}")
    exported = {k.name: k.param_bytes for k in artifact.cubin_info.kernels}
    for entry, params in ((variant.main_entry, artifact.params_bytes),
                          (variant.combine_entry, artifact.combine_params_bytes)):
        if entry not in exported:
            raise _bad(where, f"a cubin that does not export {entry!r} (it exports "
                              f"{sorted(exported)}) {asked}")
        if exported[entry] != params:
            raise _bad(where, f"a cubin whose {entry} takes {exported[entry]} parameter "
                              f"bytes, expected {params} {asked}")

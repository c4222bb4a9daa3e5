"""Specs, presets and target names, from kforge's C++ model library
(model/spec.h, model/arch.h) through the C ABI: the preset table and the
arch rules live there only.
"""

import collections.abc

from kforge import _capi
from kforge._proto import pb
from kforge.errors import KforgeError, KforgeInvalidArgument

# Enum values of spec.proto, usable without the generated modules.
KV_CACHE_DTYPE_BF16 = 1
KV_CACHE_DTYPE_FP8_DS_MLA = 2
KV_CACHE_DTYPE_FP8_DS_MLA_V4 = 3
KV_CACHE_DTYPE_MXFP8_DS_MLA_V41 = 4
KV_CACHE_DTYPE_NVFP4_DS_MLA = 5
KV_SCALE_FORMAT_POW2 = 1
KV_SCALE_FORMAT_ARBITRARY = 2


def make_spec(*, num_q_heads, kv_lora_rank, rope_dim, topk, s_q, page_block_size,
              softmax_scale, return_lse, kv_dtype=None, kv_scale_format=None):
    """A sparse MLA decode AttentionSpec (not validated: validate_spec;
    rope_dim always set: the server rejects an absent one). kv_dtype as
    kv_dtype_value takes it (bf16 by default); an fp8_ds_mla cache needs
    kv_scale_format "pow2" or "arbitrary" (how its scales were written)."""
    return pb().spec_pb2.AttentionSpec(
        num_q_heads=num_q_heads,
        kv_lora_rank=kv_lora_rank, rope_dim=rope_dim, topk=topk, s_q=s_q,
        kv_cache_dtype=kv_dtype_value(kv_dtype) or KV_CACHE_DTYPE_BF16,
        page_block_size=page_block_size, softmax_scale=softmax_scale, return_lse=return_lse,
        kv_scale_format=kv_scale_format_value(kv_scale_format))


def kernel_spec(spec):
    """A KernelSpec as given, or the sparse MLA one of an AttentionSpec (or
    the indexer one of a DsaIndexerSpec): what a request carries."""
    spec_pb2 = pb().spec_pb2
    if isinstance(spec, spec_pb2.KernelSpec):
        return spec
    if isinstance(spec, spec_pb2.AttentionSpec):
        return spec_pb2.KernelSpec(sparse_mla_decode=spec)
    if isinstance(spec, spec_pb2.DsaIndexerSpec):
        return spec_pb2.KernelSpec(dsa_indexer=spec)
    raise TypeError("spec: expected kforge.v1.KernelSpec, AttentionSpec or DsaIndexerSpec, got "
                    f"{type(spec).__name__}")


def sparse_mla_spec(spec, what):
    """The AttentionSpec of a KernelSpec of the sparse_mla_decode case;
    KforgeError naming `what` (a module) and its case otherwise."""
    case = spec.WhichOneof("kind")
    if case != "sparse_mla_decode":
        raise KforgeError(f"{what} is a {case or 'kind-less'} module, not a sparse_mla_decode one")
    return spec.sparse_mla_decode


def validate_spec(spec):
    """The spec's validation (model/spec.h ValidateSpec for sparse MLA,
    model/indexer_spec.h for the indexer): KforgeInvalidArgument (a
    ValueError) naming every field kforge cannot build, with what it
    supports. Takes what kernel_spec takes."""
    _capi.validate_spec(kernel_spec(spec))


def kv_dtype_value(kv_dtype):
    """A KvCacheDtype value from a name ("bf16", "fp8_ds_mla",
    "fp8_ds_mla_v4", "mxfp8_ds_mla_v41", "nvfp4_ds_mla"; the C++ table in
    model/spec.h parses it), an enum value, or None (bf16)."""
    if kv_dtype is None:
        return 0
    if isinstance(kv_dtype, str):
        return _capi.parse_kv_dtype(kv_dtype)
    return int(kv_dtype)


def kv_scale_format_value(kv_scale_format):
    """A KvScaleFormat value from "pow2" / "arbitrary" (the C++ parser in
    model/spec.h reads it), an enum value, or None (unspecified: a bf16
    cache has no scales)."""
    if kv_scale_format is None:
        return 0
    if isinstance(kv_scale_format, str):
        return _capi.parse_kv_scale_format(kv_scale_format)
    return int(kv_scale_format)


def spec_from_preset(name, tp=1, kv_dtype=None):
    """SpecFromPreset (model/spec.h): heads / tp, s_q 1, bf16 cache, pages
    of 64, lse on. KforgeInvalidArgument (a ValueError) for an unknown
    preset or a degree that does not divide the heads."""
    if not isinstance(tp, int) or isinstance(tp, bool):
        raise KforgeInvalidArgument(f"tensor_parallel: got {tp!r}, expected an int")
    return _capi.spec_from_preset(name, tp, kv_dtype_value(kv_dtype))


class _Presets(collections.abc.Mapping):
    """name -> the preset's AttentionSpec at tensor-parallel degree 1, read
    from the C++ table on first use (so `import kforge` needs no native
    library)."""

    def _table(self):
        return {name: _capi.spec_from_preset(name, 1) for name in _capi.preset_names()}

    def __getitem__(self, name):
        return self._table()[name]

    def __iter__(self):
        return iter(_capi.preset_names())

    def __len__(self):
        return len(_capi.preset_names())

    def __repr__(self):
        return f"PRESETS({', '.join(self)})"


PRESETS = _Presets()


# --kind's names (model/indexer_spec.h ParseAttentionKind) as enum values.
KINDS = {"sparse-mla": 1, "dsa-indexer": 2}


def selector(preset=None, tp=None, spec=None, kv_dtype=None, kind=None):
    """The KernelSelector for a preset (+ tensor-parallel degree, KV cache
    dtype, bf16 by default, and kind: "sparse-mla", the default, or
    "dsa-indexer", the preset's DSA indexer) or a spec."""
    if (preset is None) == (spec is None):
        raise ValueError("give either preset= (with tp=) or spec=, not both or neither")
    if spec is not None and tp is not None:
        raise ValueError("tp= goes with preset=; a spec already fixes num_q_heads")
    if spec is not None and kv_dtype is not None:
        raise ValueError("kv_dtype= goes with preset=; a spec already fixes its cache dtype")
    sel = pb().service_pb2.KernelSelector()
    if spec is not None:
        sel.spec.CopyFrom(kernel_spec(spec))
    else:
        sel.preset.name = preset
        sel.preset.tensor_parallel = 1 if tp is None else tp
        sel.preset.kv_cache_dtype = kv_dtype_value(kv_dtype)
        if kind is not None and kind != "sparse-mla":
            if kind not in KINDS:
                raise ValueError(f"kind: got {kind!r}, supported {', '.join(KINDS)}")
            sel.preset.kind = KINDS[kind]
    if spec is not None and kind is not None:
        raise ValueError("kind= goes with preset=; a spec already fixes its kind")
    return sel


def canonical_arch(name):
    """CanonicalArchName: "90a", "SM_90A " -> "sm_90a"; a name kforge does
    not build for is returned as given (and then matches nothing)."""
    try:
        return _capi.canonical_arch(name)
    except KforgeInvalidArgument:
        raise
    except KforgeError as e:
        if getattr(e, "code", None) == _capi.FAILED_PRECONDITION:
            return str(name)
        raise


def arch_for_capability(major, minor):
    """ArchForComputeCapability: the target to ask for on a device."""
    return _capi.arch_for_capability(major, minor)


def check_arch_runs(arch, capability):
    """CheckDeviceArch: raises KforgeError unless a cubin for `arch` runs on
    a device of compute capability `capability` (major, minor)."""
    _capi.check_device_arch(arch, *capability)


def infer_latent_dims(d_qk, d_v=None, *, kv_lora_rank=None, rope_dim=None):
    """(kv_lora_rank, rope_dim) for a q/kv row width d_qk = kv_lora_rank +
    rope_dim, as ValidateSpec accepts them. Where two splits are valid
    (512 = 448 + 64 or 512 + 0), kv_lora_rank= or rope_dim= says which, or
    d_v (the output width, = kv_lora_rank: an out= tensor's last dim)."""
    def valid(rank, rope):
        try:
            validate_spec(make_spec(num_q_heads=1, kv_lora_rank=rank, rope_dim=rope,
                                          topk=1, s_q=1, page_block_size=64,
                                          softmax_scale=1.0, return_lse=False))
            return True
        except KforgeInvalidArgument:
            return False

    given = {}  # how the caller said it: the rank each way implies
    if kv_lora_rank is not None:
        given["kv_lora_rank"] = int(kv_lora_rank)
    if rope_dim is not None:
        given["rope_dim"] = d_qk - int(rope_dim)
    if d_v is not None:
        given["out"] = int(d_v)
    if given:
        ranks = set(given.values())
        if len(ranks) > 1:
            said = ", ".join(f"{k}={v}" if k == "kv_lora_rank" else
                             f"rope_dim={d_qk - v}" if k == "rope_dim" else
                             f"out= with last dim {v}" for k, v in given.items())
            raise KforgeInvalidArgument(f"d_qk {d_qk}: {said} disagree (d_qk = kv_lora_rank + "
                                        "rope_dim, and out's last dim is kv_lora_rank)")
        rank = ranks.pop()
        if not valid(rank, d_qk - rank):
            raise KforgeInvalidArgument(
                f"d_qk {d_qk}: kv_lora_rank {rank} + rope_dim {d_qk - rank} is not a spec "
                "kforge builds (see ValidateSpec)")
        return rank, d_qk - rank
    fits = [(d_qk - rope, rope) for rope in (64, 0) if d_qk - rope > 0 and valid(d_qk - rope, rope)]
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise KforgeInvalidArgument(
            f"d_qk {d_qk}: no kv_lora_rank + rope_dim split of it is a spec kforge builds "
            "(e.g. 576 = 512 + 64)")
    (r0, p0), (r1, p1) = fits
    raise KforgeInvalidArgument(
        f"d_qk {d_qk} is {r0} + {p0} or {r1} + {p1} (kv_lora_rank + rope_dim): pass "
        f"kv_lora_rank={r0} or kv_lora_rank={r1} (or rope_dim={p0} / rope_dim={p1}) to say "
        "which; an out= tensor's last dim says it too")

"""The kernel-calling core of kforge's vLLM backend: vLLM-layout tensors in,
attention output out. Imports no vLLM, so it is tested where vLLM cannot be
installed (the GPU host: tests/check_core_gpu.py).

vLLM's layouts, as its sparse-MLA backends receive them (vLLM 0.33,
SparseMLACommonImpl.forward_mqa -> _forward_mqa_kernel):
  q            [tokens, heads, kv_lora_rank + rope_dim] bf16, or the pair
               (q_latent [tokens, heads, kv_lora_rank], q_rope [tokens,
               heads, rope_dim]) the MLA layer hands forward_mqa
  kv_cache     [num_blocks, block_size, row] per layer: row = kv_lora_rank +
               rope_dim bf16 values, or an fp8_ds_mla record of 656 uint8
               bytes (a NoPE model's too: its RoPE slot is written as zeros),
               or an nvfp4_ds_mla record of 352; the block stride may exceed
               block_size rows (vLLM interleaves other layers' pages)
  topk_indices [tokens, width] int32 physical slots, as vLLM's conversion
               (sparse_utils.triton_convert_req_index_to_global_index)
               numbers them: block * block_stride_rows + offset, the block
               stride counted in rows (flat_kv_row_view), -1 = none, the
               valid ones compacted to the front
  valid_counts [tokens] int32: how many of a token's slots are valid
               (FlashMLA's topk_length, kforge's topk_length)
  sinks        [heads] fp32, an attention-sink logit per head, as vLLM's
               MLA layer hands an impl the `sinks` keyword (natural log,
               the units of the scaled logits)
and what the backend returns under decode context parallelism (DCP):
  lse          [tokens, heads] fp32, natural log (vLLM's lse_base_on_e),
               -inf (with a zero output) for a token none of whose slots
               are on this rank: the identity of vLLM's cross-rank merge

Every rule about the kernel (which specs it builds, selection, launch,
argument checks) is the kforge package's; this module only maps vLLM's
vocabulary onto a kforge spec and vLLM's slot numbering onto kforge's
pages.
"""

import kforge
from kforge import spec as kforge_spec

# vLLM's cache dtype names -> kforge's. "auto" is the model dtype, bf16 for
# every model this backend accepts (supported_dtypes).
KV_CACHE_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "fp8_ds_mla": "fp8_ds_mla",
                   "nvfp4_ds_mla": "nvfp4_ds_mla"}

# vLLM's names for a plain fp8 cache that its own sparse-MLA backends serve as
# fp8_ds_mla: FLASHMLA_SPARSE lists "fp8" and turns any quantized dtype into
# fp8_ds_mla, FLASHINFER_MLA_SPARSE_SM120 turns "fp8" and "fp8_e4m3" (and
# "auto") into it (vLLM 0.33, mla_attention.
# _canonicalize_sparse_mla_kv_cache_dtype). GLM-5's config turns "auto" into
# "fp8_e4m3" on sm_100 (GlmMoeDsaForCausalLM.verify_and_update_config).
FP8_ALIASES = ("fp8", "fp8_e4m3")

# vLLM's fp8_ds_mla writer (concat_and_cache_ds_mla) stores each 128-value
# tile's scale as amax / 448, a float that is not a power of two, for every
# model; kforge's pow2 kernels would misread it.
VLLM_FP8_SCALE_FORMAT = "arbitrary"

# An fp8_ds_mla record always holds 64 RoPE values (656 bytes), a NoPE
# model's too: vLLM 0.33 sizes the record at 656 bytes whatever the head
# size (MLAAttention.get_kv_cache_spec), writes its RoPE slot as zeros and
# pads q with zeros to match (FlashMLASparseImpl.q_head_size,
# FP8_DS_MLA_ROPE_DIM). kforge reads it the same way: a 512 + 64 spec, q
# padded (q_rope . 0 = 0).
FP8_DS_MLA_ROPE_DIM = 64


class UnsupportedConfig(ValueError):
    """A model or cache configuration kforge's backend cannot serve; the
    message names the setting, its value and what is supported."""


def kforge_kv_dtype(cache_dtype):
    """kforge's name for a vLLM kv_cache_dtype; UnsupportedConfig else."""
    name = str(cache_dtype) if cache_dtype is not None else "auto"
    if name not in KV_CACHE_DTYPES:
        raise UnsupportedConfig(
            f"kv_cache_dtype: got {name!r}, kforge's sparse MLA backend supports "
            f"{', '.join(sorted(KV_CACHE_DTYPES))} (use fp8_ds_mla for an fp8 cache)")
    return KV_CACHE_DTYPES[name]


def canonical_cache_dtype(cache_dtype, auto_is_fp8=False):
    """The cache dtype a vLLM layer writes for kforge's backend, given the one
    it was configured with: FP8_ALIASES become fp8_ds_mla (vLLM writes the
    plain names as an e4m3 cache with one scale, which kforge does not
    read), and so does "auto" where `auto_is_fp8` (kforge standing in for
    vLLM's sm_120 backend, whose default it is); any other name unchanged."""
    name = str(cache_dtype) if cache_dtype is not None else "auto"
    if name in FP8_ALIASES or (auto_is_fp8 and name == "auto"):
        return "fp8_ds_mla"
    return name


def attention_spec(*, num_heads, kv_lora_rank, rope_dim, topk, page_size, softmax_scale,
                   cache_dtype, return_lse=False):
    """The kforge AttentionSpec of one vLLM sparse-MLA layer: heads on this
    rank, the model's latent and rope widths (rope 0: a NoPE model, head
    size 512), the width of the top-k buffer (vLLM converts and counts every
    column of it), vLLM's block size and the model's softmax scale. A NoPE
    model's fp8_ds_mla cache is read as 512 + 64 (FP8_DS_MLA_ROPE_DIM).
    return_lse: kernels that also write the lse (vLLM asks for it under
    decode context parallelism only). UnsupportedConfig naming every field
    kforge cannot build."""
    kv_dtype = kforge_kv_dtype(cache_dtype)
    if kv_dtype == "fp8_ds_mla" and int(rope_dim) == 0:
        rope_dim = FP8_DS_MLA_ROPE_DIM
    spec = kforge_spec.make_spec(
        num_q_heads=int(num_heads), kv_lora_rank=int(kv_lora_rank), rope_dim=int(rope_dim),
        topk=int(topk), s_q=0, page_block_size=int(page_size),
        softmax_scale=float(softmax_scale), return_lse=bool(return_lse), kv_dtype=kv_dtype,
        kv_scale_format=VLLM_FP8_SCALE_FORMAT if kv_dtype == "fp8_ds_mla" else None)
    try:
        kforge_spec.validate_spec(spec)
    except kforge.KforgeInvalidArgument as e:
        raise UnsupportedConfig(f"kforge cannot build this model's sparse MLA kernel: {e}") \
            from e
    return spec


def prebuild_matrix(spec, tp, arch, name="vllm"):
    """A kforge deployment matrix (docs/MATRIX.md) holding exactly the
    kernel this backend asks for: `spec` is one rank's (as attention_spec
    makes it), `tp` the tensor-parallel degree, `arch` the GPU's kforge
    target. `kforge prebuild` / `kforge warm` of it leave nothing to compile
    at engine start. The spec is written as the kforge package serializes
    it, so the scale's float32 value, part of the kernel's key, survives."""
    from google.protobuf import json_format
    model = type(spec)()
    model.CopyFrom(spec)
    model.num_q_heads = spec.num_q_heads * int(tp)  # a matrix spec counts every head
    return {"models": [{"name": name, "tp": [int(tp)],
                        "spec": json_format.MessageToDict(model)}],
            "archs": [arch]}


def page_view(shape, strides, page_size):
    """(shape, strides) of kforge's pages over a vLLM layer cache of
    `shape` [num_blocks, block_size, row] and `strides` (in elements):
    [num_rows / page_size, page_size, row] contiguous pages from the layer's
    first row, so that kforge's slot (page * page_size + offset) is vLLM's
    (block * block_stride_rows + offset, block_stride_rows = strides[0] /
    row: sparse_utils.flat_kv_row_view). The view spans the rows between a
    layer's blocks too (other layers' pages, never indexed). Needs whole
    pages: blocks page_size rows long and a whole number of pages apart,
    as the backend asks vLLM to lay them out (customize_spec); ValueError
    otherwise."""
    shape, strides = tuple(shape), tuple(strides)
    if len(shape) != 3 or shape[1] != page_size:
        raise ValueError(f"kv_cache: expected [num_blocks, {page_size}, row] (the block size "
                         f"this backend was built for), got shape {list(shape)}")
    num_blocks, _, row = shape
    if num_blocks < 1 or strides[2] != 1 or strides[1] != row or \
            strides[0] <= 0 or strides[0] % (page_size * row) != 0:
        raise ValueError(f"kv_cache: expected contiguous rows and blocks a whole number of "
                         f"{page_size}-row pages apart, got strides {list(strides)} for shape "
                         f"{list(shape)}")
    pages_per_block = strides[0] // (page_size * row)
    return ((num_blocks - 1) * pages_per_block + 1, page_size, row), (page_size * row, row, 1)


def flat_pages(kv_cache, page_size):
    """The layer cache as kforge's pages (page_view): a view, no copy."""
    shape, strides = page_view(kv_cache.shape, kv_cache.stride(), page_size)
    return kv_cache.as_strided(shape, strides)


class SparseMlaCore:
    """kforge's sparse MLA on vLLM-layout tensors for one layer shape on
    one GPU: decode, MTP (any number of query tokens per request) and
    prefill alike, one query row per token with its own top-k (sparse
    prefill is the same computation)."""

    def __init__(self, spec, device=None, source=None):
        self.spec = spec
        self.page_size = int(spec.page_block_size)
        self.topk = int(spec.topk)
        self.kv_lora_rank = int(spec.kv_lora_rank)
        self.d_qk = self.kv_lora_rank + int(spec.rope_dim)
        self.decoder = kforge.SparseMlaDecoder(source=source, spec=spec, device=device)

    def prefetch(self):
        """Loads every kernel of the manifest (engine start, before CUDA
        graph capture); returns how many."""
        return self.decoder.prefetch()

    def __call__(self, q, kv_cache, slots, out=None, *, topk_length=None, sink=None,
                 return_lse=False):
        """out [tokens, heads, kv_lora_rank] bf16 for q (a tensor or vLLM's
        (latent, rope) pair; narrower than the spec's d_qk, a NoPE q on a
        512 + 64 fp8_ds_mla cache, it is padded with zeros), the layer's
        paged cache, and vLLM's slots [tokens, >= topk] int32 of it (the
        first topk columns are read; flat_pages says how they number the
        cache). topk_length [tokens] int32 (vLLM's valid counts: only each
        token's first topk_length slots count) and sink [heads] fp32 are
        optional, None when vLLM gives none. return_lse (a spec built with
        return_lse): (out, lse [tokens, heads] fp32, natural log, without
        the sink; -inf for a token with no valid slot, whose out is zero).
        Launches on torch's current stream."""
        import torch
        if isinstance(q, (tuple, list)):
            q = torch.cat(tuple(q), dim=-1)
        if q.shape[-1] < self.d_qk:
            q = torch.nn.functional.pad(q, (0, self.d_qk - q.shape[-1]))
        pages = flat_pages(kv_cache, self.page_size)
        if out is None:
            out = q.new_empty((q.shape[0], q.shape[1], self.kv_lora_rank))
        if q.shape[0] == 0:
            return (out, q.new_empty(q.shape[:2], dtype=torch.float32)) if return_lse else out
        return self.decoder(q, pages, slots[:, :self.topk], out=out, topk_length=topk_length,
                            sink=sink, return_lse=return_lse)

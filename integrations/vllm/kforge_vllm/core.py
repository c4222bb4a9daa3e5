"""The kernel-calling core of kforge's vLLM backend: vLLM-layout tensors in,
attention output out. Imports no vLLM, so it is tested where vLLM cannot be
installed (the GPU host: tests/check_core_gpu.py).

vLLM's layouts, as its sparse-MLA backends receive them:
  q            [tokens, heads, kv_lora_rank + rope_dim] bf16, or the pair
               (q_latent [tokens, heads, kv_lora_rank], q_rope [tokens,
               heads, rope_dim]) the MLA layer hands forward_mqa
  kv_cache     [num_blocks, block_size, row] per layer: row = kv_lora_rank +
               rope_dim bf16 values, or an fp8_ds_mla record of 656 uint8
               bytes, or an nvfp4_ds_mla record of 352; the block stride may exceed block_size rows (vLLM
               interleaves other layers' pages), kforge reads it as given
  topk         [tokens, >= topk] int32: the indexer's top-k token positions
               within each token's request, -1 = none
  req_id_per_token [tokens] int32 and block_table [requests, max_blocks]
               int32 (the metadata builder's)

Every rule about the kernel (which specs it builds, selection, launch,
argument checks) is the kforge package's; this module only maps vLLM's
vocabulary onto a kforge spec and the top-k positions onto cache slots.
"""

import kforge
from kforge import spec as kforge_spec

# vLLM's cache dtype names -> kforge's. "auto" is the model dtype, bf16 for
# every model this backend accepts (supported_dtypes).
KV_CACHE_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "fp8_ds_mla": "fp8_ds_mla",
                   "nvfp4_ds_mla": "nvfp4_ds_mla"}

# vLLM's fp8_ds_mla writer (concat_and_cache_ds_mla) stores each 128-value
# tile's scale as amax / 448, a float that is not a power of two, for every
# model; kforge's pow2 kernels would misread it.
VLLM_FP8_SCALE_FORMAT = "arbitrary"


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


def attention_spec(*, num_heads, kv_lora_rank, rope_dim, topk, page_size, softmax_scale,
                   cache_dtype):
    """The kforge AttentionSpec of one vLLM sparse-MLA layer: heads on this
    rank, the model's latent and rope widths, the indexer's top-k, vLLM's
    block size and the model's softmax scale. No lse: vLLM asks for it only
    under decode context parallelism, which this backend declines.
    UnsupportedConfig naming every field kforge cannot build."""
    kv_dtype = kforge_kv_dtype(cache_dtype)
    spec = kforge_spec.make_spec(
        num_q_heads=int(num_heads), kv_lora_rank=int(kv_lora_rank), rope_dim=int(rope_dim),
        topk=int(topk), s_q=0, page_block_size=int(page_size),
        softmax_scale=float(softmax_scale), return_lse=False, kv_dtype=kv_dtype,
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


def topk_to_slots(topk, req_id_per_token, block_table, page_size):
    """Cache slots [tokens, topk] int32 (block * page_size + offset; -1
    where the position is -1 or past the block table's width) of the
    indexer's positions `topk` [tokens, topk] through each token's
    request's row of `block_table`. Torch ops only, with no host sync: safe
    inside a captured CUDA graph."""
    import torch
    pos = topk.clamp(min=0)
    column = torch.div(pos, page_size, rounding_mode="floor")
    valid = (topk >= 0) & (column < block_table.shape[1])
    column = column.clamp_(max=block_table.shape[1] - 1)  # in bounds; masked below
    rows = req_id_per_token.to(torch.long).unsqueeze(1).expand_as(column)
    blocks = block_table[rows, column.to(torch.long)]
    slots = blocks * page_size + pos.remainder(page_size)
    return torch.where(valid, slots, torch.full_like(slots, -1)).to(torch.int32)


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
        self.decoder = kforge.SparseMlaDecoder(source=source, spec=spec, device=device)

    def prefetch(self):
        """Loads every kernel of the manifest (engine start, before CUDA
        graph capture); returns how many."""
        return self.decoder.prefetch()

    def slots(self, topk, req_id_per_token, block_table):
        """topk_to_slots over the first `topk` columns (vLLM's buffer may be
        wider, padded)."""
        return topk_to_slots(topk[:, :self.topk], req_id_per_token, block_table, self.page_size)

    def __call__(self, q, kv_cache, slots, out=None):
        """out [tokens, heads, kv_lora_rank] bf16 for q (a tensor or vLLM's
        (latent, rope) pair), the layer's paged cache and slots [tokens,
        topk] int32 (slots()). Launches on torch's current stream."""
        import torch
        if isinstance(q, (tuple, list)):
            q = torch.cat(tuple(q), dim=-1)
        if kv_cache.dim() != 3 or kv_cache.shape[1] != self.page_size:
            raise ValueError(f"kv_cache: expected [num_blocks, {self.page_size}, row] (the "
                             f"block size this backend was built for), got shape "
                             f"{list(kv_cache.shape)}")
        if out is None:
            out = q.new_empty((q.shape[0], q.shape[1], self.kv_lora_rank))
        if q.shape[0] == 0:
            return out
        return self.decoder(q, kv_cache, slots, out=out)

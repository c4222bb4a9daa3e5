"""kforge's sparse-MLA attention backend for vLLM 0.33 (the classes vLLM's
registry resolves): KforgeSparseMlaBackend, its metadata builder and its
impl. The kernel calls are kforge_vllm.core's; what is here is vLLM's
interface: what the backend declares to the selector, the KV cache it asks
for, the per-batch metadata, and forward_mqa.

Every query token (decode, MTP, prefill) goes through forward_mqa, one row
per token with its own top-k: the impl declares no dense-MHA prefill, so
vLLM's MLA layer hands it the whole batch. forward_mqa is vLLM's own
(SparseMLACommonImpl): it turns the indexer's positions into slots and
counts the valid ones per token, and hands both to _forward_mqa_kernel,
which is kforge's.

The cache dtype a layer writes is not the backend's to choose in vLLM 0.33:
MLAAttention asks mla_attention._canonicalize_sparse_mla_kv_cache_dtype,
which turns "fp8" (and "fp8_e4m3", "auto" on sm_120) into fp8_ds_mla for
vLLM's own sparse backends only, by name. Importing this module wraps that
function so that it asks a kforge backend class its own rule
(KforgeSparseMlaBackend.canonical_kv_cache_dtype) and every other backend
vLLM's; the class cannot be resolved without this import, so no layer
builds with kforge's backend before the wrapper is in place.
"""

import json
from typing import ClassVar

import torch
from kforge import spec as kforge_spec
from vllm.config import get_current_vllm_config
from vllm.logger import init_logger
from vllm.model_executor.layers.attention import mla_attention
from vllm.model_executor.layers.attention.sparse_mla_attention import (
    SparseMLACommonImpl, SparseMLACommonMetadata, SparseMLACommonMetadataBuilder)
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionLayer,
                                       AttentionType)
from vllm.v1.attention.backends.mla.index_group import HiSparseMLAIndexGroup
from vllm.v1.attention.backends.mla.sparse_utils import align_blocks_to_rows

from kforge_vllm import core

# Under vLLM's logger, whose handlers print what vLLM's own messages print.
logger = init_logger("vllm.kforge_vllm")

# kforge builds any page size 1..kMaxPageBlockSize; the backend asks vLLM
# for 64-token blocks, the size every vLLM sparse-MLA backend and indexer
# uses, so that one prebuilt kernel per model serves every deployment.
PAGE_SIZE = 64


class KforgeSparseMlaMetadata(SparseMLACommonMetadata):
    """vLLM's sparse-MLA metadata: block_table [requests, max_blocks] int32,
    req_id_per_token [tokens] int32, block_size, topk_tokens, the
    decode/prefill split."""


class KforgeSparseMlaMetadataBuilder(SparseMLACommonMetadataBuilder[KforgeSparseMlaMetadata]):
    """vLLM's sparse-MLA builder (request of every token, block table,
    decode/prefill split); forward_mqa turns the indexer's positions into
    slots from them. Full CUDA graphs for uniform batches: decode with 1..4
    query tokens per request (MTP)."""

    metadata_cls = KforgeSparseMlaMetadata
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # A speculative request's 1 + k tokens count as a decode, so MTP
        # batches are uniform and captured whole.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)


def _model_dims(vllm_config):
    """(heads the kernel sees on this rank, kv_lora_rank, rope_dim,
    index_topk) of the model, or UnsupportedConfig. Under decode context
    parallelism the MLA layer gathers the query heads of the DCP group
    (DeepseekV32Attention: dcp_manager.query_gather), so the kernel runs
    heads per TP rank x the DCP size."""
    model_config = vllm_config.model_config
    text = model_config.hf_text_config
    topk = getattr(text, "index_topk", None)
    if topk is None:
        raise core.UnsupportedConfig(
            f"{getattr(text, 'model_type', 'this model')}: no index_topk in its config; "
            "kforge's backend serves sparse (DSA) MLA models such as DeepSeek-V3.2 and GLM-5")
    heads = model_config.get_num_attention_heads(vllm_config.parallel_config)
    heads *= max(int(vllm_config.parallel_config.decode_context_parallel_size), 1)
    return heads, int(text.kv_lora_rank), int(text.qk_rope_head_dim), int(topk)


def _context_parallel_problem(parallel_config):
    """Why kforge's backend cannot serve this context parallelism, or None.
    DCP alone and PCP alone are served (module README); both together are
    not: under PCP+DCP the prefill rows attend over the DCP shards gathered
    into one workspace (vLLM's FLASHMLA_SPARSE does it in its own metadata
    builder and impl) and only the decode rows are merged by lse, which this
    backend's builder does not lay out."""
    pcp = int(parallel_config.prefill_context_parallel_size)
    dcp = int(parallel_config.decode_context_parallel_size)
    if pcp > 1 and dcp > 1:
        return (f"prefill context parallelism ({pcp}) together with decode context "
                f"parallelism ({dcp}): kforge's backend does not gather the DCP KV shards "
                "for the PCP prefill rows (FLASHMLA_SPARSE does); use one of the two")
    return None


class KforgeSparseMlaBackend(AttentionBackend):
    """Sparse MLA (DeepSeek-V3.2, GLM-5 and their shapes) on kforge kernels.
    Selected with --attention-backend KFORGE_MLA_SPARSE (or CUSTOM)."""

    supported_dtypes: ClassVar[list] = [torch.bfloat16]
    # The plain fp8 names are accepted as vLLM's own sparse backends accept
    # them, and the layer writes them as fp8_ds_mla (canonical_kv_cache_dtype).
    supported_kv_cache_dtypes: ClassVar[list] = list(core.KV_CACHE_DTYPES) + \
        list(core.FP8_ALIASES)
    # Whether "auto" means fp8_ds_mla (KforgeSm120TakeOverBackend).
    auto_is_fp8: ClassVar[bool] = False

    @staticmethod
    def get_name():
        # The AttentionBackendEnum member kforge_vllm.register() adds
        # (kforge_vllm.NAME): a name no other plugin takes, unlike CUSTOM.
        return "KFORGE_MLA_SPARSE"

    @classmethod
    def canonical_kv_cache_dtype(cls, kv_cache_dtype):
        """The cache dtype the layer writes for `kv_cache_dtype` (what vLLM's
        _canonicalize_sparse_mla_kv_cache_dtype returns for this class):
        fp8 and fp8_e4m3 are fp8_ds_mla, as for vLLM's own sparse backends."""
        return core.canonical_cache_dtype(kv_cache_dtype, cls.auto_is_fp8)

    @staticmethod
    def get_impl_cls():
        return KforgeSparseMlaImpl

    @staticmethod
    def get_builder_cls():
        return KforgeSparseMlaMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [PAGE_SIZE]

    @classmethod
    def get_supported_head_sizes(cls):
        # kv_lora_rank 512 + rope 64 (DeepSeek-V3.2, GLM-5), and 512 + 0 for
        # NoPE models (bf16 rows of 512, or fp8_ds_mla records of 656 with
        # the RoPE slot zero, as vLLM writes them: core.FP8_DS_MLA_ROPE_DIM).
        return [576, 512]

    @classmethod
    def is_mla(cls):
        return True

    @classmethod
    def is_sparse(cls):
        return True

    @classmethod
    def supports_sink(cls):
        # A per-head sink logit the MLA layer passes the impl as `sinks`.
        return True

    @classmethod
    def customize_spec(cls, spec):
        # Blocks a whole number of rows apart, so a block's rows are a page.
        return align_blocks_to_rows(spec, PAGE_SIZE)

    @classmethod
    def supports_compute_capability(cls, capability):
        # kforge's arch table decides (model/arch.h through the package);
        # supports_combination names its reason.
        return _arch_problem(capability) is None

    @classmethod
    def supports_combination(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla,
                             has_sink, use_sparse, use_mm_prefix, device_capability):
        arch_problem = _arch_problem(device_capability) if device_capability else None
        if arch_problem is not None:
            return arch_problem
        kv_cache_dtype = cls.canonical_kv_cache_dtype(kv_cache_dtype)
        try:
            core.kforge_kv_dtype(kv_cache_dtype)
            vllm_config = get_current_vllm_config()
            cp_problem = _context_parallel_problem(vllm_config.parallel_config)
            if cp_problem is not None:
                return cp_problem
            if vllm_config.model_config is None:
                return None
            heads, rank, rope, topk = _model_dims(vllm_config)
            if head_size != rank + rope:
                raise core.UnsupportedConfig(
                    f"head_size: got {head_size}, the model's kv_lora_rank + "
                    f"qk_rope_head_dim is {rank} + {rope}")
            # The scale is the layer's, known at impl construction; any
            # positive value checks the rest of the shape here.
            core.attention_spec(num_heads=heads, kv_lora_rank=rank, rope_dim=rope, topk=topk,
                                page_size=block_size or PAGE_SIZE, softmax_scale=1.0,
                                cache_dtype=kv_cache_dtype)
        except core.UnsupportedConfig as e:
            return str(e)
        return None


class KforgeSm120TakeOverBackend(KforgeSparseMlaBackend):
    """The backend in vLLM's automatic sm_120 sparse-MLA slot
    (FLASHINFER_MLA_SPARSE_SM120, KFORGE_VLLM_TAKE_OVER=1). It keeps that
    slot's default cache: vLLM's sm_120 backend writes "auto" as fp8_ds_mla
    (656 bytes a token, against 1152 in bf16), so taking the slot over does
    not shrink the cache's token capacity; --kv-cache-dtype bfloat16 still
    asks for bf16."""

    auto_is_fp8: ClassVar[bool] = True


def _arch_problem(capability):
    """kforge's reason it builds no kernel for `capability` (its arch table,
    model/arch.cc, through the package), or None."""
    try:
        kforge_spec.arch_for_capability(capability.major, capability.minor)
    except Exception as e:  # KforgeError: no kforge target runs there
        return f"kforge: {e}"
    return None


def _canonicalize_kv_cache_dtype_with_kforge(original):
    """vLLM's _canonicalize_sparse_mla_kv_cache_dtype, asking a kforge
    backend class its own rule."""
    def canonicalize(attn_backend, kv_cache_dtype):
        if isinstance(attn_backend, type) and issubclass(attn_backend, KforgeSparseMlaBackend):
            return attn_backend.canonical_kv_cache_dtype(kv_cache_dtype)
        return original(attn_backend, kv_cache_dtype)
    canonicalize.kforge_wraps = original
    return canonicalize


def _install_kv_cache_dtype_rule():
    current = mla_attention._canonicalize_sparse_mla_kv_cache_dtype
    if not hasattr(current, "kforge_wraps"):  # once per process
        mla_attention._canonicalize_sparse_mla_kv_cache_dtype = \
            _canonicalize_kv_cache_dtype_with_kforge(current)


_install_kv_cache_dtype_rule()


class KforgeSparseMlaImpl(SparseMLACommonImpl[KforgeSparseMlaMetadata]):
    """kforge's kernel for every query token, behind vLLM's forward_mqa
    (which converts the indexer's top-k positions to cache slots and counts
    the valid ones). The kernels are fetched and loaded here, at model
    construction, from the source kforge is configured with (KFORGE_SERVER
    or KFORGE_BUNDLE), so no decode step and no CUDA-graph capture waits on
    one.

    Context parallelism: under DCP each rank's cache holds its shard of the
    tokens, vLLM's forward_mqa keeps each token's top-k slots on this rank
    (triton_filter_and_convert_dcp_index), and the layer merges the ranks'
    outputs by their lse (natural log, lse_base_on_e), which kforge's kernel
    returns: -inf and a zero output for a token with nothing on this rank,
    the merge's identity. The kernel sees the DCP group's query heads. Under
    PCP alone every rank caches the gathered KV and attends its own query
    tokens: nothing here changes. PCP and DCP together are declined
    (_context_parallel_problem)."""

    supports_dense_mha_prefill = False
    can_return_lse_for_decode = True
    supports_dcp = True
    supports_pcp = True

    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                 kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name,
                 indexer=None, **mla_args):
        if any([alibi_slopes, sliding_window, logits_soft_cap]):
            raise NotImplementedError("kforge's sparse MLA backend does not support "
                                      "alibi_slopes, sliding_window or logits_soft_cap")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError("kforge's sparse MLA backend serves decoder "
                                      f"self-attention only, got {attn_type}")
        topk_indices_buffer = mla_args.pop("topk_indices_buffer", None)
        # An attention sink per head: what vLLM's MLA layer forwards as the
        # impl keyword `sinks` (as its ROCm sparse-MLA impl takes it).
        self.sinks = mla_args.pop("sinks", None)
        if self.sinks is not None and (self.sinks.dtype != torch.float32 or
                                       tuple(self.sinks.shape) != (num_heads,)):
            raise ValueError(f"sinks: expected float32 [{num_heads}] (one per head on this "
                             f"rank), got {self.sinks.dtype} {list(self.sinks.shape)}")
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes,
                         sliding_window, kv_cache_dtype, logits_soft_cap, attn_type,
                         kv_sharing_target_layer_name, indexer=indexer,
                         topk_indices_buffer=topk_indices_buffer, **mla_args)
        if isinstance(self.index_group, HiSparseMLAIndexGroup):
            raise NotImplementedError("kforge's sparse MLA backend does not serve HiSparse "
                                      "(host-offloaded) KV caches")
        if self.topk_indices_buffer is None:
            raise NotImplementedError("kforge's sparse MLA backend needs the indexer's top-k "
                                      "buffer (a DSA model such as DeepSeek-V3.2 or GLM-5)")
        # The query stays bf16: kforge's kernels dequantize the cache only.
        self.supports_quant_query_input = False
        vllm_config = get_current_vllm_config()
        if self.pcp_world_size > 1 and self.dcp_world_size > 1:
            raise NotImplementedError(_context_parallel_problem(vllm_config.parallel_config))
        # Under DCP the layer hands forward_mqa the DCP group's query heads.
        kernel_heads = num_heads * self.dcp_world_size
        if self.dcp_world_size > 1 and self.sinks is not None:
            # Each rank would add the sink to its own partial softmax, and its
            # sinks are its own heads', not the gathered group's.
            raise NotImplementedError("kforge's sparse MLA backend does not serve an attention "
                                      "sink under decode context parallelism")
        # Top-k: the buffer's width, every column of which vLLM's conversion
        # reads and counts (the indexer's index_topk, or more for a model
        # whose buffer holds a kpool tail). The lse only where vLLM merges
        # ranks by it (need_to_return_lse_for_decode: DCP).
        self.core = _core_for(core.attention_spec(
            num_heads=kernel_heads, kv_lora_rank=self.kv_lora_rank,
            rope_dim=self.qk_rope_head_dim, topk=int(self.topk_indices_buffer.shape[-1]),
            page_size=PAGE_SIZE, softmax_scale=self.scale, cache_dtype=kv_cache_dtype,
            return_lse=self.need_to_return_lse_for_decode),
            # The matrix splits the model's heads by this degree: under DCP
            # the kernel's are those of TP / DCP ranks.
            vllm_config.parallel_config.tensor_parallel_size // self.dcp_world_size,
            getattr(vllm_config.model_config, "model", "vllm"),
            core.kforge_kv_dtype(kv_cache_dtype))

    def _forward_mqa_kernel(self, q, kv_cache, topk_indices, valid_counts, *,
                            layer: AttentionLayer, block_size, is_decode):
        # topk_indices: vLLM's slots (block * block_stride_rows + offset, the
        # valid ones first), valid_counts: how many are valid per token.
        if self.need_to_return_lse_for_decode:
            return self.core(q, kv_cache, topk_indices, topk_length=valid_counts,
                             sink=self.sinks, return_lse=True)
        return self.core(q, kv_cache, topk_indices, topk_length=valid_counts,
                         sink=self.sinks), None


# One core per distinct spec in the process: a model's layers share one
# shape, so its kernels are fetched and loaded once, not once per layer.
_cores = {}


def _core_for(spec, tp, model_name, kv_dtype):
    key = spec.SerializeToString(deterministic=True)
    found = _cores.get(key)
    if found is None:
        found = _cores[key] = core.SparseMlaCore(spec)
        count = found.prefetch()
        logger.info("kforge: %d kernel(s) loaded for %d heads, topk %d, kv %s, scale %r; "
                    "prebuild them (kforge prebuild MATRIX --out DIR, or kforge warm) with "
                    "MATRIX = %s", count, spec.num_q_heads, spec.topk, kv_dtype,
                    spec.softmax_scale,
                    json.dumps(core.prebuild_matrix(spec, tp, found.decoder.arch,
                                                    name=str(model_name))))
    return found

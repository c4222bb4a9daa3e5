"""Sparse MLA decode on PyTorch tensors with kernels served by kforge.

    out, lse = kforge.sparse_mla_decode(q, kv_cache, indices, softmax_scale,
                                        return_lse=True)

q [batch, s_q, heads, d_qk] bf16; kv_cache [num_pages, page_block_size, d_qk]
or [num_pages, page_block_size, 1, d_qk] bf16 (any page and row strides, last
dim contiguous); indices [batch, s_q, topk] int32, a slot is page *
page_block_size + offset and -1 means no token; out [batch, s_q, heads, d_v]
bf16 with d_v = kv_lora_rank; lse [batch, s_q, heads] fp32 (natural log).

Optional per call (keyword-only): topk_length, int32 contiguous, either
[batch, s_q] / [batch * s_q] (one per query token) or [batch] (one per
request, for all its s_q tokens): only a token's first topk_length indices
count (the kernel clamps values to 0..topk and never reads the rest); and
sink, fp32 contiguous [heads]: an attention-sink logit per head (natural
log, compared with lse) that joins the softmax denominator and not the
output, out = out_attn / (1 + exp(sink - lse)). The lse returned stays the
attention's own, without the sink.

The kernels come from a source: a server (Client) or a bundle (Bundle), set
with kforge.configure() or the KFORGE_* environment variables (KFORGE_SERVER
or KFORGE_BUNDLE, and a server's TLS and token settings: default_source).
Kernels are loaded and launched through kforge's C ABI (kforge._module:
the C++ module loader, with the CUDA driver it loads at run time) on
torch's current stream; the split-K workspace comes from torch's
caching allocator on that stream, so it is stream-ordered like any tensor.

What is Python's own here: reading torch tensor metadata into the C struct
model/decode_plan.h checks (dtype, device and layout, which that struct
does not carry), and the launch. Every rule about the call (sizes against
the model, strides, alignment, the scale, the variant, grid and split
count, the parameter blocks) is the C++ PlanDecode's, reached through the
C ABI (kforge.plan), once per call signature: kforge.launch keeps its
result and writes each call's pointers into it.

Under torch.compile, SparseMlaDecoder's call is the custom op
kforge::sparse_mla_decode (kforge.torch_op); build the decoder outside the
compiled function (kforge.sparse_mla_decode itself picks a decoder with
Python torch.compile does not trace).
"""

import collections
import logging
import math
import threading
import time

from kforge import _capi, _module
from kforge.bundle import Bundle, first_choice
from kforge.errors import KforgeError
from kforge.launch import PlanCache
from kforge.plan import Device, ManifestRef, Shape, plan_decode, select
from kforge.spec import (arch_for_capability, check_arch_runs, infer_latent_dims, make_spec,
                         sparse_mla_spec)

_log = logging.getLogger("kforge")

# ---------------------------------------------------------------- sources

_default_source = None
_lock = threading.Lock()
_decoders = {}


def configure(address=None, bundle=None, **client_options):
    """Sets the source sparse_mla_decode uses: a server address (extra
    keyword arguments go to Client) or a bundle directory. Returns it."""
    global _default_source
    if (address is None) == (bundle is None):
        raise ValueError("configure: give either address= or bundle=")
    if bundle is not None and client_options:
        raise ValueError(f"configure: {sorted(client_options)} apply to a server, not a bundle")
    if bundle is not None:
        source = Bundle(bundle)
    else:
        from kforge.client import Client
        source = Client(address, **client_options)
    with _lock:
        _default_source = source
    return source


def default_source():
    """The configured source, else the one the environment names: a bundle
    (KFORGE_BUNDLE, signed by KFORGE_TRUST's key when that is set) or a server (KFORGE_SERVER, else 127.0.0.1:50051) with
    KFORGE_TLS_CA, KFORGE_TLS_CERT + KFORGE_TLS_KEY, KFORGE_TOKEN or
    KFORGE_TOKEN_FILE and KFORGE_LOCAL_COPY_DIR. The rule and its errors
    (naming the variable) are the C++ client's (runtime/client_settings.h,
    through the C ABI), as kforge::OpenKernelSourceFromEnvironment uses it."""
    global _default_source
    with _lock:
        if _default_source is not None:
            return _default_source
    settings = _capi.client_settings({}, allow_bundle=True)
    if settings["bundle"]:
        source = Bundle(settings["bundle"], trust=settings["trust"] or None)
    else:
        from kforge.client import Client
        source = Client()  # the same environment, read by the same rule
    with _lock:
        if _default_source is None:
            _default_source = source
        return _default_source


# ------------------------------------------------- tensors -> DecodeArgs

# What the mapping needs of a tensor. device is (type, index); dtype is
# torch's name without "torch."; data_ptr and strides as torch reports them
# (strides in elements).
TensorInfo = collections.namedtuple(
    "TensorInfo", "name shape strides dtype device data_ptr element_size")

# q, kv_cache and indices read as one decode call; strides in elements.
DecodeDims = collections.namedtuple(
    "DecodeDims", "batch s_q heads d_qk topk num_kv_slots page_block_size device "
                  "q_token_stride q_head_stride kv_page_stride kv_row_stride "
                  "indices_token_stride")


def tensor_info(name, t):
    return TensorInfo(name, tuple(t.shape), tuple(t.stride()), str(t.dtype).replace("torch.", ""),
                      (t.device.type, t.device.index), t.data_ptr(), t.element_size())


def _check_dtype(info, dtype):
    if info.dtype != dtype:
        raise TypeError(f"{info.name}: expected dtype {dtype}, got {info.dtype}")


def _check_ndim(info, ndims, layout):
    if len(info.shape) not in ndims:
        raise ValueError(f"{info.name}: expected {layout}, got shape {list(info.shape)}")
    if any(d < 1 for d in info.shape):
        raise ValueError(f"{info.name}: every dim must be >= 1, got shape {list(info.shape)}")


def _check_last_dim(info):
    if info.strides[-1] != 1:
        raise ValueError(f"{info.name}: the last dim must be contiguous (stride 1), got "
                         f"strides {list(info.strides)}")


def _tokens(info, ndim):
    """(tokens shape prefix, token stride) of a tensor whose leading dims
    are [batch, s_q] (ndim dims) or one token dim (ndim - 1 dims): dims 0
    and 1 are read as one token dim t = b * s_q + s."""
    if len(info.shape) == ndim - 1:
        return (info.shape[0], 1), info.strides[0]
    (b, s), (sb, ss) = info.shape[:2], info.strides[:2]
    if s == 1:
        return (b, s), sb
    if b == 1 or sb == s * ss:
        return (b, s), ss
    raise ValueError(f"{info.name}: dims 0 and 1 (batch, s_q) must merge into one token dim "
                     f"(stride(0) == shape[1] * stride(1)); got shape {list(info.shape)} "
                     f"strides {list(info.strides)}")


def _check_device(infos):
    first = infos[0]
    if first.device[0] != "cuda":
        raise ValueError(f"{first.name}: expected a CUDA tensor, got device {first.device[0]}")
    for info in infos[1:]:
        if info.device != first.device:
            raise ValueError(f"{info.name} is on {info.device[0]}:{info.device[1]} but "
                             f"{first.name} on cuda:{first.device[1]}; all must be on one GPU")


def _cache_layout(kv, page_block_size):
    """(page_block_size, row stride, page stride, slots) of a paged cache
    [num_pages, page_block_size, (1,) row] or [num_slots, row] (with
    page_block_size given)."""
    if len(kv.shape) == 2:
        if page_block_size is None:
            raise ValueError(f"{kv.name}: a 2-dim cache [num_slots, d_qk] needs the page size")
        row = kv.strides[0]
        return page_block_size, row, row * page_block_size, kv.shape[0]
    return kv.shape[1], kv.strides[1], kv.strides[0], kv.shape[0] * kv.shape[1]


def _check_cache(kv, d_qk, kv_row_bytes):
    """A cache's dtype, dims and row width: bf16 rows of d_qk, or uint8
    records of kv_row_bytes (a quantised format's)."""
    if kv_row_bytes is not None:
        _check_dtype(kv, "uint8")
    elif kv.dtype == "uint8":
        raise TypeError(f"{kv.name}: a uint8 (quantised record) cache needs a decoder built "
                        "for its format (SparseMlaDecoder(..., kv_dtype='fp8_ds_mla'), or "
                        "'fp8_ds_mla_v4', 'mxfp8_ds_mla_v41', 'nvfp4_ds_mla', or a spec with "
                        "that kv_cache_dtype)")
    else:
        _check_dtype(kv, "bfloat16")
    _check_ndim(kv, (2, 3, 4), "[num_pages, page_block_size, d_qk] or "
                               "[num_pages, page_block_size, 1, d_qk]")
    if len(kv.shape) == 4 and kv.shape[2] != 1:
        raise ValueError(f"{kv.name}: a 4-dim cache is [num_pages, page_block_size, 1, d_qk] "
                         f"(one latent KV head), got shape {list(kv.shape)}")
    if kv_row_bytes is not None:
        if kv.shape[-1] != kv_row_bytes:
            raise ValueError(f"{kv.name}: records of {kv.shape[-1]} bytes, the spec's "
                             f"record is {kv_row_bytes}")
    elif kv.shape[-1] != d_qk:
        raise ValueError(f"{kv.name}: rows of {kv.shape[-1]} values, q has d_qk {d_qk}")
    _check_last_dim(kv)


def check_decode_inputs(q, kv, indices, page_block_size=None, kv_row_bytes=None):
    """DecodeDims of (q, kv_cache, indices) given as TensorInfo. q is
    [batch, s_q, heads, d_qk] (or [tokens, heads, d_qk]); kv_cache
    [num_pages, page_block_size, d_qk], [num_pages, page_block_size, 1,
    d_qk], or [num_slots, d_qk] with `page_block_size` given; indices
    [batch, s_q, topk] (or [tokens, topk]). A quantised cache (fp8_ds_mla
    and the other record formats) is uint8 with kv_row_bytes (KvLayoutOf:
    656 for fp8_ds_mla) in place of d_qk, and its strides count bytes. TypeError for a dtype, ValueError naming the tensor for a
    layout this mapping cannot express; everything else is PlanDecode's to
    judge."""
    _check_dtype(q, "bfloat16")
    _check_dtype(indices, "int32")
    _check_device([q, kv, indices])
    _check_ndim(q, (3, 4), "[batch, s_q, heads, d_qk]")
    _check_ndim(indices, (len(q.shape) - 1,), "[batch, s_q, topk]")
    (batch, s_q), q_token = _tokens(q, 4)
    heads, d_qk = q.shape[-2:]
    _check_cache(kv, d_qk, kv_row_bytes)
    idx_stride = _check_indices(indices, q, batch, s_q)
    _check_last_dim(q)
    pbs, row, page, slots = _cache_layout(kv, page_block_size)
    return DecodeDims(batch=batch, s_q=s_q, heads=heads, d_qk=d_qk, topk=indices.shape[-1],
                      num_kv_slots=slots, page_block_size=pbs, device=q.device,
                      q_token_stride=q_token, q_head_stride=q.strides[-2],
                      kv_page_stride=page, kv_row_stride=row, indices_token_stride=idx_stride)


def _check_indices(indices, q, batch, s_q):
    """The token stride of an int32 index tensor [batch, s_q, n] (or
    [tokens, n]) of q's tokens."""
    idx_tokens, idx_stride = _tokens(indices, 3)
    if idx_tokens != (batch, s_q):
        raise ValueError(f"{indices.name}: shape {list(indices.shape)} does not start with "
                         f"{q.name}'s [batch, s_q] = {[batch, s_q]}")
    _check_last_dim(indices)
    return idx_stride


def check_extra_inputs(q, extra_kv, extra_indices, dims, kv_row_bytes=None):
    """The extra cache's DecodeArgs fields (a dict, pointers but
    extra_topk_length included) for TensorInfos extra_kv (a paged cache as
    check_decode_inputs takes kv, of the decoder's extra format:
    kv_row_bytes for a quantised one) and extra_indices ([batch, s_q,
    extra_topk] int32, slots of the extra cache) beside q's `dims`."""
    _check_dtype(extra_indices, "int32")
    _check_device([q, extra_kv, extra_indices])
    _check_ndim(extra_indices, (len(q.shape) - 1,), "[batch, s_q, extra_topk]")
    _check_cache(extra_kv, dims.d_qk, kv_row_bytes)
    stride = _check_indices(extra_indices, q, dims.batch, dims.s_q)
    pbs, row, page, slots = _cache_layout(extra_kv, None)
    return dict(extra_kv=extra_kv.data_ptr, extra_indices=extra_indices.data_ptr,
                extra_topk=extra_indices.shape[-1], extra_page_block_size=pbs,
                extra_num_kv_slots=slots, extra_kv_page_stride=page, extra_kv_row_stride=row,
                extra_indices_stride=stride)


def _device_name(device):
    return device[0] if device[1] is None else f"{device[0]}:{device[1]}"


def _check_same_device(info, dims):
    if info.device != dims.device:
        raise ValueError(f"{info.name} is on {_device_name(info.device)}, the inputs on "
                         f"cuda:{dims.device[1]}")


def check_out(out, dims):
    """(token stride, head stride) of a caller's out buffer [batch, s_q,
    heads, d_v] (or [tokens, heads, d_v]) bf16 for the inputs `dims`."""
    _check_dtype(out, "bfloat16")
    _check_ndim(out, (3, 4), "[batch, s_q, heads, d_v]")
    tokens, token_stride = _tokens(out, 4)
    if tokens != (dims.batch, dims.s_q) or out.shape[-2] != dims.heads:
        raise ValueError(f"{out.name}: expected shape {[dims.batch, dims.s_q, dims.heads, 'd_v']}"
                         f", got {list(out.shape)}")
    _check_same_device(out, dims)
    _check_last_dim(out)
    return token_stride, out.strides[-2]


def check_lse(lse, dims):
    """lse [batch, s_q, heads] (or [tokens, heads]) fp32, contiguous (the
    kernels write it with no strides)."""
    _check_dtype(lse, "float32")
    tokens = dims.batch * dims.s_q
    contiguous = lse.strides[-1] == 1 and (len(lse.shape) < 2 or lse.strides[-2] == dims.heads or
                                          tokens == 1)
    if math.prod(lse.shape) != tokens * dims.heads or lse.shape[-1] != dims.heads or \
            not contiguous:
        raise ValueError(f"{lse.name}: expected a contiguous [batch, s_q, heads] = "
                         f"{[dims.batch, dims.s_q, dims.heads]} tensor, got shape "
                         f"{list(lse.shape)} strides {list(lse.strides)}")
    _check_same_device(lse, dims)


def _is_contiguous(info):
    """Row-major contiguous as torch has it (a dim of size 1 may have any
    stride)."""
    step = 1
    for n, stride in zip(reversed(info.shape), reversed(info.strides)):
        if n != 1 and stride != step:
            return False
        step *= n
    return True


def check_topk_length(info, dims):
    """topk_length_tokens (DecodeArgs: query tokens per entry) of a
    topk_length tensor, int32 contiguous: [batch, s_q] or [batch * s_q]
    (one length per query token: 1) or [batch] (one per request: s_q; with
    s_q 1 the two coincide, and it is 1). Its values are the kernel's to
    clamp (0..topk)."""
    _check_dtype(info, "int32")
    shape = list(info.shape)
    batch, s_q = dims.batch, dims.s_q
    if shape in ([batch, s_q], [batch * s_q]):
        tokens = 1
    elif shape == [batch]:
        tokens = s_q
    else:
        raise ValueError(f"{info.name}: expected shape [batch, s_q] = {[batch, s_q]}, "
                         f"[batch * s_q] = {[batch * s_q]} (one length per query token) or "
                         f"[batch] = {[batch]} (one per request), got {shape}")
    if not _is_contiguous(info):
        raise ValueError(f"{info.name}: must be contiguous, got shape {shape} strides "
                         f"{list(info.strides)}")
    _check_same_device(info, dims)
    return tokens


def check_sink(info, dims):
    """sink [heads] fp32, contiguous: one attention-sink logit per head."""
    _check_dtype(info, "float32")
    if list(info.shape) != [dims.heads] or not _is_contiguous(info):
        raise ValueError(f"{info.name}: expected a contiguous [num_q_heads] = {[dims.heads]} "
                         f"tensor, got shape {list(info.shape)} strides {list(info.strides)}")
    _check_same_device(info, dims)


def make_decode_args(q, kv, indices, dims, out, out_strides, lse_ptr, softmax_scale,
                     kv_dtype=1, topk_length_ptr=0, sink_ptr=0, topk_length_tokens=0):
    """The C struct PlanDecode checks (model/decode_plan.h DecodeArgs) for
    TensorInfos q, kv, indices, out with `dims` and `out_strides` read from
    them, and lse, topk_length and sink addresses (0 = absent);
    topk_length_tokens as check_topk_length gives it."""
    return _capi.DecodeArgs(
        q=q.data_ptr, kv=kv.data_ptr, indices=indices.data_ptr, out=out.data_ptr, lse=lse_ptr,
        topk_length=topk_length_ptr, sink=sink_ptr, topk_length_tokens=topk_length_tokens,
        batch=dims.batch, s_q=dims.s_q, num_q_heads=dims.heads, d_qk=dims.d_qk,
        d_v=out.shape[-1], topk=dims.topk, page_block_size=dims.page_block_size,
        kv_dtype=kv_dtype, num_kv_slots=dims.num_kv_slots,
        q_token_stride=dims.q_token_stride, q_head_stride=dims.q_head_stride,
        kv_page_stride=dims.kv_page_stride, kv_row_stride=dims.kv_row_stride,
        indices_stride=dims.indices_token_stride, out_token_stride=out_strides[0],
        out_head_stride=out_strides[1], softmax_scale=float(softmax_scale))


def spec_for_inputs(dims, softmax_scale, return_lse, d_v=None, kv_lora_rank=None,
                    rope_dim=None):
    """The AttentionSpec that (q, kv_cache, indices) call for."""
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"softmax_scale: got {softmax_scale}, expected finite and > 0")
    rank, rope = infer_latent_dims(dims.d_qk, d_v, kv_lora_rank=kv_lora_rank,
                                   rope_dim=rope_dim)
    return make_spec(num_q_heads=dims.heads, kv_lora_rank=rank, rope_dim=rope, topk=dims.topk,
                     s_q=dims.s_q, page_block_size=dims.page_block_size,
                     softmax_scale=scale, return_lse=bool(return_lse))


# ---------------------------------------------------------------- CUDA


def _torch():
    try:
        import torch
    except ImportError as e:
        raise KforgeError(f"kforge.sparse_mla_decode needs PyTorch ({e})") from e
    return torch


class LoadedKernel:
    """One artifact's two entry points, loaded for one device, launching
    the plans PlanDecode makes."""

    def __init__(self, artifact, device_index, capability):
        check_arch_runs(artifact.arch, capability)
        self.artifact = artifact  # a first answer (partial) is planned as itself
        name = artifact.module_name
        # Loaded, resolved and launched by the one module loader
        # (kforge._module: the C++ KernelModule through the C ABI, every
        # family's).
        module = self._module = _module.KernelModule(artifact, _module.SPARSE_MLA_PARAMS,
                                                     device_index)
        small = artifact.small_batch  # entries "" when the module has none
        # (entry, dynamic smem to opt into) of the main kernels the
        # artifact names.
        mains = [(artifact.main_entry, artifact.launch.dynamic_smem_bytes)] + [
            (entry, small.launch.dynamic_smem_bytes)
            for entry in (small.entry, small.cluster_entry) if entry] + [
            (entry, artifact.launch.dynamic_smem_bytes)
            for entry in (artifact.cluster.entry, artifact.cluster.wide_entry) if entry]
        for entry, nbytes in mains:
            module.set_max_dynamic_smem(entry, nbytes)
        # Clusters past the portable 8 CTAs (the small-batch cluster entry's
        # and the throughput tiling's wide one, sizes compiled in) launch
        # only once the kernel opts in; a device that refuses either runs
        # none of them (max_active_clusters 0 below).
        wide = artifact.cluster
        # (entry, grid x, grid y, block threads, dynamic smem) of one cluster.
        clustered = [(entry, groups, splits, threads, nbytes)
                     for entry, groups, splits, threads, nbytes in (
                         (small.cluster_entry, small.tiling.num_head_groups,
                          small.cluster_splits, small.launch.block_threads,
                          small.launch.dynamic_smem_bytes),
                         (wide.wide_entry, artifact.tiling.num_head_groups, wide.wide_splits,
                          artifact.launch.block_threads, artifact.launch.dynamic_smem_bytes))
                     if entry]
        cluster_ok = bool(clustered) and all(
            module.allow_non_portable_cluster(entry) for entry, *_ in clustered)
        # (index, block bytes) of the combine and of the main kernels by
        # entry name (the throughput one and its cluster entry, the
        # small-batch path's entry and cluster entry, where the module has
        # them): a plan launches the one its main_entry names.
        self.combine = module.entry(artifact.combine_entry)
        self._mains = {entry: module.entry(entry) for entry, _ in mains}
        # Loaded into the current context (the caller made the device
        # current) now rather than at a first launch, which may come inside
        # a CUDA graph capture.
        module.load_into_current_context()
        self.name = name
        # How many of those entries' clusters this GPU runs at once, the
        # fewer of the two (0: none, no such entry, or the driver would not
        # say): the selector's Device.max_active_clusters. Asked in the
        # current context: the caller made the device current.
        self.max_active_clusters = 0
        if cluster_ok:
            self.max_active_clusters = min(module.max_active_clusters(*c) for c in clustered)

    def run(self, sel, stream):
        """Enqueues a Selection made by plan_decode on `stream` (a
        cudaStream_t as an int): the main kernel, then the combine."""
        p = sel.plan
        launch = self._module.launch
        index, _ = self._main_for(p.main_entry)
        launch(index, p.main_params, len(p.main_params), p.grid_x, p.grid_y, p.grid_z,
               p.block_threads, p.dynamic_smem_bytes, stream, p.programmatic)
        if p.needs_combine:
            launch(self.combine[0], p.combine_params, len(p.combine_params), p.combine_grid_x,
                   p.combine_grid_y, 1, p.combine_block_threads, 0, stream, p.programmatic)

    def launch(self, plan, stream):
        """Enqueues a kforge.launch.BoundPlan whose blocks hold the call's
        pointers (the caller holds plan.lock) on `stream` (an int); the
        blocks are copied before this returns."""
        launch = self._module.launch
        main, combine = plan.main, plan.combine
        gx, gy, gz, block, _, _, smem = plan.launch
        launch(self._main_for(plan.entry)[0], main.pointer, main.size, gx, gy, gz, block, smem,
               stream, plan.programmatic)
        if combine is not None:
            gx, gy, gz, block, _, _, smem = plan.combine_launch
            launch(self.combine[0], combine.pointer, combine.size, gx, gy, gz, block, smem,
                   stream, plan.programmatic)

    def _main_for(self, entry):
        """(index, block bytes) of the main kernel named `entry` (a
        LaunchPlan's main_entry)."""
        found = self._mains.get(entry)
        if found is None:
            raise KforgeError(f"{self.name} has no main kernel named {entry!r}; "
                              "the plan asked for it")
        return found


def kv_row_bytes_for(spec, extra=False):
    """The uint8 record size of a quantised spec's cache (KvLayoutOf: 656
    for fp8_ds_mla, 584 / 528 / 352 for fp8_ds_mla_v4 / mxfp8_ds_mla_v41 /
    nvfp4_ds_mla), None for a bf16 cache; with extra, of its extra cache
    (ExtraKvLayoutOf)."""
    row_bytes, element_bytes = _capi.kv_layout(spec.SerializeToString(deterministic=True),
                                               extra=extra)
    return row_bytes if element_bytes == 1 else None


def cuda_device(torch, device):
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device}")
    return device if device.index is not None else torch.device(
        "cuda", torch.cuda.current_device())


def decode_args(q, kv, indices, dims, out, lse, softmax_scale, kv_dtype, kv_name="kv_cache",
                *, topk_length=None, sink=None, extra=None, extra_kv_dtype=0,
                extra_row_bytes=None):
    """The C DecodeArgs for these tensors (checked by check_decode_inputs
    into `dims`); out, lse, topk_length and sink (each of the last three
    may be None) are checked against dims here, and so is `extra`: None, or
    (extra_kv_cache, extra_indices, extra_topk_length or None) for a
    decoder built with an extra cache of extra_kv_dtype (extra_row_bytes
    for a quantised one). Every rule about them beyond tensor metadata is
    PlanDecode's, in C++."""
    out_info = tensor_info("out", out)
    out_strides = check_out(out_info, dims)
    lse_ptr = topk_length_ptr = sink_ptr = topk_length_tokens = 0
    if lse is not None:
        check_lse(tensor_info("lse", lse), dims)
        lse_ptr = lse.data_ptr()
    if topk_length is not None:
        topk_length_tokens = check_topk_length(tensor_info("topk_length", topk_length), dims)
        topk_length_ptr = topk_length.data_ptr()
    if sink is not None:
        check_sink(tensor_info("sink", sink), dims)
        sink_ptr = sink.data_ptr()
    extra_fields = {}
    if extra is not None:
        x_kv, x_indices, x_length = extra
        extra_fields = check_extra_inputs(tensor_info("q", q),
                                          tensor_info("extra_kv_cache", x_kv),
                                          tensor_info("extra_indices", x_indices), dims,
                                          extra_row_bytes)
        extra_fields["extra_kv_dtype"] = extra_kv_dtype
        if x_length is not None:
            tokens = check_topk_length(tensor_info("extra_topk_length", x_length), dims)
            # One topk_length_tokens serves both lists (DecodeArgs).
            if topk_length_tokens and tokens != topk_length_tokens:
                raise ValueError("extra_topk_length: one length per request and topk_length one "
                                 "per query token (or the other way round); give both per "
                                 "token or both per request")
            topk_length_tokens = tokens
            extra_fields["extra_topk_length"] = x_length.data_ptr()
    args = make_decode_args(tensor_info("q", q), tensor_info(kv_name, kv),
                            tensor_info("indices", indices), dims, out_info, out_strides,
                            lse_ptr, softmax_scale, kv_dtype, topk_length_ptr, sink_ptr,
                            topk_length_tokens)
    for name, value in extra_fields.items():
        setattr(args, name, value)
    return args


def extra_kv_row_bytes_for(spec):
    """kv_row_bytes_for of a spec's extra cache (spec.extra_kv), None for a
    bf16 one or a spec without one."""
    return kv_row_bytes_for(spec, extra=True) if spec.HasField("extra_kv") else None


def call_args(q, kv_cache, indices, out, lse, softmax_scale, kv_dtype, kv_row_bytes,
              device_index, *, topk_length=None, sink=None, extra=None, extra_kv_dtype=0,
              extra_row_bytes=None):
    """DecodeArgs of a decoder's call (its PlanCache's make_args, run once
    per call signature): the tensor mapping's checks here, the rest
    PlanDecode's. kv_row_bytes as kv_row_bytes_for gives it; device_index
    the decoder's GPU; topk_length, sink and extra optional (None; extra
    as decode_args takes it)."""
    dims = check_decode_inputs(tensor_info("q", q), tensor_info("kv_cache", kv_cache),
                               tensor_info("indices", indices), kv_row_bytes=kv_row_bytes)
    if dims.device != ("cuda", device_index):
        raise ValueError(f"q is on {dims.device[0]}:{dims.device[1]}, this decoder on "
                         f"cuda:{device_index}")
    return decode_args(q, kv_cache, indices, dims, out, lse, softmax_scale, kv_dtype,
                       topk_length=topk_length, sink=sink, extra=extra,
                       extra_kv_dtype=extra_kv_dtype, extra_row_bytes=extra_row_bytes)


# A decoder holding a first answer asks for the whole module this long
# after loading it, then twice as long after each ask that still finds a
# first answer (a server compiling the rest takes a few seconds), up to
# REFRESH_MAX_WAIT.
REFRESH_FIRST_WAIT = 1.0
REFRESH_MAX_WAIT = 60.0


class SparseMlaDecoder:
    """Sparse MLA decode for one model (preset + tp, or spec) on one GPU.

    Fetches the manifest once; loads each variant's kernel the first time a
    call needs it. A call is checked by PlanDecode the first time its
    signature (shapes, strides, dtypes, devices, pointer alignment, scale)
    is seen; later calls with that signature reuse the plan
    (kforge.launch.PlanCache) and cost a few tensor reads and the launch.
    Inside torch.compile a call becomes the custom op
    kforge::sparse_mla_decode (kforge.torch_op)."""

    def __init__(self, source=None, preset=None, tp=None, spec=None, device=None, arch=None,
                 kv_dtype=None):
        torch = self._torch = _torch()
        self.source = source if source is not None else default_source()
        self.device = cuda_device(torch, device)
        self.capability = torch.cuda.get_device_capability(self.device)
        self.arch = arch or arch_for_capability(*self.capability)
        check_arch_runs(self.arch, self.capability)
        self.sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.manifest = self.source.get_manifest(preset=preset, tp=tp, spec=spec, arch=self.arch,
                                                 kv_dtype=kv_dtype)
        self._manifest = ManifestRef(self.manifest)
        self._device = Device(self.arch, self.sm_count).c_struct()
        first = first_choice(self.manifest)
        self.spec = sparse_mla_spec(first.spec, first.module_name)
        self._kv_row_bytes = kv_row_bytes_for(self.spec)
        self._extra_row_bytes = extra_kv_row_bytes_for(self.spec)
        self._extra_kv_dtype = (int(self.spec.extra_kv.kv_cache_dtype)
                                if self.spec.HasField("extra_kv") else 0)
        self._kernels = {}
        self._retired = []  # first answers refresh() replaced: graphs may still launch them
        # While a first answer is loaded: when run() next calls refresh()
        # (time.monotonic()), and the wait after that one.
        self._refresh_at = None
        self._refresh_wait = REFRESH_FIRST_WAIT
        self._refresh_lock = threading.Lock()
        self._lock = threading.Lock()
        # Plain values for the per-call path (and for torch.compile to read).
        self._d_v = (int(self.spec.kv_lora_rank),)
        self._scale = float(self.spec.softmax_scale)
        self._index = self.device.index
        self._plans = PlanCache(self._manifest, self._device, self._decode_args, self._kernel)
        self._bf16, self._fp32, self._u8 = torch.bfloat16, torch.float32, torch.uint8
        self._current_device = torch._C._cuda_getDevice
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_stream = raw if raw is not None else (
            lambda index: torch.cuda.current_stream(index).cuda_stream)
        from kforge import torch_op
        self._op_id = torch_op.register(torch, self)
        self._compiling = torch_op.is_compiling(torch)

    def selection(self, batch, s_q):
        """The variant and launch configuration for batch x s_q tokens."""
        shape = Shape(batch=batch, s_q=s_q, num_q_heads=self.spec.num_q_heads,
                      topk=self.spec.topk, page_block_size=self.spec.page_block_size,
                      kv_dtype=self.spec.kv_cache_dtype)
        return select(self._plans.manifest, self._device, shape)

    def prefetch(self):
        """Fetches and loads every variant's kernel (engine start), so that no
        decode step waits on the network or a compile. Returns the number of
        kernels loaded."""
        for variant in self.manifest.variants:
            self._plans.note_kernel(self._kernel(variant))
        return len(self.manifest.variants)

    def holds_first_answer(self):
        """Whether a kernel this decoder loaded is a first answer (the
        module's main and combine entries only, KernelArtifact.partial: a
        source asked with first_answer, on a server's miss). It is planned
        as the module it is, correct for every shape but without the
        small-batch and cluster entries, until refresh() replaces it."""
        with self._lock:
            return any(k.artifact.partial for k in self._kernels.values())

    def refresh(self):
        """Asks the source again for each kernel this decoder loaded as a
        first answer; where it now has the whole module, loads it in the
        first answer's place and plans later calls with it. run() calls it
        by itself (REFRESH_FIRST_WAIT after the load, then less and less
        often, never inside CUDA-graph capture, where a module load breaks
        the capture); an engine may call it at a moment of its choosing.
        Kernels replaced stay loaded, so graphs captured with them still
        replay. Returns the number replaced."""
        with self._lock:
            held = [k for k in self._kernels.values() if k.artifact.partial]
        replaced = 0
        for old in held:
            variant = next(v for v in self.manifest.variants if v.key == old.artifact.key)
            artifact = self.source.get_kernel(variant, self.arch)
            if artifact.partial:
                continue  # the server is still compiling the rest
            kernel = self._load(artifact)
            with self._lock:
                self._retired.append(old)
                self._kernels[variant.key] = kernel
            self._plans.note_kernel(kernel)
            _log.info("kforge: %s: the whole module (%d entries) replaced its first answer (%d)",
                      artifact.module_name, len(artifact.entries), len(old.artifact.entries))
            replaced += 1
        return replaced

    def _load(self, artifact):
        with self._torch.cuda.device(self.device):
            self._torch.zeros(1, device=self.device)  # torch's context is current
            kernel = LoadedKernel(artifact, self.device.index, self.capability)
        if artifact.partial and self._refresh_at is None:
            self._refresh_at = time.monotonic() + self._refresh_wait
        return kernel

    def _refresh_due(self):
        """run()'s refresh of a first answer, when due: never inside CUDA-graph
        capture (tried again at the next call), and a source that fails is
        tried again later, with a warning, while the first answer runs."""
        if self._torch.cuda.is_current_stream_capturing():
            return
        if not self._refresh_lock.acquire(blocking=False):
            return  # another thread's call is at it
        try:
            next_wait = min(2 * self._refresh_wait, REFRESH_MAX_WAIT)
            try:
                self.refresh()
            except KforgeError as e:
                _log.warning("kforge: the whole module could not be fetched yet (asking again "
                             "in %.0f s; the first answer runs meanwhile): %s", next_wait, e)
            if self.holds_first_answer():
                self._refresh_wait = next_wait
                self._refresh_at = time.monotonic() + next_wait
            else:
                self._refresh_at = None
        finally:
            self._refresh_lock.release()

    def _kernel(self, variant):
        with self._lock:
            kernel = self._kernels.get(variant.key)
        if kernel is None:
            kernel = self._load(self.source.get_kernel(variant, self.arch))
            with self._lock:
                kernel = self._kernels.setdefault(variant.key, kernel)
        return kernel

    def _decode_args(self, q, kv_cache, indices, out, lse, topk_length, sink, scale,
                     extra=None):
        return call_args(q, kv_cache, indices, out, lse, scale, self.spec.kv_cache_dtype,
                         self._kv_row_bytes, self._index, topk_length=topk_length, sink=sink,
                         extra=extra, extra_kv_dtype=self._extra_kv_dtype,
                         extra_row_bytes=self._extra_row_bytes)

    def __call__(self, q, kv_cache, indices, softmax_scale=None, *, return_lse=False, out=None,
                 topk_length=None, sink=None, extra_kv_cache=None, extra_indices=None,
                 extra_topk_length=None):
        """out [batch, s_q, heads, d_v] bf16, or (out, lse [batch, s_q,
        heads] fp32) with return_lse. softmax_scale, when given, must be the
        kernel's (1e-6 relative, as PlanDecode checks). topk_length (int32
        [batch, s_q], [batch * s_q] or [batch]) and sink (fp32 [heads]):
        see the module docstring. A decoder whose spec has an extra cache
        (extra_kv) takes extra_kv_cache (paged like kv_cache, in the extra
        format) and extra_indices ([batch, s_q, extra_topk] int32, its
        slots), and optionally extra_topk_length (as topk_length); they
        join the top-k tokens in one softmax."""
        if self._compiling():
            return self._traced_call(q, kv_cache, indices, softmax_scale, return_lse, out,
                                     topk_length, sink, extra_kv_cache, extra_indices,
                                     extra_topk_length)
        if out is None:
            out = self._torch.empty(q.shape[:-1] + self._d_v, dtype=self._bf16,
                                    device=self.device)
        lse = (self._torch.empty(q.shape[:-1], dtype=self._fp32, device=self.device)
               if return_lse else None)
        self.run(q, kv_cache, indices, out, lse,
                 self._scale if softmax_scale is None else float(softmax_scale),
                 topk_length=topk_length, sink=sink, extra_kv_cache=extra_kv_cache,
                 extra_indices=extra_indices, extra_topk_length=extra_topk_length)
        return (out, lse) if return_lse else out

    def run(self, q, kv_cache, indices, out, lse, softmax_scale, *, topk_length=None,
            sink=None, extra_kv_cache=None, extra_indices=None, extra_topk_length=None):
        """Launches one call into out (and lse, or None) on torch's current
        stream; softmax_scale a float; topk_length, sink and the extra
        cache's tensors optional inputs (None: absent). The split-K
        workspace comes from torch's caching allocator on that stream.
        Returns the BoundPlan."""
        if self._refresh_at is not None and time.monotonic() >= self._refresh_at:
            self._refresh_due()
        extra = None
        if extra_kv_cache is not None or extra_indices is not None or \
                extra_topk_length is not None:
            if extra_kv_cache is None or extra_indices is None:
                raise ValueError("an extra KV cache needs both extra_kv_cache and "
                                 "extra_indices")
            extra = (extra_kv_cache, extra_indices, extra_topk_length)
        plan, pointers = self._plans.lookup(q, kv_cache, indices, out, lse, topk_length, sink,
                                            softmax_scale, extra)
        workspace = 0
        if plan.workspace_bytes:
            ws = self._torch.empty(plan.workspace_bytes, dtype=self._u8, device=self.device)
            workspace = ws.data_ptr()
        index = self._index
        if self._current_device() == index:
            stream = self._raw_stream(index)
            with plan.lock:
                plan.bind(pointers, workspace)
                plan.kernel.launch(plan, stream)
        else:
            with self._torch.cuda.device(self.device):
                stream = self._raw_stream(index)
                with plan.lock:
                    plan.bind(pointers, workspace)
                    plan.kernel.launch(plan, stream)
        return plan

    def _traced_call(self, q, kv_cache, indices, softmax_scale, return_lse, out, topk_length,
                     sink, extra_kv_cache, extra_indices, extra_topk_length):
        """The call as torch.compile traces it: allocations and the custom
        op, which runs self.run."""
        torch = self._torch
        if out is None:
            out = torch.empty(q.shape[:-1] + self._d_v, dtype=self._bf16, device=self.device)
        lse = (torch.empty(q.shape[:-1], dtype=self._fp32, device=self.device)
               if return_lse else None)
        scale = self._scale if softmax_scale is None else float(softmax_scale)
        torch.ops.kforge.sparse_mla_decode(q, kv_cache, indices, out, lse, topk_length, sink,
                                           extra_kv_cache, extra_indices, extra_topk_length,
                                           scale, self._op_id)
        return (out, lse) if return_lse else out


def decoder_for(q, kv_cache, indices, softmax_scale, *, source=None, return_lse=False,
                out=None, kv_lora_rank=None, rope_dim=None):
    """The cached SparseMlaDecoder sparse_mla_decode uses for these inputs."""
    dims = check_decode_inputs(tensor_info("q", q), tensor_info("kv_cache", kv_cache),
                               tensor_info("indices", indices))
    d_v = out.shape[-1] if out is not None else None
    source = source if source is not None else default_source()
    # Everything the spec is built from, so a hit builds no protobuf.
    key = (source, dims.device, dims.heads, dims.d_qk, dims.topk, dims.s_q,
           dims.page_block_size, float(softmax_scale), bool(return_lse), d_v, kv_lora_rank,
           rope_dim)
    with _lock:
        decoder = _decoders.get(key)
    if decoder is None:
        spec = spec_for_inputs(dims, softmax_scale, return_lse, d_v, kv_lora_rank=kv_lora_rank,
                               rope_dim=rope_dim)
        decoder = SparseMlaDecoder(source, spec=spec, device=dims.device[1])
        with _lock:
            decoder = _decoders.setdefault(key, decoder)
    return decoder


# (source, shapes of q, kv_cache and indices, device, scale, return_lse, out's
# last dim, kv_lora_rank, rope_dim) -> decoder: everything decoder_for reads,
# so that a call of a known shape skips its mapping.
_decoders_by_shape = {}


def sparse_mla_decode(q, kv_cache, indices, softmax_scale, *, source=None, return_lse=False,
                      out=None, kv_lora_rank=None, rope_dim=None, topk_length=None, sink=None):
    """Sparse MLA decode with the kernel for exactly these shapes (see the
    module docstring, also for the optional topk_length and sink). Returns
    out, or (out, lse) with return_lse.

    d_qk = kv_lora_rank + rope_dim; where d_qk has two such splits kforge
    builds (512 = 448 + 64 or 512 + 0, 320 = 256 + 64 or 320 + 0), say
    which with kv_lora_rank= or rope_dim= (or out=, whose last dim is
    kv_lora_rank)."""
    source = source if source is not None else default_source()
    scale = float(softmax_scale)
    key = (source, q.shape, kv_cache.shape, indices.shape, q.device, scale, bool(return_lse),
           None if out is None else out.shape[-1], kv_lora_rank, rope_dim)
    decoder = _decoders_by_shape.get(key)
    if decoder is None:
        decoder = decoder_for(q, kv_cache, indices, scale, source=source,
                              return_lse=return_lse, out=out, kv_lora_rank=kv_lora_rank,
                              rope_dim=rope_dim)
        with _lock:
            if len(_decoders_by_shape) > 4096:
                _decoders_by_shape.clear()
            _decoders_by_shape[key] = decoder
    return decoder(q, kv_cache, indices, scale, return_lse=return_lse, out=out,
                   topk_length=topk_length, sink=sink)

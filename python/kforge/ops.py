"""Sparse MLA decode on PyTorch tensors with kernels served by kforge.

    out, lse = kforge.sparse_mla_decode(q, kv_cache, indices, softmax_scale,
                                        return_lse=True)

q [batch, s_q, heads, d_qk] bf16; kv_cache [num_pages, page_block_size, d_qk]
or [num_pages, page_block_size, 1, d_qk] bf16 (any page and row strides, last
dim contiguous); indices [batch, s_q, topk] int32, a slot is page *
page_block_size + offset and -1 means no token; out [batch, s_q, heads, d_v]
bf16 with d_v = kv_lora_rank; lse [batch, s_q, heads] fp32 (natural log).

The kernels come from a source: a server (Client) or a bundle (Bundle), set
with kforge.configure() or the KFORGE_SERVER / KFORGE_BUNDLE environment
variables. Kernels are loaded with cuda-python (cuda.bindings.driver) and
launched on torch's current stream; the split-K workspace comes from torch's
caching allocator on that stream, so it is stream-ordered like any tensor.

torch and cuda.bindings are imported only when a kernel is used: the input
checks and launch planning below are plain functions of shapes and strides
(tests/python_client_test.py runs them with no GPU).
"""

import collections
import ctypes
import math
import os
import threading

from kforge.bundle import Bundle, first_choice
from kforge.driver import CombineParams, DecodeParams
from kforge.errors import KforgeError
from kforge.select import Device, Shape, select
from kforge.spec import (arch_for_capability, check_arch_runs, float32, infer_latent_dims,
                         make_spec)

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
    """The configured source, else one from KFORGE_BUNDLE or KFORGE_SERVER,
    else a server at the default address (127.0.0.1:50051)."""
    global _default_source
    with _lock:
        if _default_source is not None:
            return _default_source
    bundle, server = os.environ.get("KFORGE_BUNDLE"), os.environ.get("KFORGE_SERVER")
    if bundle and server:
        raise KforgeError(f"both KFORGE_BUNDLE ({bundle}) and KFORGE_SERVER ({server}) are "
                          "set; set one, or call kforge.configure()")
    if bundle:
        source = Bundle(bundle)
    else:
        from kforge.client import Client
        source = Client(server) if server else Client()
    with _lock:
        if _default_source is None:
            _default_source = source
        return _default_source


# ---------------------------------------------------------------- checks

# What the checks need of a tensor. device is (type, index); dtype is torch's
# name without "torch."; data_ptr and strides as torch reports them (strides
# in elements).
TensorInfo = collections.namedtuple(
    "TensorInfo", "name shape strides dtype device data_ptr element_size")

DecodeDims = collections.namedtuple(
    "DecodeDims", "batch s_q heads d_qk topk num_pages page_block_size device "
                  "q_token_stride q_head_stride kv_page_stride kv_row_stride "
                  "indices_token_stride")

# cp.async moves 16-byte chunks of q and KV rows; the epilogue stores out in
# 16-byte vectors.
_ALIGN = 16


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


def _check_aligned(info, strides):
    if info.data_ptr % _ALIGN:
        raise ValueError(f"{info.name}: data pointer {info.data_ptr:#x} is not "
                         f"{_ALIGN}-byte aligned")
    for s in strides:
        if s * info.element_size % _ALIGN:
            raise ValueError(f"{info.name}: stride {s} elements ({s * info.element_size} "
                             f"bytes) is not a multiple of {_ALIGN} bytes; strides "
                             f"{list(info.strides)}")


def _token_stride(info):
    """Stride between query tokens when dims 0 and 1 (batch, s_q) are read
    as one token dim t = b * s_q + s."""
    (b, s), (sb, ss) = info.shape[:2], info.strides[:2]
    if s == 1:
        return sb
    if b == 1 or sb == s * ss:
        return ss
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


def check_decode_inputs(q, kv, indices):
    """DecodeDims of (q, kv_cache, indices) given as TensorInfo; TypeError
    for a dtype, ValueError naming the tensor for anything else."""
    _check_dtype(q, "bfloat16")
    _check_dtype(kv, "bfloat16")
    _check_dtype(indices, "int32")
    _check_device([q, kv, indices])
    _check_ndim(q, (4,), "[batch, s_q, heads, d_qk]")
    _check_ndim(kv, (3, 4), "[num_pages, page_block_size, d_qk] or "
                            "[num_pages, page_block_size, 1, d_qk]")
    _check_ndim(indices, (3,), "[batch, s_q, topk]")
    batch, s_q, heads, d_qk = q.shape
    if len(kv.shape) == 4 and kv.shape[2] != 1:
        raise ValueError(f"{kv.name}: a 4-dim cache is [num_pages, page_block_size, 1, d_qk] "
                         f"(one latent KV head), got shape {list(kv.shape)}")
    if kv.shape[-1] != d_qk:
        raise ValueError(f"{kv.name}: rows of {kv.shape[-1]} values, {q.name} has d_qk {d_qk}")
    if indices.shape[:2] != (batch, s_q):
        raise ValueError(f"{indices.name}: shape {list(indices.shape)} does not start with "
                         f"{q.name}'s [batch, s_q] = {[batch, s_q]}")
    for info in (q, kv, indices):
        _check_last_dim(info)
    q_token, kv_page, kv_row = _token_stride(q), kv.strides[0], kv.strides[1]
    _check_aligned(q, (q_token, q.strides[2]))
    _check_aligned(kv, (kv_page, kv_row))
    return DecodeDims(batch=batch, s_q=s_q, heads=heads, d_qk=d_qk, topk=indices.shape[2],
                      num_pages=kv.shape[0], page_block_size=kv.shape[1], device=q.device,
                      q_token_stride=q_token, q_head_stride=q.strides[2],
                      kv_page_stride=kv_page, kv_row_stride=kv_row,
                      indices_token_stride=_token_stride(indices))


def _rows_overlap(row, dims):
    """Whether rows of `row` elements placed by (size, stride) dims overlap:
    from the innermost dim out, each stride must step past all that the
    inner dims cover."""
    span = row
    for size, stride in sorted((d for d in dims if d[0] > 1), key=lambda d: d[1]):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def check_out(out, dims, d_v):
    """(token stride, head stride) of a caller's out buffer [batch, s_q,
    heads, d_v] bf16, whose rows must not overlap (the kernel writes them)."""
    _check_dtype(out, "bfloat16")
    _check_ndim(out, (4,), "[batch, s_q, heads, d_v]")
    want = (dims.batch, dims.s_q, dims.heads, d_v)
    if out.shape != want:
        raise ValueError(f"{out.name}: expected shape {list(want)}, got {list(out.shape)}")
    if out.device != dims.device:
        raise ValueError(f"{out.name} is on {out.device[0]}:{out.device[1]}, the inputs on "
                         f"cuda:{dims.device[1]}")
    _check_last_dim(out)
    token, head = _token_stride(out), out.strides[2]
    if _rows_overlap(d_v, ((dims.batch * dims.s_q, token), (dims.heads, head))):
        raise ValueError(f"{out.name}: rows overlap (strides {list(out.strides)} for shape "
                         f"{list(out.shape)}); pass a dense or non-overlapping buffer")
    _check_aligned(out, (token, head))
    return token, head


def spec_for_inputs(dims, softmax_scale, return_lse, d_v=None):
    """The AttentionSpec that (q, kv_cache, indices) call for."""
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"softmax_scale: got {softmax_scale}, expected finite and > 0")
    rank, rope = infer_latent_dims(dims.d_qk, d_v)
    return make_spec(num_q_heads=dims.heads, kv_lora_rank=rank, rope_dim=rope, topk=dims.topk,
                     s_q=dims.s_q, page_block_size=dims.page_block_size,
                     softmax_scale=scale, return_lse=bool(return_lse))


def check_against_spec(dims, spec, softmax_scale, return_lse):
    """ValueError unless the inputs fit the kernel's spec (everything but
    s_q, which picks the manifest variant)."""
    for what, got, want in (("heads (q dim 2)", dims.heads, spec.num_q_heads),
                            ("d_qk (q dim 3)", dims.d_qk, spec.kv_lora_rank + spec.rope_dim),
                            ("topk (indices dim 2)", dims.topk, spec.topk),
                            ("page_block_size (kv_cache dim 1)", dims.page_block_size,
                             spec.page_block_size)):
        if got != want:
            raise ValueError(f"{what} is {got}; the kernel is built for {want}")
    if softmax_scale is not None and float32(softmax_scale) != spec.softmax_scale:
        raise ValueError(f"softmax_scale {softmax_scale} differs from the kernel's "
                         f"{spec.softmax_scale:.9g} (the scale is compiled into the kernel)")
    if return_lse and not spec.return_lse:
        raise ValueError("return_lse=True but the kernel was built with return_lse false")


Launch = collections.namedtuple("Launch", "grid block smem params")
LaunchPlan = collections.namedtuple("LaunchPlan", "main combine")
Pointers = collections.namedtuple("Pointers", "q kv indices out lse workspace")


def plan_launch(sel, dims, out_strides, ptrs):
    """The parameter blocks and launch shapes of one call. ptrs.lse may be
    0 (not written); ptrs.workspace is sel.workspace_bytes of device memory
    when sel.needs_combine: fp32 partial O [splits, tokens, heads, d_v], then
    fp32 partial lse [splits, tokens, heads]."""
    spec = sel.variant.spec
    tokens, heads, d_v = sel.num_tokens, spec.num_q_heads, spec.kv_lora_rank
    o_accum = lse_accum = 0
    if sel.needs_combine:
        o_bytes = sel.num_splits * tokens * heads * d_v * 4
        if sel.workspace_bytes != o_bytes + sel.num_splits * tokens * heads * 4:
            raise KforgeError(f"{sel.variant.module_name}: workspace of {sel.workspace_bytes} "
                              "bytes does not hold the fp32 partial O and lse this loader lays "
                              "out")
        o_accum, lse_accum = ptrs.workspace, ptrs.workspace + o_bytes
    p = DecodeParams(
        q=ptrs.q, kv=ptrs.kv, indices=ptrs.indices, out=ptrs.out, lse=ptrs.lse or None,
        o_accum=o_accum or None, lse_accum=lse_accum or None,
        q_token_stride=dims.q_token_stride, q_head_stride=dims.q_head_stride,
        kv_page_stride=dims.kv_page_stride, kv_row_stride=dims.kv_row_stride,
        num_kv_slots=dims.num_pages * dims.page_block_size,
        indices_stride=dims.indices_token_stride,
        out_token_stride=out_strides[0], out_head_stride=out_strides[1],
        num_tokens=tokens, num_splits=sel.num_splits, tokens_per_split=sel.tokens_per_split)
    main = Launch(sel.grid, sel.block_threads, sel.dynamic_smem_bytes, p)
    if not sel.needs_combine:
        return LaunchPlan(main, None)
    c = CombineParams(o_accum=o_accum, lse_accum=lse_accum, out=ptrs.out, lse=ptrs.lse or None,
                      out_token_stride=out_strides[0], out_head_stride=out_strides[1],
                      num_tokens=tokens, num_splits=sel.num_splits)
    return LaunchPlan(main, Launch(sel.combine_grid + (1,), sel.combine_block_threads, 0, c))


# ---------------------------------------------------------------- CUDA


def _torch():
    try:
        import torch
    except ImportError as e:
        raise KforgeError(f"kforge.sparse_mla_decode needs PyTorch ({e})") from e
    return torch


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise KforgeError(f"loading kforge kernels needs cuda-python's cuda.bindings ({e}); "
                          "install the cuda-python (or cuda-bindings) package") from e
    return driver


def _cu_check(cu, result, what):
    """The outputs of a cuda.bindings call, or KforgeError naming the call."""
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        name = cu.cuGetErrorName(err)[1]
        name = name.decode() if isinstance(name, bytes) else name
        raise KforgeError(f"{what} failed: {name}")
    return result[1] if len(result) == 2 else result[1:]


class _LoadedKernel:
    """One artifact's two entry points, loaded for one device."""

    def __init__(self, artifact, device_index, capability):
        check_arch_runs(artifact.arch, capability)
        cu = self._cu = _driver()
        name = artifact.module_name
        # The driver may read the image lazily (CUDA_MODULE_LOADING=LAZY):
        # keep it alive as long as the library.
        self._image = bytes(artifact.cubin)
        self._library = _cu_check(cu, cu.cuLibraryLoadData(self._image, None, None, 0,
                                                           None, None, 0),
                                  f"cuLibraryLoadData({name})")
        dev = _cu_check(cu, cu.cuDeviceGet(device_index), f"cuDeviceGet({device_index})")
        entries = [_cu_check(cu, cu.cuLibraryGetKernel(self._library, entry.encode()),
                             f"cuLibraryGetKernel({name}, {entry})")
                   for entry in (artifact.main_entry, artifact.combine_entry)]
        _cu_check(cu, cu.cuKernelSetAttribute(
            cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            artifact.launch.dynamic_smem_bytes, entries[0], dev),
            f"cuKernelSetAttribute({name}, max dynamic smem "
            f"{artifact.launch.dynamic_smem_bytes})")
        # Bound to the current context: the caller made the device current.
        self.main, self.combine = [
            _cu_check(cu, cu.cuKernelGetFunction(k), f"cuKernelGetFunction({name})")
            for k in entries]
        self.name = name

    def run(self, plan, stream):
        """Enqueues a LaunchPlan on `stream` (a cudaStream_t as an int)."""
        self._launch(self.main, plan.main, stream)
        if plan.combine is not None:
            self._launch(self.combine, plan.combine, stream)

    def _launch(self, function, launch, stream):
        cu = self._cu
        args = (ctypes.c_void_p * 1)(ctypes.addressof(launch.params))  # one by-value struct
        gx, gy, gz = launch.grid
        _cu_check(cu, cu.cuLaunchKernel(function, gx, gy, gz, launch.block, 1, 1, launch.smem,
                                        cu.CUstream(stream), ctypes.addressof(args), 0),
                  f"cuLaunchKernel({self.name}, grid {launch.grid}, block {launch.block})")


def _cuda_device(torch, device):
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device}")
    return device if device.index is not None else torch.device(
        "cuda", torch.cuda.current_device())


class SparseMlaDecoder:
    """Sparse MLA decode for one model (preset + tp, or spec) on one GPU.

    Fetches the manifest once; loads each variant's kernel the first time a
    call needs it (plain decode and each MTP s_q are separate variants)."""

    def __init__(self, source=None, preset=None, tp=None, spec=None, device=None, arch=None):
        torch = self._torch = _torch()
        self.source = source if source is not None else default_source()
        self.device = _cuda_device(torch, device)
        self.capability = torch.cuda.get_device_capability(self.device)
        self.arch = arch or arch_for_capability(*self.capability)
        check_arch_runs(self.arch, self.capability)
        self.sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.manifest = self.source.get_manifest(preset=preset, tp=tp, spec=spec, arch=self.arch)
        self.spec = first_choice(self.manifest).spec
        self._kernels = {}
        self._lock = threading.Lock()

    def selection(self, batch, s_q):
        """The variant and launch configuration for batch x s_q tokens."""
        shape = Shape(batch=batch, s_q=s_q, num_q_heads=self.spec.num_q_heads,
                      topk=self.spec.topk, page_block_size=self.spec.page_block_size,
                      kv_dtype=self.spec.kv_cache_dtype)
        return select(self.manifest, Device(self.arch, self.sm_count), shape)

    def prefetch(self):
        """Fetches and loads every variant's kernel (engine start), so that no
        decode step waits on the network or a compile. Returns the number of
        kernels loaded."""
        for variant in self.manifest.variants:
            self._kernel(variant)
        return len(self.manifest.variants)

    def _kernel(self, variant):
        with self._lock:
            kernel = self._kernels.get(variant.key)
        if kernel is None:
            artifact = self.source.get_kernel(variant, self.arch)
            with self._torch.cuda.device(self.device):
                self._torch.zeros(1, device=self.device)  # torch's context is current
                kernel = _LoadedKernel(artifact, self.device.index, self.capability)
            with self._lock:
                kernel = self._kernels.setdefault(variant.key, kernel)
        return kernel

    def __call__(self, q, kv_cache, indices, softmax_scale=None, *, return_lse=False, out=None):
        """out [batch, s_q, heads, d_v] bf16, or (out, lse [batch, s_q,
        heads] fp32) with return_lse. softmax_scale, when given, must be the
        kernel's."""
        torch = self._torch
        dims = check_decode_inputs(tensor_info("q", q), tensor_info("kv_cache", kv_cache),
                                   tensor_info("indices", indices))
        if dims.device != ("cuda", self.device.index):
            raise ValueError(f"q is on cuda:{dims.device[1]}, this decoder on {self.device}")
        check_against_spec(dims, self.spec, softmax_scale, return_lse)
        sel = self.selection(dims.batch, dims.s_q)
        kernel = self._kernel(sel.variant)
        d_v = self.spec.kv_lora_rank
        if out is None:
            out = torch.empty(dims.batch, dims.s_q, dims.heads, d_v, dtype=torch.bfloat16,
                              device=self.device)
        out_strides = check_out(tensor_info("out", out), dims, d_v)
        lse = (torch.empty(dims.batch, dims.s_q, dims.heads, dtype=torch.float32,
                           device=self.device) if return_lse else None)
        workspace = (torch.empty(sel.workspace_bytes, dtype=torch.uint8, device=self.device)
                     if sel.needs_combine else None)
        ptrs = Pointers(q=q.data_ptr(), kv=kv_cache.data_ptr(), indices=indices.data_ptr(),
                        out=out.data_ptr(), lse=lse.data_ptr() if lse is not None else 0,
                        workspace=workspace.data_ptr() if workspace is not None else 0)
        plan = plan_launch(sel, dims, out_strides, ptrs)
        with torch.cuda.device(self.device):
            kernel.run(plan, torch.cuda.current_stream(self.device).cuda_stream)
        return (out, lse) if return_lse else out


def decoder_for(q, kv_cache, indices, softmax_scale, *, source=None, return_lse=False,
                out=None):
    """The cached SparseMlaDecoder sparse_mla_decode uses for these inputs."""
    dims = check_decode_inputs(tensor_info("q", q), tensor_info("kv_cache", kv_cache),
                               tensor_info("indices", indices))
    d_v = out.shape[-1] if out is not None else None
    source = source if source is not None else default_source()
    # Everything the spec is built from, so a hit builds no protobuf.
    key = (source, dims.device, dims.heads, dims.d_qk, dims.topk, dims.s_q,
           dims.page_block_size, float(softmax_scale), bool(return_lse), d_v)
    with _lock:
        decoder = _decoders.get(key)
    if decoder is None:
        spec = spec_for_inputs(dims, softmax_scale, return_lse, d_v)
        decoder = SparseMlaDecoder(source, spec=spec, device=dims.device[1])
        with _lock:
            decoder = _decoders.setdefault(key, decoder)
    return decoder


def sparse_mla_decode(q, kv_cache, indices, softmax_scale, *, source=None, return_lse=False,
                      out=None):
    """Sparse MLA decode with the kernel for exactly these shapes (see the
    module docstring). Returns out, or (out, lse) with return_lse."""
    decoder = decoder_for(q, kv_cache, indices, softmax_scale, source=source,
                          return_lse=return_lse, out=out)
    return decoder(q, kv_cache, indices, softmax_scale, return_lse=return_lse, out=out)

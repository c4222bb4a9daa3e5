"""Minimal CUDA Driver API loader for kforge modules (ctypes over libcuda).

Loads a cubin written by `kforge compile` (DIR/<module>.cubin plus its JSON
description) into the current CUDA context and launches the sparse MLA main
and combine kernels on PyTorch tensors, on torch's current stream.

The parameter blocks mirror templates/kforge/sparse_mla/config.h; their sizes
are checked against the artifact's params_bytes and the cubin's own
parameter size, so a layout drift fails loudly instead of corrupting memory.
"""

import ctypes
import json
import math
import os

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16

_libcuda = None


def _cuda():
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
    return _libcuda


def _check(result, what):
    if result != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {name.value.decode() if name.value else result}")


class DecodeParams(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("kv", ctypes.c_void_p),
        ("indices", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("o_accum", ctypes.c_void_p),
        ("lse_accum", ctypes.c_void_p),
        ("q_token_stride", ctypes.c_longlong),
        ("q_head_stride", ctypes.c_longlong),
        ("kv_page_stride", ctypes.c_longlong),
        ("kv_row_stride", ctypes.c_longlong),
        ("num_kv_slots", ctypes.c_longlong),
        ("indices_stride", ctypes.c_longlong),
        ("out_token_stride", ctypes.c_longlong),
        ("out_head_stride", ctypes.c_longlong),
        ("num_tokens", ctypes.c_int),
        ("num_splits", ctypes.c_int),
        ("tokens_per_split", ctypes.c_int),
        ("reserved", ctypes.c_int),
    ]


class CombineParams(ctypes.Structure):
    _fields_ = [
        ("o_accum", ctypes.c_void_p),
        ("lse_accum", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("out_token_stride", ctypes.c_longlong),
        ("out_head_stride", ctypes.c_longlong),
        ("num_tokens", ctypes.c_int),
        ("num_splits", ctypes.c_int),
    ]


def device_sm_count(device_index=0):
    import torch
    return torch.cuda.get_device_properties(device_index).multi_processor_count


class SparseMlaModule:
    """One kforge sparse MLA module loaded into the current context."""

    def __init__(self, cubin_path, json_path=None):
        import torch
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # make torch's primary context current
        if json_path is None:
            json_path = os.path.splitext(cubin_path)[0] + ".json"
        with open(json_path) as f:
            self.meta = json.load(f)
        with open(cubin_path, "rb") as f:
            self._image = f.read()
        if ctypes.sizeof(DecodeParams) != self.meta["params_bytes"]:
            raise RuntimeError(
                f"DecodeParams is {ctypes.sizeof(DecodeParams)} bytes here but "
                f"{self.meta['params_bytes']} in {json_path}")
        for k in self.meta["cubin_info"]["kernels"]:
            want = {self.meta["main_entry"]: ctypes.sizeof(DecodeParams),
                    self.meta["combine_entry"]: ctypes.sizeof(CombineParams)}.get(k["name"])
            if want is not None and k["param_bytes"] != want:
                raise RuntimeError(f"{k['name']}: cubin takes {k['param_bytes']} param bytes, "
                                   f"loader passes {want}")
        self._check_arch()
        self.module = ctypes.c_void_p()
        _check(_cuda().cuModuleLoadData(ctypes.byref(self.module), self._image),
               f"cuModuleLoadData({cubin_path})")
        self.main = self._function(self.meta["main_entry"])
        self.combine = self._function(self.meta["combine_entry"])
        self.smem = self.meta["launch"]["dynamic_smem_bytes"]
        _check(_cuda().cuFuncSetAttribute(
            self.main, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem),
            "cuFuncSetAttribute(max dynamic smem)")
        spec = self.meta["spec"]
        self.num_heads = spec["num_q_heads"]
        self.d_v = spec["kv_lora_rank"]
        self.d_qk = self.d_v + spec.get("rope_dim", 0)
        self.topk = spec["topk"]
        self.page_block_size = spec["page_block_size"]
        self.return_lse = spec.get("return_lse", False)
        t = self.meta["tiling"]
        self.groups = t["num_head_groups"]
        self.token_tile = t["token_tile"]
        self.block = self.meta["launch"]["block_threads"]
        self.combine_block = self.meta["launch"]["combine_block_threads"]

    def _check_arch(self):
        import torch
        major, minor = torch.cuda.get_device_capability()
        arch = self.meta["arch"]
        digits = arch[3:].rstrip("af")
        want = (int(digits[:-1]), int(digits[-1]))
        if want != (major, minor):
            raise RuntimeError(f"module is for {arch}, device is sm_{major}{minor}")

    def _function(self, name):
        f = ctypes.c_void_p()
        _check(_cuda().cuModuleGetFunction(ctypes.byref(f), self.module, name.encode()),
               f"cuModuleGetFunction({name})")
        return f

    def max_splits(self):
        return max(1, math.ceil(self.topk / self.token_tile))

    def auto_splits(self, num_tokens, sm_count):
        """The launch rule's split formula (LaunchRule in artifact.proto):
        split only while the grid still fits in one wave."""
        rule = self.meta["launch"]
        fit = sm_count * rule["ctas_per_sm"] // (self.groups * max(1, num_tokens))
        cap = max(1, math.ceil(self.max_splits() / rule["min_tiles_per_split"]))
        return max(1, min(fit, cap))

    def tokens_per_split(self, num_splits):
        per = math.ceil(self.topk / num_splits)
        return math.ceil(per / self.token_tile) * self.token_tile

    def workspace(self, num_tokens, num_splits):
        import torch
        if num_splits == 1:
            return None, None
        o = torch.empty(num_splits, num_tokens, self.num_heads, self.d_v,
                        dtype=torch.float32, device="cuda")
        l = torch.empty(num_splits, num_tokens, self.num_heads,
                        dtype=torch.float32, device="cuda")
        return o, l

    def _launch(self, func, grid, block, smem, params, stream):
        holder = ctypes.c_void_p(ctypes.addressof(params))
        args = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        del holder
        _check(_cuda().cuLaunchKernel(
            func, grid[0], grid[1], grid[2], block, 1, 1, smem,
            ctypes.c_void_p(stream), args, None), "cuLaunchKernel")

    def __call__(self, q, kv, indices, out, lse=None, num_splits=1, workspace=None):
        """q [T, H, d_qk] bf16; kv bf16 [num_pages, page_block_size, d_qk] (any
        page and row strides) or [num_slots, d_qk]; indices [T, topk] int32;
        out [T, H, d_v] bf16; lse [T, H] fp32 or None."""
        import torch
        T = q.shape[0]
        if kv.dim() == 3:
            if kv.shape[1] != self.page_block_size:
                raise ValueError(f"kv page size {kv.shape[1]} != module's {self.page_block_size}")
            num_kv_slots = kv.shape[0] * kv.shape[1]
            kv_page_stride, row_stride = kv.stride(0), kv.stride(1)
        else:
            num_kv_slots = kv.shape[0]
            row_stride = kv.stride(0)
            kv_page_stride = row_stride * self.page_block_size
        if workspace is None:
            workspace = self.workspace(T, num_splits)
        o_acc, l_acc = workspace
        p = DecodeParams()
        p.q, p.kv, p.indices, p.out = q.data_ptr(), kv.data_ptr(), indices.data_ptr(), out.data_ptr()
        p.lse = lse.data_ptr() if lse is not None else None
        p.o_accum = o_acc.data_ptr() if o_acc is not None else None
        p.lse_accum = l_acc.data_ptr() if l_acc is not None else None
        p.q_token_stride, p.q_head_stride = q.stride(0), q.stride(1)
        p.kv_page_stride, p.kv_row_stride = kv_page_stride, row_stride
        p.num_kv_slots = num_kv_slots
        p.indices_stride = indices.stride(0)
        p.out_token_stride, p.out_head_stride = out.stride(0), out.stride(1)
        p.num_tokens, p.num_splits = T, num_splits
        p.tokens_per_split = self.tokens_per_split(num_splits)
        stream = torch.cuda.current_stream().cuda_stream
        self._launch(self.main, (self.groups, num_splits, T), self.block, self.smem, p, stream)
        if num_splits > 1:
            c = CombineParams()
            c.o_accum, c.lse_accum, c.out = o_acc.data_ptr(), l_acc.data_ptr(), out.data_ptr()
            c.lse = lse.data_ptr() if lse is not None else None
            c.out_token_stride, c.out_head_stride = out.stride(0), out.stride(1)
            c.num_tokens, c.num_splits = T, num_splits
            warps = self.combine_block // 32
            self._launch(self.combine, (T, math.ceil(self.num_heads / warps), 1),
                         self.combine_block, 0, c, stream)

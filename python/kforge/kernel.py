"""One module written by `kforge compile` (<module>.cubin, <module>.cubin.<i>
for its further images, <module>.json),
loaded and launched on PyTorch tensors with no server or bundle: for GPU
checks, benchmarks and profiling.

    k = kforge.Kernel.from_files("out/sparse_mla_..._sm90a.cubin")
    k(q, kv, indices, out, lse, num_splits=k.max_splits)

The module becomes a one-variant manifest (ManifestForArtifact), so its
launches are planned by the same C++ PlanDecode as every other kforge
kernel; num_splits forces a split count (1..max_splits) where the launch
rule would choose its own.
"""

import glob
import os

from kforge import _capi
from kforge._module import image_count, put_images, read_images
from kforge._proto import pb
from kforge.errors import KforgeError
from kforge.ops import (LoadedKernel, _torch, check_decode_inputs, cuda_device, decode_args,
                        extra_kv_row_bytes_for, kv_row_bytes_for, tensor_info)
from kforge.plan import Device, ManifestRef, Shape, plan_decode, select
from kforge.spec import sparse_mla_spec


def read_artifact(cubin_path, json_path=None):
    """The KernelArtifact `kforge compile` described in JSON beside the
    cubin, with the bytes of its cubin images put back in."""
    if json_path is None:
        json_path = os.path.splitext(cubin_path)[0] + ".json"
    artifact = pb().artifact_pb2.KernelArtifact()
    try:
        with open(json_path, encoding="utf-8") as f:
            pb().json_format.Parse(f.read(), artifact)
    except (OSError, ValueError) as e:
        raise KforgeError(f"{json_path}: not a kforge compile description ({e})") from None
    return put_images(artifact, read_images(cubin_path, image_count(artifact.cubin_info.kernels)))


def module_cubins(directory, pattern="*"):
    """The modules `kforge compile` wrote to `directory` whose names match
    `pattern` (a glob): each module's <module>.cubin (image 0, what
    Kernel.from_files takes; its further images are <module>.cubin.<i>);
    sorted."""
    return sorted(glob.glob(os.path.join(directory, pattern + ".cubin")))


class Kernel:
    """A compiled kforge module loaded on one GPU."""

    @classmethod
    def from_files(cls, cubin_path, json_path=None, device=None):
        return cls(read_artifact(cubin_path, json_path), device=device)

    def __init__(self, artifact, device=None):
        torch = self._torch = _torch()
        self.artifact = artifact
        self.spec = sparse_mla_spec(artifact.spec, artifact.module_name)
        self._kv_row_bytes = kv_row_bytes_for(self.spec)  # None for a bf16 cache
        self.manifest = _capi.manifest_for_artifact(artifact)
        self._manifest = ManifestRef(self.manifest)
        # The whole artifact check (entries, parameter sizes, the cubin's
        # ELF) before anything is loaded.
        # A first answer (artifact.partial) is checked as the module it is.
        _capi.check_artifact(self.manifest.variants[0], artifact.arch, artifact,
                             accept_partial=True)
        self.device = cuda_device(torch, device)
        self.capability = torch.cuda.get_device_capability(self.device)
        self.sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count
        with torch.cuda.device(self.device):
            torch.zeros(1, device=self.device)  # torch's context is current
            self._loaded = LoadedKernel(artifact, self.device.index, self.capability)

    @property
    def module_name(self):
        return self.artifact.module_name

    def _device(self, num_splits=None):
        return Device(self.artifact.arch, self.sm_count, num_splits or 0,
                      self._loaded.max_active_clusters)

    def selection(self, num_tokens, num_splits=None):
        """The launch for num_tokens query tokens (the rule's split count,
        or num_splits)."""
        s = self.spec
        return select(self._manifest, self._device(num_splits),
                      Shape(num_tokens, 1, s.num_q_heads, s.topk, s.page_block_size,
                            s.kv_cache_dtype))

    @property
    def max_splits(self):
        return self.selection(1).max_splits

    def auto_splits(self, num_tokens):
        """The launch rule's split count on this GPU."""
        return self.selection(num_tokens).num_splits

    def workspace(self, num_tokens, num_splits=None):
        """A workspace for num_tokens tokens (None when the launch needs
        none), to pass to __call__ (e.g. outside a captured graph)."""
        need = self.selection(num_tokens, num_splits).workspace_bytes
        return (self._torch.empty(need, dtype=self._torch.uint8, device=self.device)
                if need else None)

    def plan(self, q, kv, indices, out, lse=None, num_splits=None, workspace=None, *,
             topk_length=None, sink=None, extra_kv_cache=None, extra_indices=None,
             extra_topk_length=None):
        """The Selection PlanDecode makes for these tensors (q [tokens,
        heads, d_qk] or [batch, s_q, heads, d_qk]; kv paged 3-/4-dim or
        [num_slots, d_qk]; indices and out to match; lse contiguous or
        None; topk_length, sink and the extra cache's tensors as
        SparseMlaDecoder takes them, or None), for a workspace tensor (or
        device address) when it splits."""
        dims = check_decode_inputs(tensor_info("q", q), tensor_info("kv", kv),
                                   tensor_info("indices", indices),
                                   page_block_size=self.spec.page_block_size,
                                   kv_row_bytes=self._kv_row_bytes)
        extra = None
        if extra_kv_cache is not None or extra_indices is not None:
            extra = (extra_kv_cache, extra_indices, extra_topk_length)
        args = decode_args(q, kv, indices, dims, out, lse, self.spec.softmax_scale,
                           self.spec.kv_cache_dtype, kv_name="kv", topk_length=topk_length,
                           sink=sink, extra=extra,
                           extra_kv_dtype=(int(self.spec.extra_kv.kv_cache_dtype)
                                           if self.spec.HasField("extra_kv") else 0),
                           extra_row_bytes=extra_kv_row_bytes_for(self.spec))
        ws = workspace.data_ptr() if hasattr(workspace, "data_ptr") else int(workspace or 0)
        return plan_decode(self._manifest, self._device(num_splits), args, ws)

    def __call__(self, q, kv, indices, out, lse=None, num_splits=None, workspace=None, *,
                 topk_length=None, sink=None, extra_kv_cache=None, extra_indices=None,
                 extra_topk_length=None):
        """Launches on torch's current stream; a workspace is allocated
        from torch's caching allocator when none is given and the launch
        splits. Returns the Selection launched."""
        torch = self._torch
        opts = dict(topk_length=topk_length, sink=sink, extra_kv_cache=extra_kv_cache,
                    extra_indices=extra_indices, extra_topk_length=extra_topk_length)
        sel = self.plan(q, kv, indices, out, lse, num_splits, workspace, **opts)
        if sel.needs_combine and workspace is None:
            workspace = torch.empty(sel.workspace_bytes, dtype=torch.uint8, device=self.device)
            sel = self.plan(q, kv, indices, out, lse, num_splits, workspace, **opts)
        elif sel.needs_combine and hasattr(workspace, "numel") and \
                workspace.numel() * workspace.element_size() < sel.workspace_bytes:
            raise ValueError(f"workspace: {workspace.numel() * workspace.element_size()} bytes, "
                             f"the launch needs {sel.workspace_bytes}")
        with torch.cuda.device(self.device):
            self._loaded.run(sel, torch.cuda.current_stream(self.device).cuda_stream)
        return sel

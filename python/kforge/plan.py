"""Variant choice and launch plans, from kforge's C++ model library
(model/selector.h, model/decode_plan.h) through the C ABI: Python holds no
selection rule, launch formula or argument check of its own.

select() answers which variant and launch configuration a shape gets;
plan_decode() also checks a call's arguments (pointers, sizes, strides,
alignment, scale) and returns the exact parameter blocks to launch.
"""

import dataclasses

from kforge import _capi
from kforge.spec import KV_CACHE_DTYPE_BF16


@dataclasses.dataclass(frozen=True)
class Device:
    arch: str                  # "sm_90a", "sm_120a", ...
    sm_count: int
    forced_num_splits: int = 0  # 0: the launch rule's; else 1..max_splits
    # Clusters of the cluster entry the GPU runs at once (what the loaded
    # kernel reads from the driver: LoadedKernel.max_active_clusters); 0:
    # the cluster entry is never chosen.
    max_active_clusters: int = 0

    def c_struct(self):
        return _capi.device(self.arch, self.sm_count, self.forced_num_splits,
                            self.max_active_clusters)


@dataclasses.dataclass(frozen=True)
class Shape:
    """One decode call's shape."""
    batch: int
    s_q: int
    num_q_heads: int
    topk: int
    page_block_size: int
    kv_dtype: int = KV_CACHE_DTYPE_BF16  # spec.proto KvCacheDtype value

    def c_struct(self):
        return _capi.Shape(self.batch, self.s_q, self.num_q_heads, self.topk,
                           self.page_block_size, self.kv_dtype)


class Selection:
    """A kforge.v1.LaunchPlan (`plan`) with the manifest variant it names.
    grid is (head groups, splits, tokens); combine_grid (tokens, head
    blocks) or None with one split; main_params / combine_params the
    parameter blocks' bytes when made by plan_decode."""

    __slots__ = ("plan", "variant")

    def __init__(self, plan, variant):
        self.plan = plan
        self.variant = variant

    def __getattr__(self, name):  # the LaunchPlan's fields
        return getattr(self.plan, name)

    @property
    def grid(self):
        p = self.plan
        return (p.grid_x, p.grid_y, p.grid_z)

    @property
    def combine_grid(self):
        p = self.plan
        return (p.combine_grid_x, p.combine_grid_y) if p.needs_combine else None

    def __eq__(self, other):
        return isinstance(other, Selection) and self.plan == other.plan

    def __repr__(self):
        return (f"Selection(variant {self.plan.variant_index} {self.plan.module_name}, "
                f"grid {self.grid}, splits {self.plan.num_splits})")


class ManifestRef:
    """A manifest with its serialized bytes kept, so that a call per decode
    step does not serialize it again."""

    __slots__ = ("manifest", "data")

    def __init__(self, manifest):
        if isinstance(manifest, ManifestRef):
            manifest = manifest.manifest
        self.manifest = manifest
        self.data = manifest.SerializeToString(deterministic=True)


def _ref(manifest):
    return manifest if isinstance(manifest, ManifestRef) else ManifestRef(manifest)


def _device(device):
    return device.c_struct() if isinstance(device, Device) else device


def select(manifest, device, shape):
    """Select: the first variant in choice order that supports `shape`
    exactly on `device`, with its launch configuration. KforgeInvalidArgument
    (a ValueError) naming the field for a bad shape, device or manifest;
    KforgeNotFound with a report of what each variant lacks when none fits."""
    ref = _ref(manifest)
    plan = _capi.select(ref.data, _device(device), shape.c_struct())
    return Selection(plan, ref.manifest.variants[plan.variant_index])


def plan_decode(manifest, device, args, workspace=0):
    """PlanDecode: ValidateDecodeArgs + Select + both parameter blocks, for
    `args` (a kforge._capi.DecodeArgs) and a workspace at device address
    `workspace` holding the plan's workspace_bytes (0 when none is needed)."""
    ref = _ref(manifest)
    plan = _capi.plan_decode(ref.data, _device(device), args, workspace)
    return Selection(plan, ref.manifest.variants[plan.variant_index])


def workspace_bytes_for(manifest, device, max_tokens):
    """WorkspaceBytesFor: the workspace that serves every call of up to
    max_tokens query tokens on `device` (reserve it before a CUDA graph)."""
    return _capi.workspace_bytes_for(_ref(manifest).data, _device(device), max_tokens)

"""Variant choice and launch configuration for a manifest: runtime/selector.cc
in Python (tests/python_client_test.py compares the two on a grid of shapes).

A manifest is data (LaunchRule in artifact.proto): walk its choice order, take
the first variant whose spec supports the shape exactly, evaluate its launch
rule for batch * s_q tokens on the device's SMs.
"""

import dataclasses

from kforge.errors import KforgeNotFound
from kforge.spec import KV_CACHE_DTYPE_BF16, KV_DTYPE_NAMES, canonical_arch

# CUDA's limit on gridDim.y and gridDim.z.
MAX_GRID_YZ = 65535


@dataclasses.dataclass(frozen=True)
class Device:
    arch: str       # "sm_90a", "sm_120a", ...
    sm_count: int


@dataclasses.dataclass(frozen=True)
class Shape:
    """One decode call's shape."""
    batch: int
    s_q: int
    num_q_heads: int
    topk: int
    page_block_size: int
    kv_dtype: int = KV_CACHE_DTYPE_BF16  # spec.proto KvCacheDtype value


@dataclasses.dataclass(frozen=True)
class Selection:
    variant_index: int          # into manifest.variants
    variant: object             # the kforge.v1.ManifestVariant
    num_tokens: int             # batch * s_q
    num_splits: int
    tokens_per_split: int       # DecodeParams.tokens_per_split
    grid: tuple                 # (head groups, splits, tokens)
    block_threads: int
    dynamic_smem_bytes: int
    combine_grid: tuple         # (tokens, head blocks); None with one split
    combine_block_threads: int  # 0 with one split
    workspace_bytes: int        # 0 with one split

    @property
    def needs_combine(self):
        return self.num_splits > 1


def _ceil_div(a, b):
    return -(-a // b)


def num_splits(spec, tiling, launch, num_tokens, sm_count):
    """LaunchRule's formula: split only while the grid fits in one wave, and
    never below min_tiles_per_split tiles per split (compiler/codegen.cc
    NumSplits)."""
    if tiling.token_tile == 0 or launch.min_tiles_per_split == 0:
        raise ValueError("manifest variant: tiling.token_tile and "
                         "launch.min_tiles_per_split must be > 0")
    ctas = tiling.num_head_groups * max(1, num_tokens)
    fit = sm_count * launch.ctas_per_sm // ctas
    tiles = _ceil_div(spec.topk, tiling.token_tile)
    max_splits = max(1, _ceil_div(tiles, launch.min_tiles_per_split))
    return min(max(fit, 1), max_splits)


def tokens_per_split(topk, splits, granularity):
    """Indices each split covers: an equal share rounded up to whole tiles."""
    return _ceil_div(_ceil_div(topk, splits), granularity) * granularity


def _validate(manifest, device, shape):
    if not device.arch:
        raise ValueError("device.arch: empty")
    if device.sm_count < 1:
        raise ValueError(f"device.sm_count: must be >= 1, got {device.sm_count}")
    for name in ("batch", "s_q", "num_q_heads", "topk", "page_block_size"):
        value = getattr(shape, name)
        if value < 1:
            raise ValueError(f"shape.{name}: must be >= 1, got {value}")
    if shape.kv_dtype not in KV_DTYPE_NAMES:
        raise ValueError(f"shape.kv_dtype: must be bf16 or fp8_ds_mla, got {shape.kv_dtype}")
    tokens = shape.batch * shape.s_q
    if tokens > MAX_GRID_YZ:
        raise ValueError(f"shape.batch: batch * s_q = {tokens} exceeds the grid limit "
                         f"{MAX_GRID_YZ}")
    for i, index in enumerate(manifest.choice_order):
        if index >= len(manifest.variants):
            raise ValueError(f"manifest.choice_order[{i}]: {index} is out of range "
                             f"({len(manifest.variants)} variants)")


def _dtype_name(value):
    return KV_DTYPE_NAMES.get(value, "unspecified")


def _supports(manifest_arch, s):
    return (f"arch {manifest_arch}, heads {s.num_q_heads}, s_q {s.s_q}, dtype "
            f"{_dtype_name(s.kv_cache_dtype)}, topk {s.topk}, page size {s.page_block_size}")


def _missing(manifest_arch, s, device_arch, shape):
    """Names of the features a variant's spec lacks for the shape."""
    missing = []
    if manifest_arch != device_arch:
        missing.append(f"arch {device_arch} (is {manifest_arch})")
    for name, want, has in (("heads", shape.num_q_heads, s.num_q_heads), ("s_q", shape.s_q, s.s_q)):
        if want != has:
            missing.append(f"{name}={want} (supports {has})")
    if shape.kv_dtype != s.kv_cache_dtype:
        missing.append(f"dtype={_dtype_name(shape.kv_dtype)} "
                       f"(supports {_dtype_name(s.kv_cache_dtype)})")
    for name, want, has in (("topk", shape.topk, s.topk),
                            ("page_size", shape.page_block_size, s.page_block_size)):
        if want != has:
            missing.append(f"{name}={want} (supports {has})")
    return missing


def _launch(index, variant, device, shape):
    tiling, launch = variant.tiling, variant.launch
    if tiling.num_head_groups == 0 or launch.block_threads == 0:
        raise ValueError(f"manifest.variants[{index}]: tiling.num_head_groups and "
                         "launch.block_threads must be > 0")
    tokens = shape.batch * shape.s_q
    splits = num_splits(variant.spec, tiling, launch, tokens, device.sm_count)
    if splits > MAX_GRID_YZ:
        raise ValueError(f"split count {splits} exceeds the grid limit")
    combine_grid, combine_threads, workspace = None, 0, 0
    if splits > 1:
        warps = launch.combine_block_threads // 32
        if warps == 0:
            raise ValueError(f"manifest.variants[{index}]: launch.combine_block_threads "
                             "must be >= 32")
        combine_grid = (tokens, _ceil_div(variant.spec.num_q_heads, warps))
        combine_threads = launch.combine_block_threads
        workspace = splits * tokens * launch.workspace_bytes_per_split_token
    granularity = launch.split_granularity_tokens or tiling.token_tile
    return Selection(
        variant_index=index, variant=variant, num_tokens=tokens, num_splits=splits,
        tokens_per_split=tokens_per_split(variant.spec.topk, splits, granularity),
        grid=(tiling.num_head_groups, splits, tokens), block_threads=launch.block_threads,
        dynamic_smem_bytes=launch.dynamic_smem_bytes, combine_grid=combine_grid,
        combine_block_threads=combine_threads, workspace_bytes=workspace)


def select(manifest, device, shape):
    """The first variant in choice order (variant order when the manifest
    has none) that supports `shape` exactly on `device`, with its launch
    configuration. ValueError for a bad shape, device or manifest;
    KforgeNotFound with a report of what each variant lacks when none fits."""
    _validate(manifest, device, shape)
    device_arch = canonical_arch(device.arch)
    manifest_arch = canonical_arch(manifest.arch)
    order = list(manifest.choice_order) or list(range(len(manifest.variants)))
    report = (f"no kernel variant fits: required arch {device_arch}, heads "
              f"{shape.num_q_heads}, s_q {shape.s_q}, dtype {_dtype_name(shape.kv_dtype)}, "
              f"topk {shape.topk}, page size {shape.page_block_size}")
    if not order:
        report += "\n  (the manifest has no variants)"
    for index in order:
        v = manifest.variants[index]
        missing = _missing(manifest_arch, v.spec, device_arch, shape)
        if not missing:
            return _launch(index, v, device, shape)
        report += (f"\n  variant {index} {v.module_name}: supports "
                   f"{_supports(manifest.arch, v.spec)}; missing {', '.join(missing)}")
    raise KforgeNotFound(report)

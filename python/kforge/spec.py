"""Model presets, target names and spec building.

Mirrors compiler/spec.cc (Presets, SpecFromPreset) and compiler/arch.cc
(ParseArch's spelling rules) so that a bundle can be searched by preset with
no server; tests/python_client_test.py checks the preset table against the
server's answers.
"""

import collections
import re
import struct

from kforge._proto import pb
from kforge.errors import KforgeError

Preset = collections.namedtuple("Preset", "heads kv_lora_rank rope_dim topk softmax_scale")

# compiler/spec.cc Presets(). The scale is the model's own (DESIGN.md), never
# derived from d_qk.
PRESETS = {
    "deepseek-v3.2": Preset(128, 512, 64, 2048, 0.135234),
    "glm-5": Preset(64, 512, 64, 2048, 0.0625),
}
PRESET_PAGE_BLOCK_SIZE = 64

# Enum values of spec.proto, usable without the generated modules.
ATTENTION_KIND_SPARSE_MLA_DECODE = 1
KV_CACHE_DTYPE_BF16 = 1
KV_CACHE_DTYPE_FP8_DS_MLA = 2
KV_DTYPE_NAMES = {KV_CACHE_DTYPE_BF16: "bf16", KV_CACHE_DTYPE_FP8_DS_MLA: "fp8_ds_mla"}

# The template family's latent widths (compiler/spec.cc ValidateSpec).
_RANK_STEP, _MAX_RANK, _ROPE_DIM = 64, 512, 64

_ARCH_RE = re.compile(r"^sm_(\d+)(\d)(a?)$")


def float32(value):
    """`value` rounded to float32, as an AttentionSpec stores softmax_scale."""
    return struct.unpack("f", struct.pack("f", float(value)))[0]


def make_spec(*, num_q_heads, kv_lora_rank, rope_dim, topk, s_q, page_block_size,
              softmax_scale, return_lse):
    """A bf16-cache sparse MLA decode AttentionSpec (rope_dim always set:
    the server rejects an absent one)."""
    return pb().spec_pb2.AttentionSpec(
        kind=ATTENTION_KIND_SPARSE_MLA_DECODE, num_q_heads=num_q_heads,
        kv_lora_rank=kv_lora_rank, rope_dim=rope_dim, topk=topk, s_q=s_q,
        kv_cache_dtype=KV_CACHE_DTYPE_BF16, page_block_size=page_block_size,
        softmax_scale=softmax_scale, return_lse=return_lse)


def spec_from_preset(name, tp=1):
    """SpecFromPreset: heads / tp, s_q 1, bf16 cache, pages of 64, lse on."""
    preset = PRESETS.get(name)
    if preset is None:
        raise ValueError(f"preset: got {name!r}, supported {', '.join(PRESETS)}")
    if not isinstance(tp, int) or tp < 1 or preset.heads % tp:
        raise ValueError(f"tensor_parallel: got {tp!r}, supported a divisor of "
                         f"{preset.heads} ({name} heads)")
    return make_spec(num_q_heads=preset.heads // tp, kv_lora_rank=preset.kv_lora_rank,
                     rope_dim=preset.rope_dim, topk=preset.topk, s_q=1,
                     page_block_size=PRESET_PAGE_BLOCK_SIZE,
                     softmax_scale=preset.softmax_scale, return_lse=True)


def selector(preset=None, tp=None, spec=None):
    """The KernelSelector for a preset (+ tensor-parallel degree) or a spec."""
    if (preset is None) == (spec is None):
        raise ValueError("give either preset= (with tp=) or spec=, not both or neither")
    if spec is not None and tp is not None:
        raise ValueError("tp= goes with preset=; a spec already fixes num_q_heads")
    sel = pb().service_pb2.KernelSelector()
    if spec is not None:
        if not isinstance(spec, pb().spec_pb2.AttentionSpec):
            raise TypeError(f"spec: expected kforge.v1.AttentionSpec, got {type(spec).__name__}")
        sel.spec.CopyFrom(spec)
    else:
        sel.preset.name = preset
        sel.preset.tensor_parallel = 1 if tp is None else tp
    return sel


def selector_spec(sel):
    """The spec a selector names (a preset is expanded with the table above)."""
    if sel.WhichOneof("source") == "spec":
        return sel.spec
    return spec_from_preset(sel.preset.name, sel.preset.tensor_parallel)


def canonical_arch(name):
    """ParseArch's spelling rules: "90a", "SM_90A " -> "sm_90a". Which
    targets exist is the server's to say."""
    arch = str(name).strip().lower()
    return arch if arch.startswith("sm_") else "sm_" + arch


def parse_arch(name):
    """(major, minor, arch_specific) of "sm_90a", "sm_120a", "sm_80", ..."""
    m = _ARCH_RE.match(canonical_arch(name))
    if not m:
        raise ValueError(f"arch: got {name!r}, expected sm_<major><minor>[a] such as sm_90a")
    return int(m.group(1)), int(m.group(2)), m.group(3) == "a"


def arch_for_capability(major, minor):
    """The target to ask for on a device: from 9.0 on the arch-specific one
    (wgmma and later MMA paths exist only there), plain before."""
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def check_arch_runs(arch, capability):
    """Raises KforgeError unless a cubin for `arch` runs on a device of
    compute capability `capability` (major, minor): an arch-specific ("a")
    cubin only on exactly its capability, a plain one on the same major with
    an equal or newer minor (sm_80 runs on 8.6 and 8.9)."""
    major, minor, specific = parse_arch(arch)
    dev_major, dev_minor = capability
    ok = (dev_major, dev_minor) == (major, minor) if specific else (
        dev_major == major and dev_minor >= minor)
    if not ok:
        rule = (f"exactly compute capability {major}.{minor}" if specific else
                f"compute capability {major}.{minor} to {major}.9")
        raise KforgeError(
            f"a kernel built for {arch} runs on {rule}, but this device is "
            f"{dev_major}.{dev_minor}; ask for arch {arch_for_capability(dev_major, dev_minor)}")


def _valid_rank(rank):
    return _RANK_STEP <= rank <= _MAX_RANK and rank % _RANK_STEP == 0


def infer_latent_dims(d_qk, d_v=None):
    """(kv_lora_rank, rope_dim) for a q/kv row width d_qk = kv_lora_rank +
    rope_dim, rope_dim 64 or 0. d_v (the output width, = kv_lora_rank) is
    needed only where both splits are valid (d_qk 128..512)."""
    if d_v is not None:
        if not _valid_rank(d_v) or d_qk - d_v not in (0, _ROPE_DIM):
            raise ValueError(f"d_qk {d_qk} with output width {d_v}: expected "
                             f"d_qk = d_v + 0 or {_ROPE_DIM}, d_v a multiple of "
                             f"{_RANK_STEP} in {_RANK_STEP}..{_MAX_RANK}")
        return d_v, d_qk - d_v
    fits = [(d_qk - rope, rope) for rope in (_ROPE_DIM, 0) if _valid_rank(d_qk - rope)]
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise ValueError(f"d_qk {d_qk}: expected kv_lora_rank (a multiple of {_RANK_STEP} "
                         f"in {_RANK_STEP}..{_MAX_RANK}) + rope_dim (0 or {_ROPE_DIM}), "
                         "e.g. 576 = 512 + 64")
    raise ValueError(f"d_qk {d_qk} is {fits[0][0]} + {fits[0][1]} or {fits[1][0]} + 0: "
                     "pass out= (its last dim is kv_lora_rank) to say which")

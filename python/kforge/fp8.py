"""The fp8_ds_mla KV cache record, for tests and for engines that migrate a
bf16 cache: a reference quantizer and dequantizer on torch tensors.

The record (templates/kforge/sparse_mla/common/kv_layout.h, KvFp8DsMlaSizes, where
the kernels read it; the same bytes vLLM and FlashMLA write), per token:
  bytes [0, 512)    512 latent values, fp8 e4m3 (e4m3fn)
  bytes [512, 528)  4 fp32 scales, scale g for values [128 g, 128 g + 128)
  bytes [528, 656)  64 rope values, bf16 (absent with rope_dim 0: 528 bytes)
value = e4m3 * scale. kforge.kv_row_bytes_for(spec) gives the record size
the C++ side checks a cache against.
"""

LATENT = 512
GROUP = 128
SCALES_OFFSET = LATENT
ROPE_OFFSET = SCALES_OFFSET + 4 * (LATENT // GROUP)
E4M3_MAX = 448.0


def _torch():
    import torch  # an engine dependency, not the package's
    return torch


def quantize_fp8_ds_mla(kv, scale_format="arbitrary"):
    """kv [..., 512 + rope] (bf16 or float, rope 0 or 64) -> uint8 [...,
    656 or 528]. Each group of 128 latent values gets scale amax / 448
    ("arbitrary", GLM-5) or the power of two at or above it ("pow2",
    DeepSeek-V3.2); an all-zero group gets scale 1."""
    torch = _torch()
    if scale_format not in ("arbitrary", "pow2"):
        raise ValueError(f"scale_format: got {scale_format!r}, supported arbitrary, pow2")
    rope = kv.shape[-1] - LATENT
    if rope not in (0, 64):
        raise ValueError(f"kv: last dim {kv.shape[-1]}, expected {LATENT} or {LATENT + 64}")
    lead = kv.shape[:-1]
    latent = kv[..., :LATENT].float().reshape(*lead, LATENT // GROUP, GROUP)
    amax = latent.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    if scale_format == "pow2":
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    codes = (latent / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    out = torch.empty(*lead, ROPE_OFFSET + 2 * rope, dtype=torch.uint8, device=kv.device)
    out[..., :LATENT] = codes.reshape(*lead, LATENT).view(torch.uint8)
    out[..., SCALES_OFFSET:ROPE_OFFSET] = scale.float().contiguous().view(torch.uint8).reshape(
        *lead, ROPE_OFFSET - SCALES_OFFSET)
    if rope:
        out[..., ROPE_OFFSET:] = kv[..., LATENT:].to(torch.bfloat16).contiguous().view(
            torch.uint8).reshape(*lead, 2 * rope)
    return out


def dequantize_fp8_ds_mla(records, dtype=None):
    """uint8 [..., 656 or 528] -> [..., 512 + rope] values (float64 by
    default): e4m3 * scale, then the rope. The reference a kernel on this
    cache is compared against."""
    torch = _torch()
    dtype = dtype or torch.float64
    lead = records.shape[:-1]
    rope = (records.shape[-1] - ROPE_OFFSET) // 2
    codes = records[..., :LATENT].contiguous().view(torch.float8_e4m3fn).to(dtype)
    scale = records[..., SCALES_OFFSET:ROPE_OFFSET].contiguous().view(torch.float32).to(dtype)
    latent = (codes.reshape(*lead, LATENT // GROUP, GROUP) * scale[..., None]).reshape(*lead, LATENT)
    if not rope:
        return latent
    rope_vals = records[..., ROPE_OFFSET:].contiguous().view(torch.bfloat16).to(dtype)
    return torch.cat([latent, rope_vals], dim=-1)

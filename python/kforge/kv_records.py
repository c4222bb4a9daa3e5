"""The DeepSeek-V4, V4.1 and nvfp4 KV cache records, for tests
and for engines that migrate a bf16 cache: reference quantizers and
dequantizers on torch tensors (fp8_ds_mla, V3.2's record, is kforge.fp8).

The layouts are vLLM's module note in
vllm/v1/attention/backends/mla/flashmla_sparse.py, cross-checked for V4
against FlashMLA's reference quantizer tests/quant.py (MODEL1_FP8Sparse);
the kernels read them in templates/kforge/sparse_mla/common/kv_format.cuh (sizes
in kv_layout.h; docs/DESIGN.md). A page holds `pb` tokens (64 in vLLM, any >= 1
here). ue8m0 e is the scale 2^(e - 127) (255: NaN).

  fp8_ds_mla_v4 (DeepSeek-V4), 584 B a token, width 512 (448 NoPE + 64
  RoPE). Page-blocked: the pb data rows, then the pb scale rows; the page is
  pb * 584 rounded up to a multiple of 576 (64 tokens: 37440).
    data row, 576 B at page + 576 i: [0, 448) columns 0..447 as e4m3fn,
      [448, 576) columns 448..511 as bf16 (not quantized)
    scale row, 8 B at page + 576 pb + 8 i: 7 ue8m0, scale g for columns
      [64 g, 64 g + 64); then a pad byte (0)
  mxfp8_ds_mla_v41 (DeepSeek-V4.1), 528 B, width 512, every column e4m3fn.
  Page-blocked the same way; the page is pb * 528 rounded up to 512.
    data row, 512 B at page + 512 i; scale row, 16 B at page + 512 pb +
    16 i: 16 ue8m0, scale g for columns [32 g, 32 g + 32)
  nvfp4_ds_mla, 352 B, width 576 (512 NoPE + 64 RoPE), one record per token
  (record i at page + 352 i; the page is pb * 352):
    [0, 256)    the 512 NoPE values as e2m1, two a byte: column 2j in the
                low nibble of byte j, 2j + 1 in the high one
    [256, 320)  the 64 RoPE values as e4m3fn, no scale
    [320, 352)  32 e4m3fn scales, block s for NoPE columns [16 s, 16 s + 16),
                permuted: block s's scale is byte 320 + 8 (s & 3) + (s >> 2)
    NoPE value = e2m1 * scale (no global scale)

A cache is handed to a kernel as FlashMLA and vLLM view it: uint8
[num_pages, pb, record bytes] with strides (page stride, record bytes, 1).
For the page-blocked records that per-token view is nominal: a kernel uses
its base pointer, page stride and record size, and the page layout above.
"""

RECORD_BYTES = {"fp8_ds_mla_v4": 584, "mxfp8_ds_mla_v41": 528, "nvfp4_ds_mla": 352}
LATENT_WIDTH = {"fp8_ds_mla_v4": 512, "mxfp8_ds_mla_v41": 512, "nvfp4_ds_mla": 576}
PAGE_BLOCKED = {"fp8_ds_mla_v4": True, "mxfp8_ds_mla_v41": True, "nvfp4_ds_mla": False}

E4M3_MAX = 448.0
E2M1_MAX = 6.0
# FlashMLA's quantizer clamps amax / 448 at this before taking the power of
# two at or above it: an all-zero group gets 2^-13 (ue8m0 114).
UE8M0_MIN_RATIO = 1e-4
PAGE_STRIDE_ALIGN = 16

# The page-blocked records: (data row bytes, scale row bytes, e4m3 columns,
# columns per ue8m0 scale). The page rounds up to a multiple of the data row.
_BLOCKED = {"fp8_ds_mla_v4": (576, 8, 448, 64), "mxfp8_ds_mla_v41": (512, 16, 512, 32)}

# nvfp4_ds_mla: byte offsets in the record and the scale permutation.
NVFP4_NOPE = 512
NVFP4_BLOCK = 16
NVFP4_ROPE_OFFSET = NVFP4_NOPE // 2
NVFP4_SCALES_OFFSET = NVFP4_ROPE_OFFSET + 64
# Block s's scale at byte NVFP4_SCALES_OFFSET + _NVFP4_BYTE_OF_BLOCK[s]; the
# inverse, byte p holds block _NVFP4_BLOCK_AT_BYTE[p] (s = 4 (p % 8) + p // 8).
_NVFP4_BYTE_OF_BLOCK = [8 * (s & 3) + (s >> 2) for s in range(32)]
_NVFP4_BLOCK_AT_BYTE = [4 * (p % 8) + p // 8 for p in range(32)]
# e4m3fn 1.0 (exponent 7 = the bias, mantissa 0): an all-zero block's scale.
_E4M3_ONE = 0x38
_E4M3_MAX_CODE = 0x7E  # 448; 0x7f is NaN

# e2m1 magnitudes by code (bit 3 is the sign), and the rounding boundaries
# between consecutive codes, each with whether a value exactly on it rounds
# up: ties go to the even code (mantissa bit 0), so 0.25 -> 0, 0.75 -> 1.0,
# 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_BOUNDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False),
                (3.5, True), (5.0, False))


def record_name(kv_cache_dtype):
    """This module's name for a KvCacheDtype value ("fp8_ds_mla_v4", ...),
    from the enum's own name in spec.proto (KV_CACHE_DTYPE_FP8_DS_MLA_V4);
    None for bf16, fp8_ds_mla and any other dtype."""
    from kforge._proto import pb
    enum = pb().spec_pb2.KvCacheDtype
    if int(kv_cache_dtype) not in enum.values():
        return None
    name = enum.Name(int(kv_cache_dtype)).lower().removeprefix("kv_cache_dtype_")
    return name if name in RECORD_BYTES else None


def _torch():
    import torch  # an engine dependency, not the package's
    return torch


def _check_name(kv_dtype):
    if kv_dtype not in RECORD_BYTES:
        raise ValueError(f"kv_dtype: got {kv_dtype!r}, supported "
                         f"{', '.join(sorted(RECORD_BYTES))} (fp8_ds_mla: kforge.fp8)")


def page_bytes(kv_dtype, page_block):
    """The bytes of one page of `page_block` tokens, as vLLM allocates it:
    page_block * record bytes, rounded up to a whole data row for the
    page-blocked records."""
    _check_name(kv_dtype)
    if isinstance(page_block, bool) or not isinstance(page_block, int) or page_block < 1:
        raise ValueError(f"page_block: got {page_block!r}, expected an int >= 1")
    n = page_block * RECORD_BYTES[kv_dtype]
    if not PAGE_BLOCKED[kv_dtype]:
        return n
    row = _BLOCKED[kv_dtype][0]
    return -(-n // row) * row


def _ue8m0_quantize(torch, x, group):
    """x float32 [..., n] -> (e4m3fn codes uint8 [..., n], ue8m0 uint8
    [..., n / group]). Per group the scale is the power of two at or above
    max(amax / 448, 1e-4), as FlashMLA's 2^ceil(log2(.)), taken from the
    float's bits (exact where a log2 may be an ulp off)."""
    lead, n = x.shape[:-1], x.shape[-1]
    g = x.reshape(*lead, n // group, group)
    ratio = torch.clamp_min(g.abs().amax(dim=-1) / E4M3_MAX, UE8M0_MIN_RATIO)
    bits = ratio.contiguous().view(torch.int32)  # positive and normal
    # The biased exponent, one more where the mantissa is not 0: 127 +
    # ceil(log2(ratio)), ue8m0's byte; >= 114 after the clamp.
    e = ((bits >> 23) + ((bits & 0x7FFFFF) != 0).to(torch.int32)).clamp(0, 254)
    scale = (e << 23).view(torch.float32)  # 2^(e - 127), exact (e >= 1)
    codes = (g / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes.view(torch.uint8).reshape(*lead, n), e.to(torch.uint8)


def _ue8m0_value(torch, e, dtype):
    """ue8m0 bytes -> 2^(e - 127) in dtype (exact: built as float64 bits,
    e + 896 the float64 biased exponent); 255 is NaN."""
    s = ((e.long() + (1023 - 127)) << 52).view(torch.float64)
    s = torch.where(e == 255, torch.full_like(s, float("nan")), s)
    return s.to(dtype)


def _e4m3_at_or_above(torch, target):
    """float32 >= 0 -> the smallest e4m3fn code (uint8) whose value is >=
    target, 448 at most: round to nearest, then one code up where that fell
    below (positive e4m3fn codes are ordered as their values)."""
    t = target.clamp(max=E4M3_MAX)
    code = t.to(torch.float8_e4m3fn)
    below = code.float() < t
    code = code.view(torch.uint8)
    return torch.where(below & (code < _E4M3_MAX_CODE), code + 1, code)


def _e2m1_encode(torch, v):
    """float32 -> e2m1 codes (uint8, sign in bit 3): round to nearest, ties
    to the even code, magnitudes clamped at 6; a value rounding to 0 is +0."""
    a = v.abs().clamp(max=E2M1_MAX)
    code = torch.zeros_like(a, dtype=torch.uint8)
    for bound, tie_up in _E2M1_BOUNDS:
        code += (a >= bound if tie_up else a > bound).to(torch.uint8)
    negative = ((v < 0) & (code > 0)).to(torch.uint8)
    return code | (negative << 3)


_KV_DTYPES = ("bfloat16", "float16", "float32", "float64")


def quantize_kv_records(kv, kv_dtype, *, page_stride=None):
    """kv [num_pages, page_block, width] (bf16, fp16, fp32 or fp64; width
    512, or 576 for nvfp4_ds_mla) -> the uint8 view [num_pages, page_block,
    record bytes], strides (page_stride, record bytes, 1), of a fresh buffer
    of num_pages * page_stride bytes holding the pages laid out as the
    module note says (bytes outside the layout are 0). page_stride defaults
    to page_bytes(kv_dtype, page_block); it must be at least that and a
    multiple of 16. Scales as the module note says: V4 / V4.1 the power of
    two at or above max(amax / 448, 1e-4) per group; nvfp4 the smallest
    e4m3 at or above amax / 6 per block (1.0 for an all-zero block)."""
    torch = _torch()
    _check_name(kv_dtype)
    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"kv: expected a torch.Tensor, got {type(kv).__name__}")
    if str(kv.dtype).replace("torch.", "") not in _KV_DTYPES:
        raise TypeError(f"kv: dtype {kv.dtype}, expected one of {', '.join(_KV_DTYPES)}")
    if kv.dim() != 3:
        raise ValueError(f"kv: shape {list(kv.shape)}, expected [num_pages, page_block, width]")
    num_pages, pb, width = kv.shape
    if width != LATENT_WIDTH[kv_dtype]:
        raise ValueError(f"kv: last dim {width}, {kv_dtype} holds {LATENT_WIDTH[kv_dtype]}")
    minimum = page_bytes(kv_dtype, pb)
    if page_stride is None:
        page_stride = minimum
    if isinstance(page_stride, bool) or not isinstance(page_stride, int):
        raise TypeError(f"page_stride: got {page_stride!r}, expected an int")
    if page_stride < minimum or page_stride % PAGE_STRIDE_ALIGN:
        raise ValueError(f"page_stride: got {page_stride}, must be >= {minimum} (a page of {pb} "
                         f"{kv_dtype} records) and a multiple of {PAGE_STRIDE_ALIGN}")
    record = RECORD_BYTES[kv_dtype]
    buf = torch.zeros(num_pages, page_stride, dtype=torch.uint8, device=kv.device)
    x = kv.float()
    if PAGE_BLOCKED[kv_dtype]:
        data_bytes, scale_bytes, e4m3_cols, group = _BLOCKED[kv_dtype]
        codes, exps = _ue8m0_quantize(torch, x[..., :e4m3_cols], group)
        # Views into the page: the data rows, then the scale rows.
        data = buf[:, :pb * data_bytes].view(num_pages, pb, data_bytes)
        scales = buf[:, pb * data_bytes:pb * (data_bytes + scale_bytes)].view(
            num_pages, pb, scale_bytes)
        data[..., :e4m3_cols] = codes
        if e4m3_cols < width:  # V4: the last 64 columns as bf16
            data[..., e4m3_cols:] = kv[..., e4m3_cols:].to(torch.bfloat16).contiguous().view(
                torch.uint8)
        scales[..., :exps.shape[-1]] = exps  # V4's pad byte stays 0
    else:
        rec = buf[:, :pb * record].view(num_pages, pb, record)
        nope = x[..., :NVFP4_NOPE].reshape(num_pages, pb, NVFP4_NOPE // NVFP4_BLOCK, NVFP4_BLOCK)
        amax = nope.abs().amax(dim=-1)
        sc = _e4m3_at_or_above(torch, amax / E2M1_MAX)
        sc = torch.where(amax > 0, sc, torch.full_like(sc, _E4M3_ONE))
        scale = sc.view(torch.float8_e4m3fn).float()
        codes = _e2m1_encode(torch, nope / scale[..., None]).reshape(num_pages, pb, NVFP4_NOPE)
        rec[..., :NVFP4_ROPE_OFFSET] = codes[..., 0::2] | (codes[..., 1::2] << 4)
        rec[..., NVFP4_ROPE_OFFSET:NVFP4_SCALES_OFFSET] = x[..., NVFP4_NOPE:].clamp(
            -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
        at_byte = torch.tensor(_NVFP4_BLOCK_AT_BYTE, device=kv.device)
        rec[..., NVFP4_SCALES_OFFSET:] = sc[..., at_byte]
    return torch.as_strided(buf, (num_pages, pb, record), (page_stride, record, 1))


def _pages(torch, records, kv_dtype):
    """The bytes of each page under a [num_pages, page_block, record] view,
    as [num_pages, page_block * record] (through the view's storage, from
    its storage offset, at its page stride), and page_block."""
    _check_name(kv_dtype)
    if not isinstance(records, torch.Tensor):
        raise TypeError(f"records: expected a torch.Tensor, got {type(records).__name__}")
    if records.dtype != torch.uint8:
        raise TypeError(f"records: dtype {records.dtype}, expected torch.uint8")
    record = RECORD_BYTES[kv_dtype]
    if records.dim() != 3 or records.shape[-1] != record:
        raise ValueError(f"records: shape {list(records.shape)}, a {kv_dtype} cache is "
                         f"[num_pages, page_block, {record}]")
    num_pages, pb, _ = records.shape
    span = pb * record  # what a page's layout covers (the page may be longer)
    if (records.stride(2) != 1 or (pb > 1 and records.stride(1) != record) or
            (num_pages > 1 and records.stride(0) < span)):
        raise ValueError(f"records: strides {list(records.stride())}, a {kv_dtype} cache has "
                         f"(page stride >= {span}, {record}, 1)")
    return torch.as_strided(records, (num_pages, span), (records.stride(0), 1)), pb


def _dequantize(records, kv_dtype, dtype):
    """The values of a records view in dtype, each formed once in dtype:
    e4m3 * 2^(e - 127), V4's bf16 columns as they are, e2m1 * e4m3 scale,
    nvfp4's e4m3 rope."""
    torch = _torch()
    pages, pb = _pages(torch, records, kv_dtype)
    num_pages = pages.shape[0]
    if PAGE_BLOCKED[kv_dtype]:
        data_bytes, scale_bytes, e4m3_cols, group = _BLOCKED[kv_dtype]
        data = pages[:, :pb * data_bytes].reshape(num_pages, pb, data_bytes)
        exps = pages[:, pb * data_bytes:].reshape(num_pages, pb, scale_bytes)
        codes = data[..., :e4m3_cols].contiguous().view(torch.float8_e4m3fn).to(dtype)
        scale = _ue8m0_value(torch, exps[..., :e4m3_cols // group], dtype)
        values = (codes.reshape(num_pages, pb, -1, group) * scale[..., None]).reshape(
            num_pages, pb, e4m3_cols)
        if e4m3_cols == LATENT_WIDTH[kv_dtype]:
            return values
        rest = data[..., e4m3_cols:].contiguous().view(torch.bfloat16).to(dtype)
        return torch.cat([values, rest], dim=-1)
    rec = pages.reshape(num_pages, pb, RECORD_BYTES[kv_dtype])
    packed = rec[..., :NVFP4_ROPE_OFFSET].long()
    # Byte j -> columns 2j (low nibble), 2j + 1 (high nibble).
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(num_pages, pb, NVFP4_NOPE)
    magnitude = torch.tensor(_E2M1, dtype=dtype, device=rec.device)[codes & 7]
    e2m1 = torch.where(codes >= 8, -magnitude, magnitude)
    byte_of_block = torch.tensor(_NVFP4_BYTE_OF_BLOCK, device=rec.device) + NVFP4_SCALES_OFFSET
    scale = rec[..., byte_of_block].contiguous().view(torch.float8_e4m3fn).to(dtype)
    nope = (e2m1.reshape(num_pages, pb, -1, NVFP4_BLOCK) * scale[..., None]).reshape(
        num_pages, pb, NVFP4_NOPE)
    rope = rec[..., NVFP4_ROPE_OFFSET:NVFP4_SCALES_OFFSET].contiguous().view(
        torch.float8_e4m3fn).to(dtype)
    return torch.cat([nope, rope], dim=-1)


def dequantize_kv_records(records, kv_dtype, dtype=None):
    """records (a view as quantize_kv_records returns, or an engine's cache
    viewed the same way: uint8 [num_pages, page_block, record bytes],
    strides (page stride, record bytes, 1); read through its storage from
    its storage offset) -> [num_pages, page_block, width] values in `dtype`
    (float64 by default). The reference a kernel on this cache is compared
    against."""
    torch = _torch()
    return _dequantize(records, kv_dtype, dtype or torch.float64)


def bf16_dequantize_kv_records(records, kv_dtype):
    """The values a kernel that dequantizes in fp32 and rounds once to bf16
    sees (kv_format.cuh): dequantize_kv_records in float32, then to
    bfloat16; returned as float64."""
    torch = _torch()
    return _dequantize(records, kv_dtype, torch.float32).to(torch.bfloat16).double()

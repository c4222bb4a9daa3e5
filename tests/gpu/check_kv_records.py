#!/usr/bin/env python3
"""Check of kforge.kv_records, the DeepSeek-V4 / V4.1 / nvfp4 KV cache
records' quantizers and dequantizers, on torch (GPU or CPU):
  - page sizes as vLLM allocates pages;
  - layout: for chosen tokens (page 1 or 2, not the first) with values
    whose codes are known, the exact bytes at the offsets vLLM's module note
    and FlashMLA's quantizer give (data rows then scale rows within a page,
    nvfp4's nibble order and permuted scales), the neighbouring tokens' and
    pages' bytes untouched, bytes outside the layout 0; the expected bytes
    are built here by hand, not with the module's helpers;
  - hand-built caches: bytes written here, read back through a view with a
    storage offset (as an engine's cache), ue8m0 255 reading NaN;
  - round trips of random values (magnitudes 1e-3, 1, 300; an all-zero
    token and group; 64- and 5-token pages; a page stride above the
    least) within each format's rounding, per element;
  - the errors a wrong call raises.

Usage: PYTHONPATH=python tests/gpu/check_kv_records.py [--device cuda|cpu]
Prints one line per check and "N passed, M failed"; exit 1 on a failure.
Skips (prints SKIP, exit 0) without PyTorch.
"""

import argparse
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

V4, V41, NVFP4 = "fp8_ds_mla_v4", "mxfp8_ds_mla_v41", "nvfp4_ds_mla"


# Independent encoders for exactly representable values (plain Python).

def e4m3_value(code):
    """The value of a positive e4m3fn code 0..0x7e (bias 7, 3 mantissa bits,
    subnormals at exponent 0)."""
    e, m = code >> 3, code & 7
    return m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


def e4m3_byte(x):
    """The e4m3fn byte of x, which must be exactly representable."""
    for code in range(0x7F):
        if e4m3_value(code) == abs(x):
            return code | (0x80 if x < 0 else 0)
    raise ValueError(f"{x} is not an e4m3 value")


E2M1 = {0.0: 0, 0.5: 1, 1.0: 2, 1.5: 3, 2.0: 4, 3.0: 5, 4.0: 6, 6.0: 7}


def e2m1_nibble(x):
    """The e2m1 code of x, which must be exactly representable and not -0."""
    return E2M1[abs(x)] | (8 if x < 0 else 0)


def bf16_bytes(x):
    """The two little-endian bytes of x as bf16 (x exact in bf16)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    assert bits & 0xFFFF == 0, x
    return [(bits >> 16) & 0xFF, bits >> 24]


class Failure(Exception):
    pass


def expect(cond, what):
    if not cond:
        raise Failure(what)


def expect_eq(got, want, what):
    if got != want:
        raise Failure(f"{what}: got {got!r}, expected {want!r}")


def build_checks(torch, dev):
    from kforge import kv_records as kr
    checks = []

    def check(name):
        def register(fn):
            checks.append((name, fn))
            return fn
        return register

    def whole_buffer(rec, page_stride):
        """Every byte of the buffer under a fresh quantize_kv_records view."""
        n = rec.shape[0] * page_stride
        return torch.as_strided(rec, (n,), (1,), rec.storage_offset()).cpu().tolist()

    def check_view(rec, num_pages, pb, record, page_stride):
        expect_eq(rec.dtype, torch.uint8, "records dtype")
        expect_eq(list(rec.shape), [num_pages, pb, record], "records shape")
        expect_eq(list(rec.stride()), [page_stride, record, 1], "records strides")
        expect_eq(rec.untyped_storage().nbytes(), num_pages * page_stride, "buffer bytes")

    @check("page_bytes: the page sizes vLLM allocates")
    def _():
        for name, pb, want in ((V4, 64, 37440), (V41, 64, 33792), (NVFP4, 64, 22528),
                               (V4, 5, 3456), (V41, 5, 3072), (NVFP4, 5, 1760), (V4, 1, 1152),
                               (V41, 1, 1024), (V4, 1024, 598464)):
            expect_eq(kr.page_bytes(name, pb), want, f"page_bytes({name}, {pb})")
        expect_eq(kr.RECORD_BYTES, {V4: 584, V41: 528, NVFP4: 352}, "RECORD_BYTES")
        expect_eq(kr.LATENT_WIDTH, {V4: 512, V41: 512, NVFP4: 576}, "LATENT_WIDTH")
        expect_eq(kr.PAGE_BLOCKED, {V4: True, V41: True, NVFP4: False}, "PAGE_BLOCKED")

    @check("fp8_ds_mla_v4 layout: data rows, bf16 columns, ue8m0 rows after them, pad 0")
    def _():
        zero_scale = 127 - 13  # an all-zero group: amax / 448 clamped to 1e-4 -> 2^-13
        for pb in (64, 5):
            stride = kr.page_bytes(V4, pb) + 64
            x = torch.zeros(3, pb, 512, device=dev)
            t = x[1, 3]
            # group 0 (columns 0..63): amax 28 -> 28 / 448 = 2^-4, ue8m0 123
            t[0], t[1], t[5] = 28.0, -1.0, 0.1875   # /2^-4: 448, -16, 3
            # group 1 all zero; group 2: amax 3 -> 3 / 448 -> 2^-7 (120)
            t[128] = 3.0                            # 384
            # group 6 (384..447): 1536 / 448 = 3.43 -> 2^2 (129)
            t[447] = -1536.0                        # -384
            t[450], t[511] = 2.5, -3.140625         # bf16 columns (exact)
            rec = kr.quantize_kv_records(x, V4, page_stride=stride)
            check_view(rec, 3, pb, 584, stride)
            raw = whole_buffer(rec, stride)
            data = stride + 576 * 3
            want = {0: e4m3_byte(448.0), 1: e4m3_byte(-16.0), 5: e4m3_byte(3.0),
                    128: e4m3_byte(384.0), 447: e4m3_byte(-384.0)}
            for col in range(448):
                expect_eq(raw[data + col], want.get(col, 0), f"pb {pb}: e4m3 byte {col}")
            rope = [0] * 128
            rope[4:6] = bf16_bytes(2.5)
            rope[126:128] = bf16_bytes(-3.140625)
            expect_eq(raw[data + 448:data + 576], rope, f"pb {pb}: bf16 columns")
            scales = stride + 576 * pb + 8 * 3
            row = [123, zero_scale, 120, zero_scale, zero_scale, zero_scale, 129, 0]
            expect_eq(raw[scales:scales + 8], row, f"pb {pb}: scale row of page 1 token 3")
            for page in range(3):
                base = page * stride
                for tok in range(pb):
                    if (page, tok) == (1, 3):
                        continue
                    r = base + 576 * pb + 8 * tok
                    expect_eq(raw[r:r + 8], [zero_scale] * 7 + [0],
                              f"pb {pb}: scale row of page {page} token {tok}")
                    d = base + 576 * tok
                    expect(not any(raw[d:d + 576]), f"pb {pb}: data row of page {page} "
                           f"token {tok} not 0")
                expect(not any(raw[base + 584 * pb:base + stride]),
                       f"pb {pb}: page {page} past its layout not 0")
            back = kr.dequantize_kv_records(rec, V4)
            want_vals = torch.zeros_like(x, dtype=torch.float64)
            for col, v in ((0, 28.0), (1, -1.0), (5, 0.1875), (128, 3.0), (447, -1536.0),
                           (450, 2.5), (511, -3.140625)):
                want_vals[1, 3, col] = v
            expect(torch.equal(back, want_vals), f"pb {pb}: dequantized values")

    @check("mxfp8_ds_mla_v41 layout: 512 e4m3 data rows, then 16 ue8m0 per token")
    def _():
        zero_scale = 127 - 13
        for pb in (64, 5):
            stride = kr.page_bytes(V41, pb)
            x = torch.zeros(3, pb, 512, device=dev)
            t = x[2, 4]
            t[32], t[33] = 7.0, -0.4375    # group 1: 7 / 448 = 2^-6 (121): 448, -28
            t[480] = 2.0 ** -10            # group 15: 0.5 / 448 -> 2^-9 (118): 0.5
            t[511] = -0.5                  # -256
            rec = kr.quantize_kv_records(x, V41)
            check_view(rec, 3, pb, 528, stride)
            raw = whole_buffer(rec, stride)
            data = 2 * stride + 512 * 4
            want = {32: e4m3_byte(448.0), 33: e4m3_byte(-28.0), 480: e4m3_byte(0.5),
                    511: e4m3_byte(-256.0)}
            for col in range(512):
                expect_eq(raw[data + col], want.get(col, 0), f"pb {pb}: e4m3 byte {col}")
            scales = 2 * stride + 512 * pb + 16 * 4
            row = [zero_scale] * 16
            row[1], row[15] = 121, 118
            expect_eq(raw[scales:scales + 16], row, f"pb {pb}: scale row of page 2 token 4")
            for page in range(3):
                for tok in range(pb):
                    if (page, tok) != (2, 4):
                        r = page * stride + 512 * pb + 16 * tok
                        expect_eq(raw[r:r + 16], [zero_scale] * 16,
                                  f"pb {pb}: scale row of page {page} token {tok}")
                expect(not any(raw[page * stride + 528 * pb:(page + 1) * stride]),
                       f"pb {pb}: page {page} past its layout not 0")
            back = kr.dequantize_kv_records(rec, V41)
            for col, v in ((32, 7.0), (33, -0.4375), (480, 2.0 ** -10), (511, -0.5)):
                expect_eq(float(back[2, 4, col]), v, f"pb {pb}: column {col}")
            expect_eq(int((back != 0).sum()), 4, f"pb {pb}: nonzero values")

    @check("nvfp4_ds_mla layout: nibble order, ties to even, rope e4m3, permuted scales")
    def _():
        for pb in (64, 5):
            stride = kr.page_bytes(NVFP4, pb) + 32
            x = torch.zeros(3, pb, 576, device=dev)
            t = x[1, 3]
            # block 0: amax 6 -> scale 1.0; ties go to the even code
            block0 = [6.0, -0.5, 2.5, 0.25, 0.75, 1.25, 1.75, 3.5, 5.0, -3.0, 1.5, 0.2, 0, 0, 0, 0]
            codes0 = [6.0, -0.5, 2.0, 0.0, 1.0, 1.0, 2.0, 4.0, 4.0, -3.0, 1.5, 0.0, 0, 0, 0, 0]
            t[0:16] = torch.tensor(block0)
            t[80], t[81] = 12.0, 3.0       # block 5: scale 2 -> 6, 1.5
            # block 6: amax / 6 = 1.0625, a tie rounding to 1.0 < 1.0625: up to 1.125
            t[96], t[97] = 6.375, -1.125   # -> 6 (5.67 rounds to 6), -1
            t[112] = 6.6                   # block 7: 1.1 rounds to 1.125 -> 6 (5.87)
            t[144] = 24.0                  # block 9: scale 4 -> 6
            t[511] = -0.001                # block 31: 1.7e-4 -> 2^-9, the least e4m3: -0.5
            t[512], t[514], t[575] = -1.75, 2.0 ** -9, 448.0  # rope
            rec = kr.quantize_kv_records(x, NVFP4, page_stride=stride)
            check_view(rec, 3, pb, 352, stride)
            raw = whole_buffer(rec, stride)
            r = stride + 352 * 3
            nib = [0] * 512
            for col, q in enumerate(codes0):
                nib[col] = e2m1_nibble(q)
            nib[80], nib[81] = e2m1_nibble(6.0), e2m1_nibble(1.5)
            nib[96], nib[97] = e2m1_nibble(6.0), e2m1_nibble(-1.0)
            nib[112] = nib[144] = e2m1_nibble(6.0)
            nib[511] = e2m1_nibble(-0.5)
            packed = [nib[2 * j] | (nib[2 * j + 1] << 4) for j in range(256)]
            expect_eq(raw[r:r + 256], packed, f"pb {pb}: e2m1 bytes")
            # Spelled out: byte 0 = 6 (7) low, -0.5 (9) high; byte 4 = 4 (6), -3 (13).
            expect_eq(raw[r:r + 5], [0x97, 0x04, 0x22, 0x64, 0xD6], f"pb {pb}: bytes 0..4")
            rope = [0] * 64
            rope[0], rope[2], rope[63] = e4m3_byte(-1.75), 0x01, 0x7E
            expect_eq(raw[r + 256:r + 320], rope, f"pb {pb}: rope bytes")
            # Scale of block s at 320 + 8 (s & 3) + (s >> 2): block 5 -> 329,
            # 6 -> 337, 7 -> 345, 9 -> 330, 31 -> 351; the rest 1.0 (0x38).
            sc = [0x38] * 32
            sc[9], sc[17], sc[25], sc[10], sc[31] = 0x40, 0x39, 0x39, 0x48, 0x01
            expect_eq(raw[r + 320:r + 352], sc, f"pb {pb}: scale bytes")
            zero_record = [0] * 320 + [0x38] * 32
            for page in range(3):
                for tok in range(pb):
                    if (page, tok) != (1, 3):
                        q = page * stride + 352 * tok
                        expect_eq(raw[q:q + 352], zero_record,
                                  f"pb {pb}: record of page {page} token {tok}")
                expect(not any(raw[page * stride + 352 * pb:(page + 1) * stride]),
                       f"pb {pb}: page {page} past its layout not 0")
            back = kr.dequantize_kv_records(rec, NVFP4)
            want = torch.zeros_like(x, dtype=torch.float64)
            want[1, 3, 0:16] = torch.tensor(codes0, dtype=torch.float64)
            for col, v in ((80, 12.0), (81, 3.0), (96, 6.75), (97, -1.125), (112, 6.75),
                           (144, 24.0), (511, -2.0 ** -10), (512, -1.75), (514, 2.0 ** -9),
                           (575, 448.0)):
                want[1, 3, col] = v
            expect(torch.equal(back, want), f"pb {pb}: dequantized values, max diff "
                   f"{float((back - want).abs().max()):.3g}")

    @check("hand-built caches: dequantized through a view with a storage offset")
    def _():
        pb, pages, offset = 3, 2, 48
        for name in (V4, V41, NVFP4):
            record = kr.RECORD_BYTES[name]
            stride = kr.page_bytes(name, pb) + 16
            raw = torch.zeros(offset + pages * stride, dtype=torch.uint8)
            want = torch.zeros(pages, pb, kr.LATENT_WIDTH[name], dtype=torch.float64)
            p = offset + stride  # page 1; token 2 below
            if name == NVFP4:
                q = p + 352 * 2
                raw[q + 320 + 8 * 0 + 0] = e4m3_byte(1.0)    # block 0's scale
                raw[q + 3] = 0x5A                            # columns 6, 7: -1, 3
                raw[q + 4] = 0x1E                            # columns 8, 9: -4, 0.5
                raw[q + 320 + 8 * 1 + 0] = e4m3_byte(0.75)   # block 1's scale
                raw[q + 10] = 0x30                           # columns 20, 21: 0, 1.5
                raw[q + 320 + 8 * 0 + 1] = e4m3_byte(-2.0)   # block 4's scale
                raw[q + 33] = 0x07                           # columns 66, 67: 6, 0
                raw[q + 256 + 5] = e4m3_byte(-0.375)         # rope 5
                for col, v in ((6, -1.0), (7, 3.0), (8, -4.0), (9, 0.5), (21, 1.125),
                               (66, -12.0), (512 + 5, -0.375)):
                    want[1, 2, col] = v
            else:
                data, srow, group = (576, 8, 64) if name == V4 else (512, 16, 32)
                d, s = p + data * 2, p + data * pb + srow * 2
                raw[d + 0] = e4m3_byte(-448.0)
                raw[s + 0] = 127 + 3                         # group 0: 2^3
                raw[d + group + 1] = 0x01                    # 2^-9, the least subnormal
                raw[s + 1] = 127 - 20                        # group 1: 2^-20
                raw[d + 2 * group] = e4m3_byte(1.0)
                raw[s + 2] = 255                             # group 2: NaN
                want[1, 2, 0] = -448.0 * 8
                want[1, 2, group + 1] = 2.0 ** -29
                want[1, 2, 2 * group:3 * group] = float("nan")
                if name == V4:
                    raw[d + 448 + 2:d + 448 + 4] = torch.tensor(bf16_bytes(-0.15625),
                                                                dtype=torch.uint8)
                    want[1, 2, 449] = -0.15625
            raw = raw.to(dev)
            view = torch.as_strided(raw, (pages, pb, record), (stride, record, 1), offset)
            got = kr.dequantize_kv_records(view, name).cpu()
            same = (got == want) | (got.isnan() & want.isnan())
            expect(bool(same.all()), f"{name}: wrong at "
                   f"{same.logical_not().nonzero()[:4].tolist()}")
            expect(torch.equal(kr.dequantize_kv_records(view[1:], name).cpu().nan_to_num(),
                               got[1:].nan_to_num()), f"{name}: view[1:] (storage offset)")

    def round_trip_bound(name, x):
        """Per-element bound on |dequantized - x| (float64) for random x."""
        x = x.double()
        if name == NVFP4:
            nope = x[..., :512].reshape(*x.shape[:2], 32, 16)
            amax = nope.abs().amax(dim=-1, keepdim=True)
            # scale s: the least e4m3 >= amax / 6, so s < amax / 6 * 1.125 + 2^-9;
            # q = |x| / s <= u = 6 |x| / amax; e2m1's half step at q is 0.25
            # below 2, 0.5 below 4, then 1.
            u = 6 * nope.abs() / amax.clamp_min(1e-30)
            half = 0.25 + 0.25 * (u >= 2).double() + 0.5 * (u >= 4).double()
            b = half * (amax / 6 * 1.125 + 2.0 ** -9) * (1 + 2.0 ** -16)
            rope = x[..., 512:].clamp(-448, 448)
            return torch.cat([b.reshape(*x.shape[:2], 512),
                              rope.abs() * 2.0 ** -4 + 2.0 ** -10], dim=-1), rope
        cols, group = (448, 64) if name == V4 else (512, 32)
        g = x[..., :cols].reshape(*x.shape[:2], -1, group)
        amax = g.abs().amax(dim=-1, keepdim=True)
        # scale s, a power of two, < 2 max(amax / 448, 1e-4); e4m3's half ulp
        # is 2^-4 of |x / s| for normals, 2^-10 of s in the subnormals.
        s = 2 * torch.clamp_min(amax / 448, 1e-4)
        b = (g.abs() * 2.0 ** -4 + s * 2.0 ** -10).reshape(*x.shape[:2], cols)
        if cols == 512:
            return b, None
        return torch.cat([b, x[..., cols:].abs() * 2.0 ** -8], dim=-1), None  # bf16

    @check("round trips: random values within each format's rounding, per element")
    def _():
        gen = torch.Generator(device=dev)
        gen.manual_seed(1234)
        for name in (V4, V41, NVFP4):
            width = kr.LATENT_WIDTH[name]
            group = {V4: 64, V41: 32, NVFP4: 16}[name]
            for pb, extra in ((64, 0), (5, 48), (64, 4096)):
                stride = kr.page_bytes(name, pb) + extra
                for mag in (1e-3, 1.0, 300.0):
                    x = torch.randn(3, pb, width, generator=gen, device=dev) * mag
                    x[1, 2] = 0                   # an all-zero token
                    x[0, 0, group:2 * group] = 0  # an all-zero group / block
                    for kv in (x, x.to(torch.bfloat16)):
                        what = f"{name} pb {pb} stride +{extra} x{mag} {kv.dtype}"
                        rec = kr.quantize_kv_records(kv, name, page_stride=stride)
                        check_view(rec, 3, pb, kr.RECORD_BYTES[name], stride)
                        back = kr.dequantize_kv_records(rec, name)
                        expect_eq(back.dtype, torch.float64, f"{what}: dtype")
                        expect_eq(list(back.shape), [3, pb, width], f"{what}: shape")
                        expect(bool((back[1, 2] == 0).all()), f"{what}: zero token not 0")
                        expect(bool((back[0, 0, group:2 * group] == 0).all()),
                               f"{what}: zero group not 0")
                        bound, clamped = round_trip_bound(name, kv.float())
                        ref = kv.double()
                        if clamped is not None:
                            ref = torch.cat([ref[..., :512], clamped], dim=-1)
                        err = (back - ref).abs()
                        bad = err > bound
                        expect(not bool(bad.any()), f"{what}: {int(bad.sum())} values off, "
                               f"first at {bad.nonzero()[0].tolist() if bad.any() else None}, "
                               f"max err / bound {float((err / bound).max()):.3g}")
                        raw = torch.as_strided(rec, (3, stride), (stride, 1))
                        expect(not bool(raw[:, kr.RECORD_BYTES[name] * pb:].any()),
                               f"{what}: bytes past the layout not 0")
                        if name == V4:
                            pad = raw[:, 576 * pb:584 * pb].reshape(3, pb, 8)[..., 7]
                            expect(not bool(pad.any()), f"{what}: scale pad bytes not 0")
                        b16 = kr.bf16_dequantize_kv_records(rec, name)
                        expect_eq(b16.dtype, torch.float64, f"{what}: bf16 dtype")
                        # e4m3 * 2^k and e2m1 * e4m3 are exact in bf16 here.
                        expect(torch.equal(b16, back), f"{what}: bf16 view differs")

    @check("errors: wrong names, shapes, dtypes and strides raise, naming the argument")
    def _():
        x = torch.zeros(2, 4, 512, device=dev)
        y = torch.zeros(2, 4, 576, device=dev)
        rec = kr.quantize_kv_records(x, V4)
        cases = (
            (lambda: kr.quantize_kv_records(x, "fp8_ds_mla_v5"), ValueError, "kv_dtype"),
            (lambda: kr.quantize_kv_records(x, "fp4"), ValueError, "nvfp4_ds_mla"),
            (lambda: kr.page_bytes("bf16", 64), ValueError, "kv_dtype"),
            (lambda: kr.page_bytes(V4, 0), ValueError, "page_block"),
            (lambda: kr.quantize_kv_records(x, NVFP4), ValueError, "last dim"),
            (lambda: kr.quantize_kv_records(y, V4), ValueError, "last dim"),
            (lambda: kr.quantize_kv_records(x[0], V4), ValueError, "kv"),
            (lambda: kr.quantize_kv_records(x.int(), V4), TypeError, "kv"),
            (lambda: kr.quantize_kv_records(x.tolist(), V4), TypeError, "kv"),
            (lambda: kr.quantize_kv_records(x, V4, page_stride=8), ValueError, "page_stride"),
            (lambda: kr.quantize_kv_records(x, V4, page_stride=kr.page_bytes(V4, 4) + 8),
             ValueError, "page_stride"),
            (lambda: kr.quantize_kv_records(x, V4, page_stride=kr.page_bytes(V4, 4) - 16),
             ValueError, "page_stride"),
            (lambda: kr.dequantize_kv_records(x, V4), TypeError, "uint8"),
            (lambda: kr.dequantize_kv_records(rec, V41), ValueError, "records"),
            (lambda: kr.dequantize_kv_records(rec, "v4"), ValueError, "kv_dtype"),
            (lambda: kr.dequantize_kv_records(rec[:, ::2], V4), ValueError, "strides"),
            (lambda: kr.bf16_dequantize_kv_records(rec[0], V4), ValueError, "records"),
        )
        for i, (call, kind, word) in enumerate(cases):
            try:
                call()
            except kind as e:
                expect(word in str(e), f"case {i}: {word!r} not in {e}")
            except Exception as e:  # noqa: BLE001 - the wrong kind, reported
                raise Failure(f"case {i}: {type(e).__name__} ({e}), expected {kind.__name__}")
            else:
                raise Failure(f"case {i}: no {kind.__name__} (expected one naming {word!r})")
        # The message lists the supported names.
        try:
            kr.quantize_kv_records(x, "nope")
        except ValueError as e:
            expect(all(n in str(e) for n in (V4, V41, NVFP4)), f"names not listed: {e}")

    return checks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="cuda (the default where present) or cpu")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        return 0
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device {dev}, torch {torch.__version__}")
    passed = failed = 0
    for name, fn in build_checks(torch, dev):
        try:
            fn()
            passed += 1
            print(f"ok    {name}")
        except Exception as e:  # noqa: BLE001 - a check's failure, reported
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

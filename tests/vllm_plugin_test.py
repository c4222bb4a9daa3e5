#!/usr/bin/env python3
"""What of the vLLM plugin (integrations/vllm) can be checked without vLLM,
for ctest (VllmPluginTest): vLLM is 9.4 GB, so its own tier is
scripts/test_vllm_plugin.sh.

  - packaging: both pyproject.toml files parse; kforge-vllm declares its
    entry point in vllm.general_plugins (kforge_vllm:register, which
    exists) and depends on kforge; kforge's version is the CMake project's;
  - importing kforge_vllm and kforge_vllm.core imports no vLLM;
  - KFORGE_VLLM_TAKE_OVER's values;
  - core.attention_spec: GLM-5 TP8 and DeepSeek-V3.2 shapes, bf16 and
    fp8_ds_mla (arbitrary scales, as vLLM writes them), NoPE models (head
    size 512: 512-wide bf16 rows, or vLLM's 656-byte fp8_ds_mla records
    read as 512 + 64), and the errors for a cache dtype or a shape kforge
    does not build, naming the field;
  - core.page_view: kforge's slot numbering over the view it makes of a
    layer's cache is vLLM's (block * block_stride_rows + offset) for
    layers laid out apart and for blocks interleaved with other layers';
    caches it cannot view are refused by name;
  - the matrix the backend logs at start, fed to `kforge prebuild`, gives a
    bundle that serves exactly the spec the backend asks for (the scale's
    float32 value included), so a prebuilt engine compiles nothing.

Usage: vllm_plugin_test.py PATH/TO/kforge REPO_ROOT
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import traceback

KFORGE, ROOT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "integrations", "vllm"))

import kforge  # noqa: E402
import kforge_vllm  # noqa: E402
from kforge_vllm import core  # noqa: E402

failures = []
checks = 0


def check(name):
    def run(fn):
        global checks
        checks += 1
        try:
            fn()
            print(f"ok   {name}")
        except Exception:
            failures.append(name)
            print(f"FAIL {name}\n{traceback.format_exc()}")
        return fn
    return run


def read_toml(*path):
    with open(os.path.join(ROOT, *path), "rb") as f:
        return tomllib.load(f)


@check("packaging metadata")
def _():
    plugin = read_toml("integrations", "vllm", "pyproject.toml")
    package = read_toml("python", "pyproject.toml")
    assert plugin["project"]["name"] == "kforge-vllm"
    eps = plugin["project"]["entry-points"]["vllm.general_plugins"]
    assert eps == {"kforge": "kforge_vllm:register"}, eps
    module, func = eps["kforge"].split(":")
    assert callable(getattr(sys.modules[module], func))
    assert any(re.match(r"kforge\b", d) for d in plugin["project"]["dependencies"])
    assert not any(d.startswith("vllm") for d in plugin["project"]["dependencies"]), \
        "the plugin must not make pip replace the user's vLLM"
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cmake_version = re.search(r"project\(kforge VERSION ([0-9.]+)", f.read()).group(1)
    assert package["project"]["name"] == "kforge"
    # The version is CMake's: the wheel's backend reads it from project(kforge
    # VERSION ...), as the build writes it into kforge/_version.py.
    assert "version" in package["project"].get("dynamic", []), package["project"]
    assert package["build-system"]["build-backend"] == "scikit_build_core.build"
    version = package["tool"]["scikit-build"]["metadata"]["version"]
    assert version["input"] == "../CMakeLists.txt", version
    assert re.search(version["regex"], f"project(kforge VERSION {cmake_version}")
    assert kforge.__version__ == cmake_version, (kforge.__version__, cmake_version)
    # The extras the plugin asks for (kforge[cuda]) are kforge's.
    extras = {e for d in plugin["project"]["dependencies"]
              for m in [re.match(r"kforge\[([\w,]+)\]", d)] if m for e in m.group(1).split(",")}
    assert extras and extras <= set(package["project"]["optional-dependencies"]), extras
    # The installed kforge is what the CMake install lays out (the sources,
    # the message modules and the native library: cmake/PythonPackage.cmake).
    assert package["tool"]["scikit-build"]["cmake"]["define"]["KFORGE_PYTHON_PACKAGE"] == "ON"


@check("no vLLM imported")
def _():
    assert not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules), \
        [m for m in sys.modules if m.startswith("vllm")]


@check("KFORGE_VLLM_TAKE_OVER values")
def _():
    on, off = kforge_vllm.take_over_requested, lambda e: not kforge_vllm.take_over_requested(e)
    assert off({}) and off({"KFORGE_VLLM_TAKE_OVER": "0"}) and off({"KFORGE_VLLM_TAKE_OVER": ""})
    assert on({"KFORGE_VLLM_TAKE_OVER": "1"}) and on({"KFORGE_VLLM_TAKE_OVER": "On"})
    try:
        kforge_vllm.take_over_requested({"KFORGE_VLLM_TAKE_OVER": "yes please"})
    except ValueError as e:
        assert "KFORGE_VLLM_TAKE_OVER" in str(e)
    else:
        raise AssertionError("a bad value was accepted")


GLM5_TP8 = dict(num_heads=8, kv_lora_rank=512, rope_dim=64, topk=2048, page_size=64,
                softmax_scale=0.0625)
# vLLM's DeepSeek-V3.2 scale: 192^-0.5 * (0.1 ln 40 + 1)^2, a double.
DSV32_TP1 = dict(num_heads=128, kv_lora_rank=512, rope_dim=64, topk=2048, page_size=64,
                 softmax_scale=192 ** -0.5 * (0.1 * 3.6888794541139363 + 1) ** 2)


@check("attention_spec of GLM-5 and DeepSeek-V3.2")
def _():
    for shape in (GLM5_TP8, DSV32_TP1):
        for vllm_dtype, kv in (("auto", 1), ("bfloat16", 1), ("fp8_ds_mla", 2),
                               ("nvfp4_ds_mla", 5)):
            spec = core.attention_spec(cache_dtype=vllm_dtype, **shape)
            assert spec.num_q_heads == shape["num_heads"] and spec.topk == 2048
            assert spec.kv_cache_dtype == kv
            assert spec.kv_scale_format == (2 if kv == 2 else 0)  # arbitrary: vLLM's amax/448
            assert not spec.return_lse
            assert kforge.kv_row_bytes_for(spec) == {1: None, 2: 656, 5: 352}[kv]


@check("attention_spec of NoPE models (head size 512)")
def _():
    nope = dict(GLM5_TP8, rope_dim=0)
    bf16 = core.attention_spec(cache_dtype="auto", **nope)
    assert (bf16.kv_lora_rank, bf16.rope_dim, bf16.kv_cache_dtype) == (512, 0, 1), bf16
    assert bf16.HasField("rope_dim")  # NoPE on purpose, as kforge requires
    # vLLM writes a NoPE model's fp8_ds_mla records at 656 bytes with the
    # RoPE slot zero: a 512 + 64 spec reads them (the core pads q).
    fp8 = core.attention_spec(cache_dtype="fp8_ds_mla", **nope)
    assert (fp8.rope_dim, fp8.kv_cache_dtype, fp8.kv_scale_format) == (64, 2, 2), fp8
    assert kforge.kv_row_bytes_for(fp8) == 656
    # vLLM has no NoPE nvfp4_ds_mla record; kforge's needs the rope too.
    try:
        core.attention_spec(cache_dtype="nvfp4_ds_mla", **nope)
    except core.UnsupportedConfig as e:
        assert "rope_dim: got 0" in str(e), str(e)
    else:
        raise AssertionError("a NoPE nvfp4_ds_mla spec was accepted")


def vllm_address(block_stride, row, block, offset):
    """Where vLLM's slot block * block_stride_rows + offset lives, in
    elements from the layer's first row (sparse_utils.flat_kv_row_view)."""
    return (block * (block_stride // row) + offset) * row


@check("page_view numbers slots as vLLM does")
def _():
    for row in (576, 512, 656, 352):  # bf16 rows (elements) and records (bytes)
        page = 64 * row
        # Layers apart; blocks interleaved with 2 or 3 layers' pages.
        for block_stride in (page, 2 * page, 3 * page):
            num_blocks = 7
            shape, strides = core.page_view((num_blocks, 64, row), (block_stride, row, 1), 64)
            assert shape[1:] == (64, row) and strides[1:] == (row, 1), (shape, strides)
            for block in range(num_blocks):
                for offset in (0, 1, 63):
                    slot = block * (block_stride // row) + offset
                    page_index, in_page = divmod(slot, 64)
                    assert page_index < shape[0], (slot, shape)
                    assert page_index * strides[0] + in_page * strides[1] == \
                        vllm_address(block_stride, row, block, offset), (row, block_stride, slot)
            # The view ends with the layer's last block.
            assert (shape[0] - 1) * strides[0] == (num_blocks - 1) * block_stride
    bad = (
        (((4, 32, 576), (32 * 576, 576, 1)), "[num_blocks, 64, row]"),
        (((4, 64, 576, 1), (64 * 576, 576, 1, 1)), "[num_blocks, 64, row]"),
        (((4, 64, 576), (64 * 576 + 576, 576, 1)), "whole number of 64-row pages"),
        (((4, 64, 576), (64 * 608, 608, 1)), "contiguous rows"),
        (((4, 64, 576), (64 * 576, 576, 2)), "contiguous rows"),
        (((0, 64, 576), (64 * 576, 576, 1)), "strides"),
    )
    for (shape, strides), want in bad:
        try:
            core.page_view(shape, strides, 64)
        except ValueError as e:
            assert want in str(e) and "kv_cache" in str(e), (want, str(e))
        else:
            raise AssertionError(f"viewed {shape} {strides}")


@check("attention_spec errors name what is unsupported")
def _():
    cases = ((dict(GLM5_TP8, cache_dtype="fp8"), "kv_cache_dtype: got 'fp8'"),
             (dict(GLM5_TP8, cache_dtype="fp8_e4m3"), "supports auto, bfloat16, fp8_ds_mla, nvfp4_ds_mla"),
             (dict(GLM5_TP8, num_heads=256, cache_dtype="auto"),
              "num_q_heads: got 256, supported 1..128"),
             (dict(GLM5_TP8, kv_lora_rank=448, cache_dtype="fp8_ds_mla"), "kv_lora_rank"),
             (dict(GLM5_TP8, topk=0, cache_dtype="auto"), "topk: got 0"))
    for kwargs, want in cases:
        try:
            core.attention_spec(**kwargs)
        except core.UnsupportedConfig as e:
            assert want in str(e), (want, str(e))
        else:
            raise AssertionError(f"accepted {kwargs}")


@check("the logged prebuild matrix builds the kernel the backend asks for")
def _():
    spec = core.attention_spec(cache_dtype="fp8_ds_mla", **DSV32_TP1)
    matrix = core.prebuild_matrix(spec, 1, "sm_90a", name="deepseek-v3.2 test")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "matrix.json")
        with open(path, "w") as f:
            json.dump(matrix, f)
        out = os.path.join(tmp, "bundle")
        run = subprocess.run([KFORGE, "prebuild", path, "--out", out, "-j", "1"],
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        # The backend's own request, answered from the bundle alone.
        manifest = kforge.Bundle(out).get_manifest(spec=spec, arch="sm_90a")
        assert len(manifest.variants) >= 1
        got = manifest.variants[0].spec.sparse_mla_decode
        assert (got.softmax_scale, got.num_q_heads, got.kv_scale_format) == \
            (spec.softmax_scale, 128, 2), got
    # tp: the matrix counts every head, the backend one rank's.
    tp8 = core.prebuild_matrix(core.attention_spec(cache_dtype="auto", **GLM5_TP8), 8, "sm_120a")
    assert tp8["models"][0]["tp"] == [8] and tp8["models"][0]["spec"]["numQHeads"] == 64
    assert tp8["archs"] == ["sm_120a"]


print(f"{checks - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)

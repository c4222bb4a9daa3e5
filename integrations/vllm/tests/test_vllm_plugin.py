"""CPU tests of kforge-vllm against the real vLLM package (0.33), run by
scripts/test_vllm_plugin.sh in a venv holding vLLM, kforge and kforge-vllm.

  - the entry point loads through vLLM's own plugin loader
    (vllm.plugins.load_general_plugins) and registers KFORGE_MLA_SPARSE and
    CUSTOM, and with KFORGE_VLLM_TAKE_OVER=1 the sm_120 sparse-MLA slot
    too; KFORGE_MLA_SPARSE stays kforge's when another plugin takes CUSTOM,
    and survives pickling into a process that has loaded no plugin (a
    spawned engine core or worker);
  - the backend classes implement vLLM's abstract interfaces;
  - vLLM's CUDA backend selection resolves to the backend for GLM-5- and
    DeepSeek-V3.2-shaped model configs (read from config.json files by
    vLLM's ModelConfig) with --attention-backend KFORGE_MLA_SPARSE or
    CUSTOM, for --kv-cache-dtype auto, bfloat16, fp8_ds_mla, fp8 and
    fp8_e4m3, and on device capability (12, 0) with the take-over, and not
    without it;
  - the cache dtype vLLM's MLA layer writes for the backend (its
    MLAAttention, built on the CPU): fp8 and fp8_e4m3 become fp8_ds_mla
    (656-byte records), as for vLLM's own sparse backends; under the
    take-over "auto" does too, as for vLLM's sm_120 backend;
  - GLM-5 on sm_100 with default flags (vLLM's config makes its cache
    fp8_e4m3 there) selects the backend, builds the layer and runs a
    decode through forward_mqa on fp8_ds_mla records;
  - decode context parallelism (DCP): selected; the impl builds a kernel
    for the DCP group's heads that returns the lse, and two ranks' outputs
    merged by their lse (vLLM's rule) are the full attention; PCP alone is
    selected, PCP with DCP declined with the reason;
  - NoPE models (head size 512) resolve to the backend, a head size that
    is not the model's kv_lora_rank + qk_rope_head_dim does not;
  - configurations kforge cannot serve are declined with the reason (a
    compute capability kforge builds no kernel for, e.g. 10.3, with
    kforge's);
  - the metadata builder, run on vLLM's BlockTable and
    CommonAttentionMetadata for a batch of decode, MTP and prefill
    requests, maps each token's own position to the slot its KV goes to;
  - the impl, built with the arguments vLLM's MLA layer passes, makes the
    spec from them (heads per rank, scale, ranks, top-k buffer width),
    shares one core across layers, and vLLM's forward_mqa on it gives the
    reference attention over a block-interleaved cache, with vLLM's valid
    counts as kforge's topk_length and the layer's `sinks` as kforge's
    sink (the kernel call itself replaced by fp64 on the CPU); a NoPE
    layer's q reaches kforge zero-padded to the 656-byte fp8_ds_mla
    record's 576 columns;
  - the KV cache vLLM's allocator lays out for the backend's spec, viewed
    as the core views it (core.flat_pages), is what kforge's decode
    accepts (row bytes, page size, strides).

vLLM's Triton kernels do not run without a GPU driver, so the ones the
metadata and forward paths call are given their answers: the token ->
request map, the slot mapping (the slots the tokens' own KV goes to), and
the top-k conversion (a per-element reference of vLLM's, documented in
sparse_utils.triton_convert_req_index_to_global_index). vLLM's CUDA
platform module needs libcuda.so.1 to import; the script points at the
toolkit's stub. Usage:
  python -m unittest -v test_vllm_plugin   (from this directory)
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

import torch
from kforge_vllm import core as plugin_core

HERE = os.path.dirname(os.path.abspath(__file__))

# config.json of the two model shapes: the attention-relevant fields of the
# published configs (weights are never loaded). What both share (DSA:
# MLA with a 2048-token indexer, DeepSeek's MoE layout) first.
_DSA = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_topk": 2048, "index_head_dim": 128,
        "torch_dtype": "bfloat16", "moe_intermediate_size": 2048, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3}
GLM5 = dict(_DSA, architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa",
            num_attention_heads=64, num_key_value_heads=64, hidden_size=6144,
            num_hidden_layers=78, vocab_size=154880, q_lora_rank=2048, qk_nope_head_dim=192,
            v_head_dim=256, index_n_heads=32, max_position_embeddings=202752,
            intermediate_size=12288, rope_theta=1000000, rms_norm_eps=1e-05)
DEEPSEEK_V32 = dict(_DSA, architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32",
                    num_attention_heads=128, num_key_value_heads=128, hidden_size=7168,
                    num_hidden_layers=61, vocab_size=129280, q_lora_rank=1536,
                    qk_nope_head_dim=128, v_head_dim=128, index_n_heads=64,
                    max_position_embeddings=163840, intermediate_size=18432,
                    rms_norm_eps=1e-06,
                    rope_scaling={"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                  "mscale": 1.0, "mscale_all_dim": 1.0,
                                  "original_max_position_embeddings": 4096})
# A dense (no indexer) MLA model: not sparse, so not kforge's.
DEEPSEEK_V3 = {k: v for k, v in DEEPSEEK_V32.items() if not k.startswith("index_")}
DEEPSEEK_V3.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")

_tmp = tempfile.TemporaryDirectory(prefix="kforge-vllm-test-")


def model_dir(name, config):
    path = os.path.join(_tmp.name, name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return path


def vllm_config(config, name, tp=1, cache_dtype="auto", dcp=1, pcp=1):
    """A VllmConfig for a config.json, as `vllm serve` would build it (no
    weights, no tokenizer, no GPU)."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig
    model = ModelConfig(model=model_dir(name, config), skip_tokenizer_init=True,
                        dtype="bfloat16", max_model_len=8192)
    return VllmConfig(model_config=model, device_config=DeviceConfig(device="cpu"),
                      parallel_config=ParallelConfig(tensor_parallel_size=tp,
                                                     decode_context_parallel_size=dcp,
                                                     prefill_context_parallel_size=pcp),
                      cache_config=CacheConfig(block_size=64, cache_dtype=cache_dtype))


def selector_config(kv_cache_dtype, head_size=576, cfg=None):
    """The selector's view of a sparse MLA layer; `cfg` sets its DCP/PCP
    flags as vLLM's get_attn_backend does."""
    from vllm.v1.attention.selector import AttentionSelectorConfig
    parallel = cfg.parallel_config if cfg is not None else None
    return AttentionSelectorConfig(
        head_size=head_size, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype,
        block_size=None, use_mla=True, use_sparse=True,
        use_dcp=parallel is not None and parallel.decode_context_parallel_size > 1,
        use_pcp=parallel is not None and parallel.prefill_context_parallel_size > 1)


def select(cfg, backend, capability, kv_cache_dtype, head_size=576):
    """The backend class path vLLM's CUDA platform picks on a device of
    `capability` for the current model (backend None: automatic)."""
    from vllm.config import set_current_vllm_config
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    with set_current_vllm_config(cfg), \
            mock.patch.object(CudaPlatform, "get_device_capability",
                              return_value=DeviceCapability(*capability)):
        heads = cfg.model_config.get_num_attention_heads(cfg.parallel_config)
        return CudaPlatform.get_attn_backend_cls(
            backend, selector_config(kv_cache_dtype, head_size, cfg), num_heads=heads)


def kforge_member():
    """The AttentionBackendEnum member kforge_vllm.register() adds."""
    import kforge_vllm
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    kforge_vllm.register()
    return AttentionBackendEnum[kforge_vllm.NAME]


def run_python(code, env=None, timeout=600):
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc


class PluginLoadingTest(unittest.TestCase):
    """Through vLLM's loader, in fresh processes (plugins load once per
    process)."""

    def load(self, take_over, then=""):
        env = dict(os.environ)
        env.pop("KFORGE_VLLM_TAKE_OVER", None)
        if take_over is not None:
            env["KFORGE_VLLM_TAKE_OVER"] = take_over
        code = ("from vllm.plugins import load_general_plugins\n"
                "from vllm.v1.attention.backends.registry import AttentionBackendEnum as E\n"
                "load_general_plugins()\n" + then +
                "print('PATHS', E.KFORGE_MLA_SPARSE.get_path(), E.CUSTOM.get_path(), "
                "E.FLASHINFER_MLA_SPARSE_SM120.get_path())\n")
        return run_python(code, env)

    def test_entry_point_registers_its_name_and_custom_and_takes_over_on_request(self):
        from kforge_vllm import BACKEND, TAKE_OVER_BACKEND
        plain = self.load(None)
        self.assertEqual(plain.returncode, 0, plain.stderr[-3000:])
        paths = plain.stdout.split("PATHS", 1)[1].split()
        self.assertEqual(paths[:2], [BACKEND, BACKEND])
        self.assertNotIn(paths[2], (BACKEND, TAKE_OVER_BACKEND))  # vLLM's sm_120 backend
        taken = self.load("1")
        self.assertEqual(taken.returncode, 0, taken.stderr[-3000:])
        self.assertEqual(taken.stdout.split("PATHS", 1)[1].split(),
                         [BACKEND, BACKEND, TAKE_OVER_BACKEND])

    def test_own_name_stays_kforges_when_another_plugin_takes_custom(self):
        """Another plugin loaded after kforge registers CUSTOM too (the
        last one wins); KFORGE_MLA_SPARSE, as the CLI parses it, and the
        backend's own name still resolve to kforge. register() may run
        again (vLLM loads plugins in every process, tests call it twice)."""
        from kforge_vllm import BACKEND
        then = ("import kforge_vllm\n"
                "kforge_vllm.register()\n"  # a second time: no 'already exists'
                "from vllm.v1.attention.backends.registry import register_backend\n"
                "register_backend(E.CUSTOM, 'another.plugin.Backend')\n"
                "from vllm.config import AttentionConfig\n"
                "print('CLI', AttentionConfig(backend='kforge_mla_sparse').backend.get_path())\n"
                "from kforge_vllm.backend import KforgeSparseMlaBackend as B\n"
                "print('NAME', E[B.get_name()].get_path())\n")
        proc = self.load(None, then)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertEqual(proc.stdout.split("CLI", 1)[1].split()[0], BACKEND)
        self.assertEqual(proc.stdout.split("NAME", 1)[1].split()[0], BACKEND)
        self.assertEqual(proc.stdout.split("PATHS", 1)[1].split()[:2],
                         [BACKEND, "another.plugin.Backend"])

    def test_own_name_survives_pickling_into_a_process_without_plugins(self):
        """vLLM hands a spawned engine core or worker (or a Ray actor) its
        config pickled, and loads plugins there only after unpickling it: the
        run-time member must come back all the same."""
        from kforge_vllm import BACKEND
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.pkl")
            then = ("import pickle\n"
                    "from vllm.config import AttentionConfig\n"
                    f"open({path!r}, 'wb').write(pickle.dumps([\n"
                    "    AttentionConfig(backend='KFORGE_MLA_SPARSE'), E.CUSTOM,\n"
                    "    E.FLASHMLA_SPARSE]))\n")
            pickled = self.load(None, then)
            self.assertEqual(pickled.returncode, 0, pickled.stderr[-3000:])
            fresh = run_python(
                "import pickle, vllm.plugins as p\n"
                f"config, custom, flashmla = pickle.loads(open({path!r}, 'rb').read())\n"
                "print('LOADED', p.plugins_loaded)\n"
                "print('BACKEND', config.backend.name, config.backend.get_path())\n"
                "print('OTHERS', custom.name, flashmla.name)\n")
        self.assertEqual(fresh.returncode, 0, fresh.stderr[-3000:])
        self.assertEqual(fresh.stdout.split("LOADED", 1)[1].split()[0], "False")
        self.assertEqual(fresh.stdout.split("BACKEND", 1)[1].split()[:2],
                         ["KFORGE_MLA_SPARSE", BACKEND])
        self.assertEqual(fresh.stdout.split("OTHERS", 1)[1].split()[:2],
                         ["CUSTOM", "FLASHMLA_SPARSE"])

    def test_entry_point_is_declared_for_vllm(self):
        from importlib.metadata import entry_points
        found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "kforge"]
        self.assertEqual(len(found), 1)
        self.assertEqual(found[0].value, "kforge_vllm:register")


class TakeOverSwitchTest(unittest.TestCase):
    def test_values(self):
        from kforge_vllm import take_over_requested
        for value, want in (("", False), ("0", False), ("off", False), ("1", True),
                            ("TRUE", True), (" yes ", True)):
            self.assertEqual(take_over_requested({"KFORGE_VLLM_TAKE_OVER": value}), want, value)
        self.assertFalse(take_over_requested({}))
        with self.assertRaisesRegex(ValueError, "KFORGE_VLLM_TAKE_OVER: got '2'"):
            take_over_requested({"KFORGE_VLLM_TAKE_OVER": "2"})


class BackendInterfaceTest(unittest.TestCase):
    def test_classes_implement_vllms_interfaces(self):
        from vllm.model_executor.layers.attention.sparse_mla_attention import (
            SparseMLACommonImpl, SparseMLACommonMetadata, SparseMLACommonMetadataBuilder)
        from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from kforge_vllm.backend import KforgeSparseMlaBackend as B
        self.assertTrue(issubclass(B, AttentionBackend))
        self.assertFalse(getattr(B, "__abstractmethods__", None))
        self.assertEqual(kforge_member().name, B.get_name())
        self.assertIn(B.get_name(), AttentionBackendEnum.__members__)
        impl, builder = B.get_impl_cls(), B.get_builder_cls()
        self.assertTrue(issubclass(impl, SparseMLACommonImpl))
        self.assertFalse(getattr(impl, "__abstractmethods__", None))
        self.assertTrue(issubclass(builder, SparseMLACommonMetadataBuilder))
        self.assertTrue(issubclass(builder.metadata_cls, SparseMLACommonMetadata))
        self.assertTrue(B.is_mla() and B.is_sparse())
        self.assertTrue(B.supports_dcp() and B.supports_pcp())
        self.assertTrue(impl.can_return_lse_for_decode and impl.lse_base_on_e)
        self.assertIs(builder._cudagraph_support, AttentionCGSupport.UNIFORM_BATCH)
        self.assertTrue(B.supports_sink())
        self.assertEqual(B.get_supported_head_sizes(), [576, 512])
        # The impl runs every token through forward_mqa (kforge prefill),
        # vLLM's own, which hands kforge slots and valid counts.
        self.assertFalse(impl.supports_dense_mha_prefill)
        self.assertIs(impl.forward_mqa, SparseMLACommonImpl.forward_mqa)
        self.assertIsNot(impl._forward_mqa_kernel, SparseMLACommonImpl._forward_mqa_kernel)


class SelectionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import kforge_vllm
        kforge_vllm.register()  # CUSTOM (the loader test covers the entry point)
        cls.glm5_tp8 = vllm_config(GLM5, "glm5", tp=8)
        cls.dsv32 = vllm_config(DEEPSEEK_V32, "dsv32")

    def test_own_name_and_custom_resolve_to_kforge(self):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from kforge_vllm import BACKEND
        for backend in (kforge_member(), AttentionBackendEnum.CUSTOM):
            for cfg in (self.glm5_tp8, self.dsv32):
                for kv in ("auto", "bfloat16", "fp8_ds_mla", "fp8", "fp8_e4m3"):
                    for capability in ((12, 0), (10, 0), (9, 0), (8, 0)):
                        self.assertEqual(select(cfg, backend, capability, kv), BACKEND,
                                         (backend, cfg.model_config.model, kv, capability))

    def test_take_over_picks_kforge_on_sm120_only(self):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
        from kforge_vllm import BACKEND, TAKE_OVER_BACKEND, register
        slot = AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120
        original = slot.get_path()
        try:
            with mock.patch.dict(os.environ, {"KFORGE_VLLM_TAKE_OVER": "1"}):
                register()
            for cfg in (self.glm5_tp8, self.dsv32):
                for kv in ("fp8_ds_mla", "auto", "fp8", "fp8_e4m3", "bfloat16"):
                    self.assertEqual(select(cfg, None, (12, 0), kv), TAKE_OVER_BACKEND, kv)
                # Elsewhere vLLM keeps its own choice.
                try:
                    picked = select(cfg, None, (9, 0), "fp8_ds_mla")
                except ValueError:
                    picked = None  # no vLLM kernel importable here: still not kforge
                self.assertNotIn(picked, (BACKEND, TAKE_OVER_BACKEND))
        finally:
            register_backend(slot, original)
        # Without the take-over, sm_120 is vLLM's (or nobody's, with no
        # FlashInfer on this machine), never kforge's.
        for cfg in (self.glm5_tp8, self.dsv32):
            try:
                picked = select(cfg, None, (12, 0), "fp8_ds_mla")
            except ValueError as e:
                self.assertIn("FLASHINFER_MLA_SPARSE_SM120", str(e))
                picked = None
            self.assertNotIn(picked, (BACKEND, TAKE_OVER_BACKEND))

    def test_context_parallelism(self):
        """DCP alone and PCP alone select kforge; both together are declined
        with the reason (vLLM's own FLASHINFER_MLA_SPARSE declines it too)."""
        from kforge_vllm import BACKEND
        for cfg in (vllm_config(GLM5, "glm5-dcp", tp=8, dcp=8),
                    vllm_config(DEEPSEEK_V32, "dsv32-dcp", tp=8, dcp=2),
                    vllm_config(DEEPSEEK_V32, "dsv32-pcp", tp=1, pcp=2)):
            for kv in ("auto", "fp8_ds_mla"):
                self.assertEqual(select(cfg, kforge_member(), (9, 0), kv), BACKEND,
                                 (cfg.parallel_config, kv))
        both = vllm_config(DEEPSEEK_V32, "dsv32-pcp-dcp", tp=1, pcp=2, dcp=2)
        with self.assertRaisesRegex(ValueError, r"prefill context parallelism \(2\) together "
                                                r"with decode context parallelism \(2\)"):
            select(both, kforge_member(), (9, 0), "fp8_ds_mla")

    def test_compute_capability_is_kforges_arch_table_with_its_reason(self):
        """The backend declares exactly the compute capabilities kforge
        builds an arch for (model/arch.cc), B300's 10.3 (sm_103a) among them;
        one it does not (7.0, 11.0) is declined with kforge's reason."""
        from kforge import spec as kforge_spec
        from vllm.platforms.interface import DeviceCapability
        from kforge_vllm.backend import KforgeSparseMlaBackend as B
        for capability in ((7, 0), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0),
                           (12, 0), (12, 1)):
            try:
                kforge_spec.arch_for_capability(*capability)
                builds = True
            except Exception:
                builds = False
            self.assertEqual(B.supports_compute_capability(DeviceCapability(*capability)),
                             builds, capability)
            self.assertEqual(builds, capability not in ((7, 0), (11, 0)), capability)
            if not builds:
                with self.assertRaisesRegex(ValueError, r"compute capability not supported.*"
                                            r"kforge: compute capability %d\.%d: kforge builds "
                                            r"kernels for" % capability):
                    select(self.dsv32, kforge_member(), capability, "auto")

    def test_nope_models_resolve_to_kforge(self):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from kforge_vllm import BACKEND
        nope = vllm_config(dict(DEEPSEEK_V32, qk_rope_head_dim=0), "nope")
        for kv in ("auto", "bfloat16", "fp8_ds_mla"):
            with self.subTest(kv=kv):
                self.assertEqual(select(nope, AttentionBackendEnum.CUSTOM, (9, 0), kv, 512),
                                 BACKEND)

    def test_unsupported_configurations_are_declined_with_the_reason(self):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        custom = AttentionBackendEnum.CUSTOM
        cases = (
            (self.dsv32, "fp8_e5m2", 576, "kv_cache_dtype not supported"),
            (vllm_config(DEEPSEEK_V3, "dsv3"), "auto", 576, "no index_topk"),
            (vllm_config(dict(DEEPSEEK_V32, num_attention_heads=256, num_key_value_heads=256),
                         "heads256"), "auto", 576, "num_q_heads: got 256, supported 1..128"),
            (vllm_config(dict(DEEPSEEK_V32, index_topk=20000), "topk20000"), "auto", 576,
             "topk: got 20000"),
            # A 512 head on a model with rope is not a NoPE model.
            (self.dsv32, "auto", 512, "head_size: got 512, the model's kv_lora_rank + "
                                      "qk_rope_head_dim is 512 + 64"),
            (self.dsv32, "auto", 320, "head_size not supported"),
            (vllm_config(dict(DEEPSEEK_V32, qk_rope_head_dim=0), "nope-nvfp4"), "nvfp4_ds_mla",
             512, "rope_dim: got 0"),
        )
        for cfg, kv, head_size, reason in cases:
            from vllm.config import set_current_vllm_config
            from vllm.platforms.cuda import CudaPlatform
            from vllm.platforms.interface import DeviceCapability
            with set_current_vllm_config(cfg), \
                    mock.patch.object(CudaPlatform, "get_device_capability",
                                      return_value=DeviceCapability(12, 0)):
                with self.assertRaises(ValueError) as caught:
                    CudaPlatform.get_attn_backend_cls(custom, selector_config(kv, head_size))
            self.assertIn(reason, str(caught.exception))
        # A GPU kforge builds for nothing (Volta) is declined as such.
        with self.assertRaisesRegex(ValueError, "compute capability not supported"):
            select(self.dsv32, custom, (7, 0), "auto")
        # A plain fp8 name reaching the core (a layer that would write it
        # plain, not as fp8_ds_mla) is refused by name.
        with self.assertRaisesRegex(plugin_core.UnsupportedConfig, "kv_cache_dtype: got 'fp8'"):
            plugin_core.kforge_kv_dtype("fp8")


@contextlib.contextmanager
def no_pinned_memory():
    """The CPU is the "device" here: vLLM's buffers take no pinned staging
    copies (pinning asks a CUDA driver)."""
    with mock.patch("vllm.v1.utils.PIN_MEMORY", False), \
            mock.patch("vllm.model_executor.layers.attention.sparse_mla_attention.PIN_MEMORY",
                       False):
        yield


def vllm_conversion(topk, req_id_per_token, block_table, block_size, block_stride_rows):
    """vLLM's top-k conversion with valid counts, per element on the CPU
    (its Triton kernel, sparse_utils.triton_convert_req_index_to_global_index
    with return_valid_counts, as documented there): slot = block_table[req,
    pos // block_size] * block_stride_rows + pos % block_size, none for -1
    or a block past the table; the valid slots compacted to the front in
    order, -1 after; and their count per token (int32)."""
    rows, counts = [], []
    width = block_table.shape[1]
    for t, req in enumerate(req_id_per_token.tolist()):
        valid = [int(block_table[req, p // block_size]) * block_stride_rows + p % block_size
                 for p in topk[t].tolist() if p >= 0 and p // block_size < width]
        counts.append(len(valid))
        rows.append(valid + [-1] * (topk.shape[1] - len(valid)))
    return torch.tensor(rows, dtype=torch.int32), torch.tensor(counts, dtype=torch.int32)


def convert_on_cpu(impl, logical, attn_metadata, *, block_stride_rows, return_valid_counts):
    """Stands in for SparseMLACommonImpl._convert_logical_to_physical_topk
    (vLLM's index group runs the Triton kernel on a side stream)."""
    assert return_valid_counts
    return vllm_conversion(logical, attn_metadata.req_id_per_token[:logical.shape[0]],
                           attn_metadata.block_table, attn_metadata.block_size,
                           block_stride_rows)


def build_metadata(cfg, query_lens, seq_lens, block_rows):
    """(builder, metadata, positions) of the backend's builder on vLLM's
    own objects: a BlockTable filled the way the model runner fills it,
    and the CommonAttentionMetadata of the batch."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    from vllm.v1.worker.block_table import BlockTable
    from kforge_vllm.backend import KforgeSparseMlaBackend
    page = 64
    table = BlockTable(block_size=page, max_num_reqs=8, max_num_blocks_per_req=64,
                       max_num_batched_tokens=512, pin_memory=False,
                       device=torch.device("cpu"), cp_kv_cache_interleave_size=1)
    for row, blocks in enumerate(block_rows):
        table.add_row(blocks, row)
    num_reqs = len(query_lens)
    with no_pinned_memory():
        table.commit_block_table(num_reqs)
    qsl = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0).tolist()),
                       dtype=torch.int32)
    positions = torch.cat([torch.arange(s - q, s) for q, s in zip(query_lens, seq_lens)])
    num_tokens = int(qsl[-1])
    # The slots the tokens' own KV is written to (vLLM's slot-mapping
    # kernel is Triton).
    slot_mapping = torch.tensor(
        [block_rows[r][p // page] * page + p % page
         for r, (q, s) in enumerate(zip(query_lens, seq_lens)) for p in range(s - q, s)],
        dtype=torch.int64)
    common = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=num_reqs,
        num_actual_tokens=num_tokens, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), block_table_tensor=table.get_device_tensor(num_reqs),
        slot_mapping=slot_mapping,
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32))
    # vLLM maps tokens to requests with a Triton kernel, which has no
    # CPU form (vllm.triton_utils stubs Triton out without a driver);
    # its answer, filled in where vLLM caches it:
    common._token_to_req_indices_cache = torch.tensor(
        [r for r, q in enumerate(query_lens) for _ in range(q)], dtype=torch.int32)
    spec = MLAAttentionSpec(block_size=page, num_kv_heads=1, head_size=576,
                            dtype=torch.bfloat16, cache_dtype_str="auto")
    layer = "model.layers.0.self_attn.attn"
    # The MLA layer registers itself here; the builder reads its
    # prefill backend (none: kforge serves prefill through forward_mqa).
    cfg.compilation_config.static_forward_context[layer] = types.SimpleNamespace(
        prefill_backend=None)
    with set_current_vllm_config(cfg), no_pinned_memory():
        builder = KforgeSparseMlaBackend.get_builder_cls()(spec, [layer], cfg,
                                                           torch.device("cpu"))
        return builder, builder.build(0, common), positions


class MetadataTest(unittest.TestCase):
    """The builder on vLLM's own objects (build_metadata)."""

    def test_each_tokens_own_position_maps_to_its_kv_slot(self):
        cfg = vllm_config(DEEPSEEK_V32, "dsv32-md")
        gen = torch.Generator().manual_seed(1)
        # Requests, decodes first as vLLM orders them: two decodes, a
        # 3-token extend, a 40-token prefill chunk after 100 cached tokens.
        query_lens, seq_lens = [1, 1, 3, 40], [300, 70, 130, 140]
        block_rows = [torch.randperm(400, generator=gen)[:(s + 63) // 64].tolist()
                      for s in seq_lens]
        builder, md, positions = build_metadata(cfg, query_lens, seq_lens, block_rows)
        num_tokens = sum(query_lens)
        self.assertEqual(md.num_actual_tokens, num_tokens)
        self.assertEqual(md.block_size, 64)
        self.assertEqual(md.topk_tokens, 2048)
        # The indexer's output: positions up to the token's own, -1 padded.
        topk = torch.full((num_tokens, 2048), -1, dtype=torch.int32)
        for t, pos in enumerate(positions.tolist()):
            n = min(pos + 1, 2048)
            topk[t, :n] = torch.randperm(pos + 1, generator=gen)[:n].to(torch.int32)
        slots, counts = vllm_conversion(topk, md.req_id_per_token[:num_tokens],
                                        md.block_table, 64, 64)
        self.assertTrue(torch.equal(counts, (topk >= 0).sum(1).to(torch.int32)))
        # Each token's own position maps to the slot its KV is written to.
        own = torch.tensor([row.index(p) for row, p in
                            zip(topk.tolist(), positions.tolist())])
        self.assertTrue(torch.equal(slots[torch.arange(num_tokens), own].long(),
                                    md.slot_mapping[:num_tokens].long()))

    def test_mtp_batches_are_uniform_decodes(self):
        """With k speculative tokens a verification batch (1 + k tokens per
        request, k = 0..3) is all decode: the uniform batch vLLM captures
        whole in a CUDA graph."""
        cfg = vllm_config(GLM5, "glm5-md", tp=8)
        rows = [list(range(i * 8, i * 8 + 4)) for i in range(3)]
        for k in (0, 1, 2, 3):
            q = 1 + k
            spec = types.SimpleNamespace(num_speculative_tokens=k, parallel_drafting=False)
            with mock.patch.object(cfg, "speculative_config", spec if k else None):
                builder, md, _ = build_metadata(cfg, [q] * 3, [100, 65, 200], rows)
            self.assertEqual(builder.reorder_batch_threshold, q)
            self.assertEqual((md.num_decodes, md.num_prefills, md.num_decode_tokens,
                              md.decode_max_query_len), (3, 0, 3 * q, q), f"k={k}")


class ReferenceDecoder:
    """Stands in for kforge.SparseMlaDecoder where there is no GPU: records
    each call and computes it in fp64 on the CPU for a bf16 cache, with
    kforge's rules (check_core_gpu.py checks the kernel against the same
    math): q has the spec's head count, slots of the pages it is handed,
    only each token's first topk_length count, the sink scales out by
    1 / (1 + exp(sink - lse)); lse [tokens, heads] fp32 in natural log
    without the sink, -inf for a token with no valid slot (out zero), and
    only from a spec built with return_lse (PlanDecode's rule)."""

    made = []

    def __init__(self, source=None, spec=None, device=None):
        self.spec, self.arch, self.calls = spec, "sm_120a", []
        ReferenceDecoder.made.append(self)

    def prefetch(self):
        return 1

    def __call__(self, q, pages, slots, out=None, topk_length=None, sink=None,
                 return_lse=False):
        self.calls.append(dict(q=q, pages=pages, slots=slots, topk_length=topk_length, sink=sink,
                               return_lse=return_lse))
        assert q.shape[1] == self.spec.num_q_heads, (list(q.shape), self.spec.num_q_heads)
        assert not return_lse or self.spec.return_lse, "lse from kernels built without it"
        if pages.dtype != torch.bfloat16:
            out.zero_()
            return (out, torch.zeros(q.shape[:2])) if return_lse else out
        rows = pages.reshape(-1, pages.shape[-1]).double()
        valid = (slots >= 0) & (slots < rows.shape[0])
        if topk_length is not None:
            valid &= torch.arange(slots.shape[1])[None, :] < topk_length[:, None].long()
        kv = rows[torch.where(valid, slots, 0).long()] * valid[..., None]
        s = torch.einsum("thd,tkd->thk", q.double(), kv) * self.spec.softmax_scale
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.einsum("thk,tkd->thd", torch.softmax(s, -1).nan_to_num(0.0),
                         kv[..., :self.spec.kv_lora_rank])
        if sink is not None:
            o = o / (1 + torch.exp(sink.double()[None, :] - lse))[..., None]
        out.copy_(o)
        return (out, lse.float()) if return_lse else out


def reference_attention(q, keys, scale, rank, sink=None):
    """Attention of one token: q [heads, d], keys [n, d] (fp64), with a sink
    per head joining the softmax's denominator."""
    s = q @ keys.T * scale
    o = torch.softmax(s, -1) @ keys[:, :rank]
    if sink is None:
        return o
    return o / (1 + torch.exp(sink - torch.logsumexp(s, -1)))[:, None]


def dcp_conversion(req_id, block_table, token_indices, dcp_size, dcp_rank,
                   cp_kv_cache_interleave_size=1, BLOCK_SIZE=64, BLOCK_STRIDE_ROWS=None,
                   NUM_TOPK_TOKENS=2048, return_valid_counts=False, **_):
    """vLLM's DCP top-k conversion per element on the CPU
    (sparse_utils.triton_filter_and_convert_dcp_index, its Triton kernel's
    rule): position p belongs to rank (p // interleave) % dcp_size, at local
    position (p // (dcp_size * interleave)) * interleave + p % interleave,
    whose slot is that rank's block_table[req, local // BLOCK_SIZE] *
    BLOCK_STRIDE_ROWS + local % BLOCK_SIZE; other ranks' positions are
    dropped, the rest compacted to the front, and counted."""
    assert return_valid_counts
    il, stride = cp_kv_cache_interleave_size, BLOCK_STRIDE_ROWS or BLOCK_SIZE
    local = torch.where((token_indices // il) % dcp_size == dcp_rank,
                        (token_indices // (dcp_size * il)) * il + token_indices % il, -1)
    local = torch.where(token_indices >= 0, local, -1)
    return vllm_conversion(local, req_id, block_table, BLOCK_SIZE, stride)


class ImplTest(unittest.TestCase):
    """KforgeSparseMlaImpl built the way vLLM's MLA layer builds it (the
    same keyword arguments) and vLLM's forward_mqa on it."""

    def make_impl(self, cfg, topk_buffer, scale, kv_cache_dtype="auto", dcp=(1, 0), pcp=1,
                  **extra):
        """`dcp`: (DCP world size, this rank), `pcp`: the PCP world size, as
        vLLM's process groups would report them."""
        from vllm.config import set_current_vllm_config
        from kforge_vllm.backend import KforgeSparseMlaBackend
        text = cfg.model_config.hf_text_config
        heads = cfg.model_config.get_num_attention_heads(cfg.parallel_config)
        pcp_group = types.SimpleNamespace(world_size=pcp, rank_in_group=0)
        with set_current_vllm_config(cfg), \
                mock.patch.object(plugin_core.kforge, "SparseMlaDecoder", ReferenceDecoder), \
                mock.patch("vllm.model_executor.layers.attention.sparse_mla_attention."
                           "get_tensor_model_parallel_world_size",
                           return_value=cfg.parallel_config.tensor_parallel_size), \
                mock.patch("vllm.distributed.parallel_state.get_dcp_world_size_and_rank",
                           return_value=dcp), \
                mock.patch("vllm.distributed.parallel_state.get_pcp_group",
                           return_value=pcp_group):
            return KforgeSparseMlaBackend.get_impl_cls()(
                num_heads=heads, head_size=text.kv_lora_rank + text.qk_rope_head_dim,
                scale=scale, num_kv_heads=1, alibi_slopes=None,
                sliding_window=None, kv_cache_dtype=kv_cache_dtype, logits_soft_cap=None,
                attn_type="decoder", kv_sharing_target_layer_name=None,
                q_lora_rank=text.q_lora_rank, kv_lora_rank=text.kv_lora_rank,
                qk_nope_head_dim=text.qk_nope_head_dim, qk_rope_head_dim=text.qk_rope_head_dim,
                qk_head_dim=text.qk_nope_head_dim + text.qk_rope_head_dim,
                v_head_dim=text.v_head_dim, kv_b_proj=None, indexer=None,
                topk_indices_buffer=topk_buffer, **extra)

    def forward(self, impl, q, kv, md):
        from vllm.model_executor.layers.attention.sparse_mla_attention import (
            SparseMLACommonImpl)
        with mock.patch.object(SparseMLACommonImpl, "_convert_logical_to_physical_topk",
                               convert_on_cpu), \
                mock.patch("vllm.model_executor.layers.attention.sparse_mla_attention."
                           "triton_filter_and_convert_dcp_index", dcp_conversion):
            return impl.forward_mqa(q, kv, md, layer=None)

    def test_spec_from_vllms_arguments_and_forward(self):
        from kforge_vllm import backend
        cfg = vllm_config(GLM5, "glm5-impl", tp=8)
        gen = torch.Generator().manual_seed(2)
        tokens = 6
        buffer = torch.full((64, 2048), -1, dtype=torch.int32)
        sinks = torch.randn(8, generator=gen)
        backend._cores.clear()
        ReferenceDecoder.made.clear()
        impls = [self.make_impl(cfg, buffer, 0.0625, sinks=sinks) for _ in range(2)]  # 2 layers
        self.assertEqual(len(ReferenceDecoder.made), 1, "layers of one shape share one core")
        spec = ReferenceDecoder.made[0].spec
        self.assertEqual((spec.num_q_heads, spec.kv_lora_rank, spec.rope_dim, spec.topk,
                          spec.page_block_size, spec.kv_cache_dtype, spec.return_lse),
                         (8, 512, 64, 2048, 64, 1, False))
        self.assertAlmostEqual(spec.softmax_scale, 0.0625)
        self.assertIs(impls[0].core, impls[1].core)
        # One step: 2 decodes + a 4-token MTP verification.
        query_lens, seq_lens = [1, 1, 4], [70, 130, 200]
        rows = [[5, 9], [2, 0, 7], [1, 3, 4, 6]]
        _, md, positions = build_metadata(cfg, query_lens, seq_lens, rows)
        for t, pos in enumerate(positions.tolist()):
            buffer[t, :pos + 1] = torch.randperm(pos + 1, generator=gen).to(torch.int32)
        buffer[0, 3] = -1  # a hole: vLLM's conversion compacts past it
        # This layer's 10 blocks, each followed by 2 other layers' pages
        # (vLLM's block-interleaved layout), which hold NaN.
        storage = torch.full((10 * 3 * 64 * 576,), float("nan")).bfloat16()
        kv = storage.as_strided((10, 64, 576), (3 * 64 * 576, 576, 1), 64 * 576)
        kv.copy_(torch.randn(10, 64, 576, generator=gen))
        q_latent = torch.randn(tokens, 8, 512, generator=gen).bfloat16()
        q_rope = torch.randn(tokens, 8, 64, generator=gen).bfloat16()
        out, lse = self.forward(impls[1], (q_latent, q_rope), kv, md)
        self.assertIsNone(lse)
        self.assertEqual(tuple(out.shape), (tokens, 8, 512))
        call = ReferenceDecoder.made[0].calls[-1]
        self.assertIs(call["sink"], sinks)
        self.assertTrue(torch.equal(call["topk_length"], (buffer[:tokens] >= 0).sum(1).int()))
        # The reference reads each position's row through the block table,
        # not through any slot numbering.
        req = [r for r, n in enumerate(query_lens) for _ in range(n)]
        q = torch.cat([q_latent, q_rope], -1).double()
        for t in range(tokens):
            pos = [p for p in buffer[t].tolist() if p >= 0]
            keys = torch.stack([kv[rows[req[t]][p // 64], p % 64] for p in pos]).double()
            want = reference_attention(q[t], keys, 0.0625, 512, sinks.double())
            torch.testing.assert_close(out[t].double(), want, rtol=1e-2, atol=1e-2)

    def test_nope_q_reaches_kforge_padded_for_vllms_fp8_records(self):
        from kforge_vllm import backend
        cfg = vllm_config(dict(GLM5, qk_rope_head_dim=0), "glm5-nope", tp=8)
        buffer = torch.full((64, 2048), -1, dtype=torch.int32)
        backend._cores.clear()
        ReferenceDecoder.made.clear()
        impl = self.make_impl(cfg, buffer, 0.0625, "fp8_ds_mla")
        decoder = ReferenceDecoder.made[0]
        self.assertEqual((decoder.spec.kv_lora_rank, decoder.spec.rope_dim,
                          decoder.spec.kv_cache_dtype), (512, 64, 2))
        _, md, positions = build_metadata(cfg, [1, 1], [10, 70], [[3], [1, 2]])
        for t, pos in enumerate(positions.tolist()):
            buffer[t, :pos + 1] = torch.arange(pos + 1, dtype=torch.int32)
        kv = torch.zeros(4, 64, 656, dtype=torch.uint8)  # vLLM's records, RoPE slot zero
        q_latent = torch.randn(2, 8, 512).bfloat16()
        self.forward(impl, (q_latent, q_latent[..., :0]), kv, md)
        q = decoder.calls[-1]["q"]
        self.assertEqual(tuple(q.shape), (2, 8, 576))
        self.assertTrue(torch.equal(q[..., :512], q_latent))
        self.assertFalse(q[..., 512:].any())

    def test_dcp_ranks_merged_by_their_lse_give_the_full_attention(self):
        """GLM-5 TP8 with DCP 2: each rank's cache holds every other token
        (vLLM's DCP layout, interleave 1), the layer hands the impl the DCP
        group's 16 query heads, and vLLM's merge (out = sum_r exp(lse_r -
        lse) out_r, lse = log sum_r exp(lse_r), natural log) of the two
        ranks' outputs is the attention over all of a token's positions; a
        token with nothing on a rank gets (0, -inf) there."""
        from kforge_vllm import backend
        cfg = vllm_config(GLM5, "glm5-dcp-impl", tp=8, dcp=2)
        gen = torch.Generator().manual_seed(3)
        buffer = torch.full((64, 2048), -1, dtype=torch.int32)
        backend._cores.clear()
        ReferenceDecoder.made.clear()
        with mock.patch.object(backend.logger, "info") as log:
            impls = [self.make_impl(cfg, buffer, 0.0625, dcp=(2, r)) for r in range(2)]
        self.assertEqual(len(ReferenceDecoder.made), 1)
        spec = ReferenceDecoder.made[0].spec
        self.assertEqual((spec.num_q_heads, spec.return_lse), (16, True))
        # The logged prebuild matrix names that kernel: GLM-5's 64 heads
        # split 4 ways (TP 8 / DCP 2), with the lse.
        matrix = json.loads(log.call_args.args[-1])["models"][0]
        self.assertEqual((matrix["tp"], matrix["spec"]["numQHeads"], matrix["spec"]["returnLse"]),
                         ([4], 64, True))
        self.assertTrue(all(i.need_to_return_lse_for_decode for i in impls))
        # Two decodes (one at position 0: nothing on rank 1), a 4-token MTP
        # verification; local (per-rank) block tables.
        query_lens, seq_lens = [1, 1, 4], [1, 130, 200]
        rows = [[5, 9, 11, 12], [2, 0, 13, 14], [1, 3, 15, 16]]  # the first 2 used
        _, md, positions = build_metadata(vllm_config(GLM5, "glm5-dcp-md", tp=8), query_lens,
                                          seq_lens, rows)
        for t, pos in enumerate(positions.tolist()):
            buffer[t, :pos + 1] = torch.randperm(pos + 1, generator=gen).to(torch.int32)
        tokens, req = sum(query_lens), [r for r, n in enumerate(query_lens) for _ in range(n)]
        keys = torch.randn(3, 200, 576, generator=gen).bfloat16()  # [request, position]
        caches = [torch.zeros(20, 64, 576, dtype=torch.bfloat16) for _ in range(2)]
        for r, n in enumerate(seq_lens):
            for p in range(n):
                local = p // 2
                caches[p % 2][rows[r][local // 64], local % 64] = keys[r, p]
        q = torch.randn(tokens, 16, 576, generator=gen).bfloat16()  # gathered heads
        outs, lses = zip(*(self.forward(impls[r], q, caches[r], md) for r in range(2)))
        for out, lse in zip(outs, lses):
            self.assertEqual((tuple(out.shape), tuple(lse.shape), lse.dtype),
                             ((tokens, 16, 512), (tokens, 16), torch.float32))
        self.assertTrue(bool((lses[1][0] == float("-inf")).all()) and not outs[1][0].any())
        lse = torch.logaddexp(lses[0].double(), lses[1].double())
        merged = sum(torch.exp(l.double() - lse)[..., None] * o.double()
                     for o, l in zip(outs, lses))
        for t in range(tokens):
            pos = [p for p in buffer[t].tolist() if p >= 0]
            want = reference_attention(q[t].double(), keys[req[t], pos].double(), 0.0625, 512)
            torch.testing.assert_close(merged[t], want, rtol=1e-2, atol=1e-2)

    def test_pcp_alone_changes_nothing_and_pcp_with_dcp_is_declined(self):
        from kforge_vllm import backend
        buffer = torch.full((64, 2048), -1, dtype=torch.int32)
        backend._cores.clear()
        ReferenceDecoder.made.clear()
        impl = self.make_impl(vllm_config(DEEPSEEK_V32, "dsv32-pcp-impl", pcp=2), buffer, 0.1,
                              pcp=2)
        self.assertFalse(impl.need_to_return_lse_for_decode)
        spec = ReferenceDecoder.made[0].spec
        self.assertEqual((spec.num_q_heads, spec.return_lse), (128, False))
        with self.assertRaisesRegex(NotImplementedError, "does not gather the DCP KV shards"):
            self.make_impl(vllm_config(DEEPSEEK_V32, "dsv32-pcp-dcp-impl", pcp=2, dcp=2),
                           buffer, 0.1, dcp=(2, 0), pcp=2)

    def test_declines_what_it_cannot_serve(self):
        cfg = vllm_config(GLM5, "glm5-impl2", tp=8)
        with self.assertRaisesRegex(NotImplementedError, "top-k buffer"):
            self.make_impl(cfg, None, 0.0625)
        # vLLM hands the impl the dtype the layer writes (fp8_ds_mla for
        # kforge's backend, LayerCacheDtypeTest); a plain fp8 one is refused.
        with self.assertRaisesRegex(ValueError, "kv_cache_dtype: got 'fp8'"):
            self.make_impl(cfg, torch.zeros(4, 2048, dtype=torch.int32), 0.0625, "fp8")
        with self.assertRaisesRegex(ValueError, r"sinks: expected float32 \[8\]"):
            self.make_impl(cfg, torch.zeros(4, 2048, dtype=torch.int32), 0.0625,
                           sinks=torch.zeros(8, dtype=torch.bfloat16))
        with self.assertRaisesRegex(NotImplementedError, "attention sink under decode context "
                                                         "parallelism"):
            self.make_impl(vllm_config(GLM5, "glm5-dcp-sink", tp=8, dcp=2),
                           torch.zeros(4, 2048, dtype=torch.int32), 0.0625, dcp=(2, 0),
                           sinks=torch.zeros(8))


@contextlib.contextmanager
def cuda_platform(capability):
    """vLLM's CUDA platform as vllm.platforms.current_platform (what the
    selector and the models' config hooks ask), on a device of
    `capability`; the selector's per-process cache emptied around it."""
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import _cached_get_attn_backend
    _cached_get_attn_backend.cache_clear()
    try:
        with mock.patch("vllm.platforms._current_platform", CudaPlatform()), \
                mock.patch.object(CudaPlatform, "get_device_capability",
                                  return_value=DeviceCapability(*capability)):
            yield
    finally:
        _cached_get_attn_backend.cache_clear()


def build_layer(cfg, name, attn_backend=None):
    """vLLM's MLAAttention for one sparse layer of `cfg`'s model, built as
    its model builds it (heads per rank, the top-k buffer, the cache
    config); attn_backend None: vLLM selects (under cuda_platform). The
    kforge decoder is ReferenceDecoder."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    text = cfg.model_config.hf_text_config
    buffer = torch.full((64, int(text.index_topk)), -1, dtype=torch.int32)
    from vllm.utils.torch_utils import set_default_torch_dtype
    with set_current_vllm_config(cfg), set_default_torch_dtype(torch.bfloat16), \
            mock.patch.object(plugin_core.kforge, "SparseMlaDecoder", ReferenceDecoder), \
            mock.patch("vllm.model_executor.layers.attention.sparse_mla_attention."
                       "get_tensor_model_parallel_world_size",
                       return_value=cfg.parallel_config.tensor_parallel_size):
        return MLAAttention(
            num_heads=cfg.model_config.get_num_attention_heads(cfg.parallel_config),
            scale=0.0625, qk_nope_head_dim=text.qk_nope_head_dim,
            qk_rope_head_dim=text.qk_rope_head_dim, v_head_dim=text.v_head_dim,
            q_lora_rank=text.q_lora_rank, kv_lora_rank=text.kv_lora_rank,
            kv_b_proj=torch.nn.Linear(1, 1), cache_config=cfg.cache_config,
            prefix=f"model.layers.0.{name}.attn", attn_backend=attn_backend, use_sparse=True,
            topk_indices_buffer=buffer)


class LayerCacheDtypeTest(unittest.TestCase):
    """The cache dtype vLLM's MLA layer writes with kforge's backend (vLLM
    decides it in MLAAttention.__init__, by backend: the backend's module
    gives vLLM's rule kforge's answer), and the spec of the kernel its impl
    asks kforge for."""

    def layer(self, cfg, name, backend):
        from vllm.config import set_current_vllm_config
        from kforge_vllm import backend as plugin_backend
        plugin_backend._cores.clear()
        ReferenceDecoder.made.clear()
        layer = build_layer(cfg, name, backend)
        with set_current_vllm_config(cfg):
            spec = layer.get_kv_cache_spec(cfg)
        return layer, spec, ReferenceDecoder.made[0].spec

    def test_fp8_names_are_written_as_fp8_ds_mla(self):
        from kforge_vllm.backend import KforgeSparseMlaBackend
        for kv in ("fp8", "fp8_e4m3", "fp8_ds_mla"):
            cfg = vllm_config(DEEPSEEK_V32, f"dsv32-{kv}", cache_dtype=kv)
            layer, spec, kspec = self.layer(cfg, kv, KforgeSparseMlaBackend)
            self.assertEqual((layer.kv_cache_dtype, cfg.cache_config.cache_dtype),
                             ("fp8_ds_mla", "fp8_ds_mla"), kv)
            self.assertEqual((spec.dtype, spec.state_content_bytes, spec.page_size_bytes),
                             (torch.uint8, 656, 656 * 64), kv)
            self.assertEqual(kspec.kv_cache_dtype, 2, kv)  # KV_CACHE_DTYPE_FP8_DS_MLA
        for kv, bf16_bytes in (("auto", 1152), ("bfloat16", 1152)):
            cfg = vllm_config(GLM5, f"glm5-{kv}", tp=8, cache_dtype=kv)
            layer, spec, kspec = self.layer(cfg, kv, KforgeSparseMlaBackend)
            self.assertEqual((layer.kv_cache_dtype, spec.page_size_bytes, kspec.kv_cache_dtype),
                             (kv, bf16_bytes * 64, 1), kv)

    def test_take_over_keeps_vllms_sm120_default_cache(self):
        """vLLM's sm_120 backend writes "auto" as fp8_ds_mla (656 B a token);
        in its slot kforge does the same, not bf16 (1152 B: 43% fewer
        cached tokens). An explicit bfloat16 stays bf16."""
        from kforge_vllm.backend import KforgeSm120TakeOverBackend
        cases = (("auto", "fp8_ds_mla", 656), ("fp8", "fp8_ds_mla", 656),
                 ("fp8_e4m3", "fp8_ds_mla", 656), ("bfloat16", "bfloat16", 1152))
        for kv, written, token_bytes in cases:
            cfg = vllm_config(GLM5, f"glm5-takeover-{kv}", tp=8, cache_dtype=kv)
            layer, spec, _ = self.layer(cfg, kv, KforgeSm120TakeOverBackend)
            self.assertEqual((layer.kv_cache_dtype, spec.page_size_bytes),
                             (written, token_bytes * 64), kv)

    def test_take_over_selected_on_sm120_writes_fp8_ds_mla_by_default(self):
        """Selection and layer together: KFORGE_VLLM_TAKE_OVER=1, sm_120, no
        flags."""
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
        from kforge_vllm import register
        from kforge_vllm.backend import KforgeSm120TakeOverBackend
        slot = AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120
        original = slot.get_path()
        try:
            with mock.patch.dict(os.environ, {"KFORGE_VLLM_TAKE_OVER": "1"}):
                register()
            cfg = vllm_config(GLM5, "glm5-takeover-select", tp=8)
            with cuda_platform((12, 0)):
                layer = build_layer(cfg, "takeover", None)
            self.assertIs(layer.attn_backend, KforgeSm120TakeOverBackend)
            self.assertEqual(layer.kv_cache_dtype, "fp8_ds_mla")
        finally:
            register_backend(slot, original)

    def test_other_backends_keep_vllms_rule(self):
        from vllm.model_executor.layers.attention import mla_attention
        import kforge_vllm.backend  # noqa: F401  (installs the rule)

        def named(name):
            return type(name, (), {"get_name": staticmethod(lambda: name)})
        rule = mla_attention._canonicalize_sparse_mla_kv_cache_dtype
        self.assertEqual(rule(named("FLASHMLA_SPARSE"), "fp8_e4m3"), "fp8_ds_mla")
        self.assertEqual(rule(named("FLASHINFER_MLA_SPARSE_SM120"), "auto"), "fp8_ds_mla")
        self.assertEqual(rule(named("FLASHINFER_MLA_SPARSE"), "fp8"), "fp8")
        self.assertEqual(rule(named("CUSTOM"), "fp8"), "fp8")


class Glm5OnSm100Test(unittest.TestCase):
    """vllm serve zai-org/GLM-5 -tp 8 --attention-backend KFORGE_MLA_SPARSE on
    a B200 (10.0) or a B300 (10.3), default flags: vLLM's GLM-5 config makes
    the cache fp8_e4m3 on sm_10x (GlmMoeDsaForCausalLM.verify_and_update_config, as VllmConfig
    runs it); the backend is selected, the layer writes fp8_ds_mla, the
    impl asks kforge for the fp8_ds_mla kernel and a decode step reaches it
    through vLLM's forward_mqa with the 656-byte records."""

    def test_default_flags_select_build_and_decode(self):
        for capability in ((10, 0), (10, 3)):
            with self.subTest(capability=capability):
                self.select_build_and_decode(capability)

    def select_build_and_decode(self, capability):
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.models.config import GlmMoeDsaForCausalLM
        from kforge_vllm import backend as plugin_backend
        from kforge_vllm.backend import KforgeSparseMlaBackend
        cfg = vllm_config(GLM5, "glm5-b200", tp=8)
        cfg.attention_config.backend = kforge_member()  # --attention-backend KFORGE_MLA_SPARSE
        plugin_backend._cores.clear()
        ReferenceDecoder.made.clear()
        with cuda_platform(capability):
            GlmMoeDsaForCausalLM.verify_and_update_config(cfg)
            self.assertEqual(cfg.cache_config.cache_dtype, "fp8_e4m3")  # vLLM's default there
            layer = build_layer(cfg, "b200", None)
        self.assertIs(layer.attn_backend, KforgeSparseMlaBackend)
        self.assertEqual(layer.kv_cache_dtype, "fp8_ds_mla")
        decoder = ReferenceDecoder.made[0]
        self.assertEqual((decoder.spec.num_q_heads, decoder.spec.kv_cache_dtype,
                          decoder.spec.kv_scale_format), (8, 2, 2))
        with set_current_vllm_config(cfg):
            spec = layer.get_kv_cache_spec(cfg)
        self.assertEqual(spec.page_size_bytes, 656 * 64)
        # One decode step (2 requests) through vLLM's forward_mqa.
        _, md, positions = build_metadata(cfg, [1, 1], [10, 70], [[3], [1, 2]])
        buffer = layer.impl.topk_indices_buffer
        for t, pos in enumerate(positions.tolist()):
            buffer[t, :pos + 1] = torch.arange(pos + 1, dtype=torch.int32)
        kv = torch.zeros(4, 64, 656, dtype=torch.uint8)
        q = torch.randn(2, 8, 576).bfloat16()
        out, lse = ImplTest.forward(None, layer.impl, (q[..., :512], q[..., 512:]), kv, md)
        self.assertIsNone(lse)
        self.assertEqual(tuple(out.shape), (2, 8, 512))
        call = decoder.calls[-1]
        self.assertEqual((call["pages"].dtype, call["pages"].shape[-1]), (torch.uint8, 656))
        self.assertTrue(torch.equal(call["q"], q))
        self.assertEqual(call["topk_length"].tolist(), [10, 70])


class KvCacheTest(unittest.TestCase):
    """The cache vLLM's allocator lays out for the backend's spec, viewed as
    the core views it (core.flat_pages), is one kforge's decode accepts."""

    def layer_views(self, cache_dtype, head_size, num_layers=3, num_blocks=16):
        from vllm.v1.kv_cache_interface import (KVCacheConfig, KVCacheGroupSpec, KVCacheLayout,
                                                KVCacheTensor, MLAAttentionSpec)
        from vllm.v1.worker.utils import allocate_kv_cache, customize_attention_spec
        from kforge_vllm.backend import KforgeSparseMlaBackend
        fp8 = cache_dtype == "fp8_ds_mla"
        spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=head_size,
                                dtype=torch.uint8 if fp8 else torch.bfloat16,
                                cache_dtype_str=cache_dtype,
                                state_content_bytes=656 if fp8 else None)
        spec = customize_attention_spec(KforgeSparseMlaBackend, spec)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]
        page = spec.page_size_bytes
        views = {}
        # Layer-outermost and block-outermost placements (the second puts
        # the other layers' pages between a layer's blocks).
        for layout_name, layer_stride, block_stride in (
                ("layers apart", page * num_blocks, page),
                ("blocks interleaved", page, page * num_layers)):
            config = KVCacheConfig(
                num_blocks=num_blocks,
                kv_cache_tensors=[KVCacheTensor(size=page * num_blocks * num_layers,
                                                layers=names,
                                                layer_stride=layer_stride,
                                                block_stride=block_stride)],
                kv_cache_groups=[KVCacheGroupSpec(names, spec)])
            caches = allocate_kv_cache(config, torch.device("cpu"), list(KVCacheLayout)[0])
            views[layout_name] = [caches[n].squeeze(1) for n in names]  # as the layer does
        return spec, views

    def check(self, cache_dtype, rope_dim, kforge_kv_dtype):
        import kforge
        from kforge import ops
        from kforge_vllm import core
        spec, views = self.layer_views(cache_dtype, 512 + rope_dim)
        kspec = core.attention_spec(num_heads=8, kv_lora_rank=512, rope_dim=rope_dim, topk=2048,
                                    page_size=64, softmax_scale=0.0625, cache_dtype=cache_dtype)
        row_bytes = kforge.kv_row_bytes_for(kspec)
        d_qk = 512 + kspec.rope_dim
        self.assertEqual(kforge_kv_dtype, "fp8_ds_mla" if row_bytes else "bf16")
        for layout, caches in views.items():
            for kv in caches:
                self.assertEqual(kv.dim(), 3, layout)
                self.assertEqual(kv.shape[1], 64, layout)
                self.assertEqual(kv.shape[2], row_bytes or d_qk, layout)
                self.assertEqual(kv.dtype, torch.uint8 if row_bytes else torch.bfloat16)
                pages = core.flat_pages(kv, 64)
                self.assertEqual(pages.data_ptr(), kv.data_ptr(), layout)
                q = ops.TensorInfo("q", (4, 8, d_qk), (8 * d_qk, d_qk, 1), "bfloat16",
                                   ("cuda", 0), 0, 2)
                idx = ops.TensorInfo("indices", (4, 2048), (2048, 1), "int32", ("cuda", 0), 0, 4)
                info = ops.tensor_info("kv_cache", pages)._replace(device=("cuda", 0))
                dims = ops.check_decode_inputs(q, info, idx, kv_row_bytes=row_bytes)
                self.assertEqual(dims.page_block_size, 64)
                self.assertEqual(dims.kv_page_stride, 64 * kv.shape[2])
                # Every slot of vLLM's numbering of the layer's last block.
                last = (kv.shape[0] - 1) * (kv.stride(0) // kv.shape[2]) + 63
                self.assertEqual(dims.num_kv_slots, last + 1, layout)
                # Rows start 16-byte aligned (kforge's cp.async gathers).
                self.assertEqual(kv.stride(0) * kv.element_size() % 16, 0)
                self.assertEqual(kv.stride(1) * kv.element_size() % 16, 0)

    def test_bf16(self):
        self.check("auto", 64, "bf16")

    def test_fp8_ds_mla(self):
        self.check("fp8_ds_mla", 64, "fp8_ds_mla")

    def test_nope_bf16_and_fp8_ds_mla(self):
        self.check("auto", 0, "bf16")
        self.check("fp8_ds_mla", 0, "fp8_ds_mla")


if __name__ == "__main__":
    unittest.main()

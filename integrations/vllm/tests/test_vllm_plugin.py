"""CPU tests of kforge-vllm against the real vLLM package (0.33), run by
scripts/test_vllm_plugin.sh in a venv holding vLLM, kforge and kforge-vllm.

  - the entry point loads through vLLM's own plugin loader
    (vllm.plugins.load_general_plugins) and registers CUSTOM, and with
    KFORGE_VLLM_TAKE_OVER=1 the sm_120 sparse-MLA slot too;
  - the backend classes implement vLLM's abstract interfaces;
  - vLLM's CUDA backend selection resolves to the backend for GLM-5- and
    DeepSeek-V3.2-shaped model configs (read from config.json files by
    vLLM's ModelConfig) with --attention-backend CUSTOM, and on device
    capability (12, 0) with the take-over, and not without it;
  - configurations kforge cannot serve are declined with the reason;
  - the metadata builder, run on vLLM's BlockTable and
    CommonAttentionMetadata for a batch of decode, MTP and prefill
    requests, gives the slots a reference computes;
  - the impl, built with the arguments vLLM's MLA layer passes, makes the
    spec from them (heads per rank, scale, ranks, top-k), shares one core
    across layers, and its forward_mqa gives the reference attention (the
    kernel call itself replaced by fp64 on the CPU);
  - the KV cache vLLM's allocator lays out for the backend's spec is what
    kforge's decode accepts (row bytes, page size, strides).

vLLM's Triton kernels do not run without a GPU driver, so the two the
metadata path calls are given their answers: the token -> request map and
the slot mapping (the slots the tokens' own KV goes to). vLLM's CUDA
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


def vllm_config(config, name, tp=1, cache_dtype="auto"):
    """A VllmConfig for a config.json, as `vllm serve` would build it (no
    weights, no tokenizer, no GPU)."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig
    model = ModelConfig(model=model_dir(name, config), skip_tokenizer_init=True,
                        dtype="bfloat16", max_model_len=8192)
    return VllmConfig(model_config=model, device_config=DeviceConfig(device="cpu"),
                      parallel_config=ParallelConfig(tensor_parallel_size=tp),
                      cache_config=CacheConfig(block_size=64, cache_dtype=cache_dtype))


def selector_config(kv_cache_dtype, head_size=576):
    from vllm.v1.attention.selector import AttentionSelectorConfig
    return AttentionSelectorConfig(head_size=head_size, dtype=torch.bfloat16,
                                   kv_cache_dtype=kv_cache_dtype, block_size=None, use_mla=True,
                                   use_sparse=True)


def select(cfg, backend, capability, kv_cache_dtype):
    """The backend class path vLLM's CUDA platform picks on a device of
    `capability` for the current model (backend None: automatic)."""
    from vllm.config import set_current_vllm_config
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    with set_current_vllm_config(cfg), \
            mock.patch.object(CudaPlatform, "get_device_capability",
                              return_value=DeviceCapability(*capability)):
        heads = cfg.model_config.get_num_attention_heads(cfg.parallel_config)
        return CudaPlatform.get_attn_backend_cls(backend, selector_config(kv_cache_dtype),
                                                 num_heads=heads)


class PluginLoadingTest(unittest.TestCase):
    """Through vLLM's loader, in fresh processes (plugins load once per
    process)."""

    def load(self, take_over):
        env = dict(os.environ)
        env.pop("KFORGE_VLLM_TAKE_OVER", None)
        if take_over is not None:
            env["KFORGE_VLLM_TAKE_OVER"] = take_over
        code = ("from vllm.plugins import load_general_plugins\n"
                "from vllm.v1.attention.backends.registry import AttentionBackendEnum as E\n"
                "load_general_plugins()\n"
                "print('PATHS', E.CUSTOM.get_path(), E.FLASHINFER_MLA_SPARSE_SM120.get_path())\n")
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=600)
        return proc

    def test_entry_point_registers_custom_and_takes_over_on_request(self):
        from kforge_vllm import BACKEND
        plain = self.load(None)
        self.assertEqual(plain.returncode, 0, plain.stderr[-3000:])
        paths = plain.stdout.split("PATHS", 1)[1].split()
        self.assertEqual(paths[0], BACKEND)
        self.assertNotEqual(paths[1], BACKEND)  # vLLM's own sm_120 backend stays
        taken = self.load("1")
        self.assertEqual(taken.returncode, 0, taken.stderr[-3000:])
        self.assertEqual(taken.stdout.split("PATHS", 1)[1].split(), [BACKEND, BACKEND])

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
        self.assertIn(B.get_name(), AttentionBackendEnum.__members__)
        impl, builder = B.get_impl_cls(), B.get_builder_cls()
        self.assertTrue(issubclass(impl, SparseMLACommonImpl))
        self.assertFalse(getattr(impl, "__abstractmethods__", None))
        self.assertTrue(issubclass(builder, SparseMLACommonMetadataBuilder))
        self.assertTrue(issubclass(builder.metadata_cls, SparseMLACommonMetadata))
        self.assertTrue(B.is_mla() and B.is_sparse())
        self.assertFalse(B.supports_dcp() or B.supports_pcp())
        self.assertIs(builder._cudagraph_support, AttentionCGSupport.UNIFORM_BATCH)
        # The impl runs every token through forward_mqa (kforge prefill).
        self.assertFalse(impl.supports_dense_mha_prefill)
        self.assertIsNot(impl.forward_mqa, SparseMLACommonImpl.forward_mqa)


class SelectionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import kforge_vllm
        kforge_vllm.register()  # CUSTOM (the loader test covers the entry point)
        cls.glm5_tp8 = vllm_config(GLM5, "glm5", tp=8)
        cls.dsv32 = vllm_config(DEEPSEEK_V32, "dsv32")

    def test_custom_resolves_to_kforge(self):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from kforge_vllm import BACKEND
        for cfg in (self.glm5_tp8, self.dsv32):
            for kv in ("auto", "bfloat16", "fp8_ds_mla"):
                for capability in ((12, 0), (9, 0), (8, 0)):
                    self.assertEqual(select(cfg, AttentionBackendEnum.CUSTOM, capability, kv),
                                     BACKEND, (cfg.model_config.model, kv, capability))

    def test_take_over_picks_kforge_on_sm120_only(self):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
        from kforge_vllm import BACKEND, register
        slot = AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120
        original = slot.get_path()
        try:
            with mock.patch.dict(os.environ, {"KFORGE_VLLM_TAKE_OVER": "1"}):
                register()
            for cfg in (self.glm5_tp8, self.dsv32):
                self.assertEqual(select(cfg, None, (12, 0), "fp8_ds_mla"), BACKEND)
                self.assertEqual(select(cfg, None, (12, 0), "auto"), BACKEND)
                # Elsewhere vLLM keeps its own choice.
                try:
                    picked = select(cfg, None, (9, 0), "fp8_ds_mla")
                except ValueError:
                    picked = None  # no vLLM kernel importable here: still not kforge
                self.assertNotEqual(picked, BACKEND)
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
            self.assertNotEqual(picked, BACKEND)

    def test_unsupported_configurations_are_declined_with_the_reason(self):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        custom = AttentionBackendEnum.CUSTOM
        cases = (
            (self.dsv32, "fp8", 576, "kv_cache_dtype"),
            (vllm_config(DEEPSEEK_V3, "dsv3"), "auto", 576, "no index_topk"),
            (vllm_config(dict(DEEPSEEK_V32, num_attention_heads=256, num_key_value_heads=256),
                         "heads256"), "auto", 576, "num_q_heads: got 256, supported 1..128"),
            (vllm_config(dict(DEEPSEEK_V32, index_topk=20000), "topk20000"), "auto", 576,
             "topk: got 20000"),
            (self.dsv32, "auto", 512, "head_size not supported"),  # NoPE
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


@contextlib.contextmanager
def no_pinned_memory():
    """The CPU is the "device" here: vLLM's buffers take no pinned staging
    copies (pinning asks a CUDA driver)."""
    with mock.patch("vllm.v1.utils.PIN_MEMORY", False), \
            mock.patch("vllm.model_executor.layers.attention.sparse_mla_attention.PIN_MEMORY",
                       False):
        yield


def reference_slots(topk, query_lens, block_rows, page):
    """Slot of every (token, k) by the definition: the token's request's
    block for position // page, times page, plus position % page."""
    out, token = [], 0
    for req, q_len in enumerate(query_lens):
        for _ in range(q_len):
            row = []
            for pos in topk[token].tolist():
                row.append(-1 if pos < 0 else block_rows[req][pos // page] * page + pos % page)
            out.append(row)
            token += 1
    return torch.tensor(out, dtype=torch.int32)


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

    def test_slots_match_the_reference_for_decode_mtp_and_prefill(self):
        from kforge_vllm import core
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
        want = reference_slots(topk, query_lens, block_rows, 64)
        # A position past the block table's width is no token (as vLLM's
        # own conversion reads it).
        topk[-1, -1] = md.block_table.shape[1] * 64 + 5
        want[-1, -1] = -1
        slots = core.topk_to_slots(topk, md.req_id_per_token, md.block_table, 64)
        self.assertEqual(slots.dtype, torch.int32)
        self.assertTrue(torch.equal(slots, want))
        # Each token's own position maps to the slot its KV is written to.
        own = torch.tensor([row.index(p) for row, p in
                            zip(topk.tolist(), positions.tolist())])
        self.assertTrue(torch.equal(slots[torch.arange(num_tokens), own].long(),
                                    md.slot_mapping[:num_tokens].long()))
        # A buffer wider than topk (vLLM pads it) reads the first topk columns.
        wide = torch.cat([topk, torch.full((num_tokens, 64), 7, dtype=torch.int32)], 1)
        self.assertTrue(torch.equal(
            core.topk_to_slots(wide[:, :2048], md.req_id_per_token, md.block_table, 64), want))

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


class ReferenceCore(plugin_core.SparseMlaCore):
    """Stands in for kforge_vllm.core.SparseMlaCore where there is no GPU:
    its slot translation, and fp64 attention in place of the kernel
    (check_core_gpu.py checks the kernel against the same reference)."""

    made = []

    def __init__(self, spec, device=None, source=None):
        self.spec, self.page_size, self.topk = spec, spec.page_block_size, spec.topk
        self.kv_lora_rank = spec.kv_lora_rank
        self.decoder = types.SimpleNamespace(arch="sm_120a")
        ReferenceCore.made.append(spec)

    def prefetch(self):
        return 1

    def __call__(self, q, kv_cache, slots, out=None):
        q = torch.cat(q, -1) if isinstance(q, tuple) else q
        rows = kv_cache.reshape(-1, kv_cache.shape[-1]).double()
        valid = slots >= 0
        kv = rows[torch.where(valid, slots, 0).long()] * valid[..., None]
        s = torch.einsum("thd,tkd->thk", q.double(), kv) * self.spec.softmax_scale
        p = torch.softmax(s.masked_fill(~valid[:, None, :], float("-inf")), -1).nan_to_num(0.0)
        return torch.einsum("thk,tkd->thd", p, kv[..., :self.kv_lora_rank]).bfloat16()


class ImplTest(unittest.TestCase):
    """KforgeSparseMlaImpl built the way vLLM's MLA layer builds it (the
    same keyword arguments) and its forward_mqa on a metadata batch."""

    def make_impl(self, cfg, topk_buffer, scale, kv_cache_dtype="auto"):
        from vllm.config import set_current_vllm_config
        from kforge_vllm.backend import KforgeSparseMlaBackend
        from kforge_vllm import backend
        text = cfg.model_config.hf_text_config
        heads = cfg.model_config.get_num_attention_heads(cfg.parallel_config)
        with set_current_vllm_config(cfg), \
                mock.patch.object(backend.core, "SparseMlaCore", ReferenceCore), \
                mock.patch("vllm.model_executor.layers.attention.sparse_mla_attention."
                           "get_tensor_model_parallel_world_size",
                           return_value=cfg.parallel_config.tensor_parallel_size):
            return KforgeSparseMlaBackend.get_impl_cls()(
                num_heads=heads, head_size=576, scale=scale, num_kv_heads=1, alibi_slopes=None,
                sliding_window=None, kv_cache_dtype=kv_cache_dtype, logits_soft_cap=None,
                attn_type="decoder", kv_sharing_target_layer_name=None,
                q_lora_rank=text.q_lora_rank, kv_lora_rank=text.kv_lora_rank,
                qk_nope_head_dim=text.qk_nope_head_dim, qk_rope_head_dim=text.qk_rope_head_dim,
                qk_head_dim=text.qk_nope_head_dim + text.qk_rope_head_dim,
                v_head_dim=text.v_head_dim, kv_b_proj=None, indexer=None,
                topk_indices_buffer=topk_buffer)

    def test_spec_from_vllms_arguments_and_forward(self):
        from kforge_vllm import backend
        cfg = vllm_config(GLM5, "glm5-impl", tp=8)
        tokens, width = 6, 2048 + 16  # vLLM's buffer may be wider than top-k
        buffer = torch.full((64, width), -1, dtype=torch.int32)
        backend._cores.clear()
        ReferenceCore.made.clear()
        impls = [self.make_impl(cfg, buffer, 0.0625) for _ in range(2)]  # two layers
        self.assertEqual(len(ReferenceCore.made), 1, "layers of one shape share one core")
        spec = ReferenceCore.made[0]
        self.assertEqual((spec.num_q_heads, spec.kv_lora_rank, spec.rope_dim, spec.topk,
                          spec.page_block_size, spec.kv_cache_dtype, spec.return_lse),
                         (8, 512, 64, 2048, 64, 1, False))
        self.assertAlmostEqual(spec.softmax_scale, 0.0625)
        self.assertIs(impls[0].core, impls[1].core)
        # One step: 2 decodes + a 4-token MTP verification.
        query_lens, seq_lens = [1, 1, 4], [70, 130, 200]
        rows = [[5, 9], [2, 0, 7], [1, 3, 4, 6]]
        _, md, positions = build_metadata(cfg, query_lens, seq_lens, rows)
        gen = torch.Generator().manual_seed(2)
        for t, pos in enumerate(positions.tolist()):
            buffer[t, :pos + 1] = torch.randperm(pos + 1, generator=gen).to(torch.int32)
        buffer[:, 2048:] = 3  # padding columns: never read
        kv = torch.randn(10, 64, 576, generator=gen).bfloat16()
        q_latent = torch.randn(tokens, 8, 512, generator=gen).bfloat16()
        q_rope = torch.randn(tokens, 8, 64, generator=gen).bfloat16()
        out, lse = impls[1].forward_mqa((q_latent, q_rope), kv, md, layer=None)
        self.assertIsNone(lse)
        self.assertEqual(tuple(out.shape), (tokens, 8, 512))
        slots = reference_slots(buffer[:tokens, :2048], query_lens, rows, 64)
        want = ReferenceCore(spec)(torch.cat([q_latent, q_rope], -1), kv, slots)
        self.assertTrue(torch.equal(out, want))

    def test_declines_what_it_cannot_serve(self):
        cfg = vllm_config(GLM5, "glm5-impl2", tp=8)
        with self.assertRaisesRegex(NotImplementedError, "top-k buffer"):
            self.make_impl(cfg, None, 0.0625)
        with self.assertRaisesRegex(ValueError, "kv_cache_dtype: got 'fp8'"):
            self.make_impl(cfg, torch.zeros(4, 2048, dtype=torch.int32), 0.0625, "fp8")


class KvCacheTest(unittest.TestCase):
    """The cache vLLM's allocator lays out for the backend's spec, as the
    MLA layer sees it, is one kforge's decode accepts."""

    def layer_views(self, cache_dtype, num_layers=3, num_blocks=16):
        from vllm.v1.kv_cache_interface import (KVCacheConfig, KVCacheGroupSpec, KVCacheLayout,
                                                KVCacheTensor, MLAAttentionSpec)
        from vllm.v1.worker.utils import allocate_kv_cache, customize_attention_spec
        from kforge_vllm.backend import KforgeSparseMlaBackend
        fp8 = cache_dtype == "fp8_ds_mla"
        spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576,
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

    def check(self, cache_dtype, kforge_kv_dtype):
        import kforge
        from kforge import ops
        from kforge_vllm import core
        spec, views = self.layer_views(cache_dtype)
        kspec = core.attention_spec(num_heads=8, kv_lora_rank=512, rope_dim=64, topk=2048,
                                    page_size=64, softmax_scale=0.0625, cache_dtype=cache_dtype)
        row_bytes = kforge.kv_row_bytes_for(kspec)
        self.assertEqual(kforge_kv_dtype, "fp8_ds_mla" if row_bytes else "bf16")
        for layout, caches in views.items():
            for kv in caches:
                self.assertEqual(kv.dim(), 3, layout)
                self.assertEqual(kv.shape[1], 64, layout)
                self.assertEqual(kv.shape[2], row_bytes or 576, layout)
                self.assertEqual(kv.dtype, torch.uint8 if row_bytes else torch.bfloat16)
                q = ops.TensorInfo("q", (4, 8, 576), (8 * 576, 576, 1), "bfloat16",
                                   ("cuda", 0), 0, 2)
                idx = ops.TensorInfo("indices", (4, 2048), (2048, 1), "int32", ("cuda", 0), 0, 4)
                info = ops.tensor_info("kv_cache", kv)._replace(device=("cuda", 0))
                dims = ops.check_decode_inputs(q, info, idx, kv_row_bytes=row_bytes)
                self.assertEqual(dims.page_block_size, 64)
                self.assertEqual(dims.kv_page_stride, kv.stride(0))
                self.assertEqual(dims.num_kv_slots, kv.shape[0] * 64)
                # Rows start 16-byte aligned (kforge's cp.async gathers).
                self.assertEqual(kv.stride(0) * kv.element_size() % 16, 0)
                self.assertEqual(kv.stride(1) * kv.element_size() % 16, 0)

    def test_bf16(self):
        self.check("auto", "bf16")

    def test_fp8_ds_mla(self):
        self.check("fp8_ds_mla", "fp8_ds_mla")


if __name__ == "__main__":
    unittest.main()

"""The DSA lightning indexer (ATTENTION_KIND_DSA_INDEXER) on PyTorch tensors:
fp8 MQA logits over a paged index-key cache, the top-k positions per query
row and their cache slots, from a module `kforge compile --kind
dsa-indexer` wrote (<module>.cubin, <module>.cubin.<i> for its further images,
<module>.json).

    ix = kforge.DsaIndexer.from_files("out/dsa_indexer_h64_d128_topk2048_pb64_sm90a.cubin")
    indices, slots = kforge.dsa_indexer_topk(ix, q, weights, index_cache, block_table,
                                             context_lens, max_context=32768,
                                             mla_block_table=block_table)

The computation and the page layout are docs/DESIGN.md's ("The DSA lightning
indexer"). What is Python's own here is reading torch tensor metadata into
the C structs model/indexer_plan.h checks (dtype, device and layout, which
those structs do not carry) and the launch; the argument checks, grids and
parameter blocks are the C++ PlanIndexerLogits / PlanIndexerTopk's, through
the C ABI (kforge._capi.plan_indexer). Launches are
enqueued on torch's current stream with no host synchronisation and no
allocation when the outputs are given, so a call can be captured in a CUDA
graph (max_context is the caller's, never read from context_lens).

Tensors. Decode: rows = batch * s_q; row b * s_q + i is request b's query
i, at position context_lens[b] - s_q + i. Prefill (query_start given):
request b's n_b = query_start[b + 1] - query_start[b] query rows (any
number, ragged) are rows query_start[b] + i, at positions context_lens[b]
- n_b + i, each attending positions up to its own (causal); a row no
request holds gets no valid position (-inf logits, -1 indices).
  q            [rows, H, 128] or (decode) [batch, s_q, H, 128],
               torch.float8_e4m3fn or uint8; heads and values contiguous
  query_start  prefill: [batch + 1] int32 contiguous, non-decreasing (the
               cumulative query lengths, vLLM's query_start_loc); rows
               at most 65535 per call
  weights      [rows, H] or [batch, s_q, H] fp32, last dim contiguous
  index_cache  [num_pages, ...] uint8 (or any 1-byte dtype): each page 64 *
               132 contiguous bytes, 64 x 128 e4m3 keys then 64 fp32 scales
  block_table  [batch, max_pages] int32, last dim contiguous
  context_lens [batch] int32 contiguous
  logits       [rows, >= max_context] fp32 (written for [0, max_context),
               -inf where masked)
  indices      [rows, topk] int32: the positions of the top-k logits in
               increasing position order (of logits equal to the k-th,
               the smallest positions), -1 after the valid ones
  slots        [rows, topk] int32: mla_block_table[b, pos // slot_page_size]
               * slot_page_size + pos % slot_page_size, -1 kept
"""

import json
import os

from kforge import _capi, _module
from kforge.errors import KforgeError

PAGE_TOKENS = 64
HEAD_DIM = 128
PAGE_BYTES = PAGE_TOKENS * (HEAD_DIM + 4)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise KforgeError(f"kforge.dsa_indexer needs PyTorch ({e})") from e
    return torch


def _driver():
    """The CUDA driver's version, loaded as kforge loads kernels
    (KforgeError without one)."""
    return _module.driver()


def read_description(cubin_path, json_path=None):
    """(description dict, cubin images) of a module `kforge compile` wrote."""
    if json_path is None:
        json_path = os.path.splitext(cubin_path)[0] + ".json"
    try:
        with open(json_path, encoding="utf-8") as f:
            description = json.load(f)
    except (OSError, ValueError) as e:
        raise KforgeError(f"{json_path}: not a kforge compile description ({e})") from None
    kernels = description.get("cubin_info", {}).get("kernels", [])
    return description, _module.read_images(cubin_path, _module.image_count(kernels))


def description_from_source(source, preset, arch, tp=1):
    """(description dict, cubin images) of a preset's indexer module from a
    kforge source (kforge.Client or kforge.Bundle): its manifest's one
    variant, the kernel checked against it as every kforge kernel is."""
    from kforge._proto import pb
    from kforge.bundle import first_choice
    manifest = source.get_manifest(preset=preset, tp=tp, arch=arch, kind="dsa-indexer")
    artifact = source.get_kernel(first_choice(manifest), arch)
    description = pb().json_format.MessageToDict(artifact, preserving_proto_field_name=True)
    description.pop("cubin", None)
    description.pop("more_cubins", None)
    return description, _module.images_of(artifact)


class DsaIndexer:
    """One DSA indexer module loaded on one GPU."""

    @classmethod
    def from_files(cls, cubin_path, json_path=None, device=None):
        return cls(*read_description(cubin_path, json_path), device=device)

    @classmethod
    def from_source(cls, source, preset, arch, tp=1, device=None):
        """A preset's indexer from a server or bundle (description_from_source)."""
        return cls(*description_from_source(source, preset, arch, tp), device=device)

    def __init__(self, description, images, device=None):
        torch = self._torch = _torch()
        kernel_spec = description.get("spec", {})
        spec = kernel_spec.get("dsa_indexer")
        # An indexer module is one with the indexer's spec and launch (its
        # entries' roles are checked again when it loads).
        if spec is None or not description.get("indexer"):
            kind = ", ".join(kernel_spec) or "none"
            raise KforgeError(f"{description.get('module_name')}: not a DSA indexer module "
                              f"(kind {kind}, no indexer launch)")
        launch = description["indexer"]
        # The module's spec and launch as the C++ plan reads them.
        from google.protobuf import json_format
        from kforge._proto import pb
        self._spec_bytes = json_format.ParseDict(
            kernel_spec, pb().spec_pb2.KernelSpec(),
            ignore_unknown_fields=True).SerializeToString()
        self._launch_bytes = json_format.ParseDict(
            launch, pb().artifact_pb2.IndexerLaunch(),
            ignore_unknown_fields=True).SerializeToString()
        self.description = description
        self.module_name = description["module_name"]
        self.arch = description["arch"]
        self.heads = int(spec["index_heads"])
        self.topk_k = int(spec["topk"])
        self.launch = launch
        self.device = (torch.device("cuda", torch.cuda.current_device()) if device is None
                       else torch.device(device))
        major, minor = torch.cuda.get_device_capability(self.device)
        want = self.arch.removeprefix("sm_").rstrip("a")
        if int(want) // 10 != major or int(want) % 10 > minor:
            raise KforgeError(
                f"{self.module_name} is for {self.arch}; this GPU is sm_{major}{minor}")
        self._image = _module.as_images(images)  # image 0 first
        with torch.cuda.device(self.device):
            torch.zeros(1, device=self.device)  # torch's context is current
            self._module = _module.KernelModule(_module.artifact_of(description, self._image),
                                                _module.DSA_INDEXER_PARAMS, self.device.index)
            # Every entry the plans may name (the top-k cluster entry on
            # sm_90+), by name, with its dynamic shared memory.
            entries = [(launch["logits_entry"], launch["logits_smem_bytes"]),
                       (launch["topk_entry"], launch["topk_smem_bytes"])]
            cluster = launch.get("topk_cluster")
            if cluster:
                entries.append((cluster["entry"], cluster["smem_bytes"]))
            for entry, smem in entries:
                if int(smem) > 48 * 1024:  # above 48 KB a kernel opts in, per device
                    self._module.set_max_dynamic_smem(entry, int(smem))
            # (index, block bytes) of each, as the module's launch takes them.
            self._entries = {e: self._module.entry(e) for e, _ in entries}
            # Into torch's context now, not at a first launch (which may
            # come inside a CUDA graph capture).
            self._module.load_into_current_context()

    def _launch(self, kind, args):
        """Plans one kernel (PlanIndexerLogits / PlanIndexerTopk: raises
        KforgeInvalidArgument, a ValueError, naming the field) and launches
        it on torch's current stream."""
        plan = _capi.plan_indexer(kind, self._spec_bytes, self._launch_bytes, args)
        grid = (plan.grid_x, plan.grid_y, plan.grid_z)
        stream = self._torch.cuda.current_stream(self.device).cuda_stream
        entry = self._entries.get(plan.main_entry)
        if entry is None:
            raise KforgeError(f"{self.module_name}: the plan names {plan.main_entry!r}, which "
                              f"the module's launch does not name")
        self._module.launch(entry[0], plan.main_params, len(plan.main_params), *grid,
                            plan.block_threads, plan.dynamic_smem_bytes, stream,
                            plan.programmatic)

    # ------------------------------------------------------------ checks

    def _expect(self, cond, message):
        if not cond:
            raise ValueError(message)

    def _query_start(self, query_start, batch):
        """The prefill row map's address (0 for decode)."""
        if query_start is None:
            return 0
        torch = self._torch
        self._expect(query_start.dtype == torch.int32 and query_start.is_contiguous() and
                     tuple(query_start.shape) == (batch + 1,) and
                     query_start.device == self.device,
                     f"query_start: expected int32 [{batch + 1}] contiguous on {self.device}")
        return query_start.data_ptr()

    def _rows(self, q, weights, context_lens, prefill=False):
        torch = self._torch
        self._expect(q.device == self.device, f"q: on {q.device}, the module is on {self.device}")
        self._expect(q.element_size() == 1, f"q: dtype {q.dtype}, expected float8_e4m3fn / uint8")
        if prefill:
            self._expect(q.dim() == 3, f"q: {q.dim()} dims, expected [rows, H, 128] in prefill")
            batch, s_q = context_lens.shape[0], 0
        elif q.dim() == 4:
            batch, s_q = q.shape[0], q.shape[1]
            self._expect(q.stride(0) == s_q * q.stride(1), "q: batch and s_q must merge")
            q = q.flatten(0, 1)
        else:
            self._expect(q.dim() == 3, f"q: {q.dim()} dims, expected 3 or 4")
            batch = context_lens.shape[0]
            self._expect(batch > 0 and q.shape[0] % batch == 0,
                         f"q: {q.shape[0]} rows, not a multiple of batch {batch}")
            s_q = q.shape[0] // batch
        self._expect(tuple(q.shape[1:]) == (self.heads, HEAD_DIM),
                     f"q: {tuple(q.shape)}, expected [rows, {self.heads}, {HEAD_DIM}]")
        self._expect(q.stride(2) == 1 and q.stride(1) == HEAD_DIM and q.stride(0) % 16 == 0,
                     "q: heads and values must be contiguous, rows 16-byte aligned")
        self._expect(q.data_ptr() % 16 == 0, "q: not 16-byte aligned")
        self._expect(context_lens.dtype == torch.int32 and context_lens.is_contiguous()
                     and tuple(context_lens.shape) == (batch,),
                     f"context_lens: expected int32 [{batch}] contiguous")
        w = weights.flatten(0, 1) if weights.dim() == 3 else weights
        self._expect(w.dtype == torch.float32 and tuple(w.shape) == (q.shape[0], self.heads)
                     and w.stride(1) == 1,
                     f"weights: expected fp32 [{q.shape[0]}, {self.heads}], last dim contiguous")
        return q, w, batch, s_q

    # ------------------------------------------------------------ kernels

    def logits(self, q, weights, index_cache, block_table, context_lens, max_context, out=None,
               *, query_start=None):
        """Writes fp32 logits [rows, max_context] (out, or a new tensor) and
        returns it. query_start: prefill's ragged rows (module notes)."""
        torch = self._torch
        q, w, batch, s_q = self._rows(q, weights, context_lens, prefill=query_start is not None)
        qs_ptr = self._query_start(query_start, batch)
        rows = q.shape[0]
        self._expect(index_cache.element_size() == 1 and index_cache.dim() >= 1 and
                     index_cache[0].numel() == PAGE_BYTES and index_cache[0].is_contiguous() and
                     index_cache.stride(0) % 16 == 0 and index_cache.data_ptr() % 16 == 0,
                     f"index_cache: pages of {PAGE_BYTES} contiguous bytes, 16-byte aligned")
        self._expect(block_table.dtype == torch.int32 and block_table.dim() == 2 and
                     block_table.shape[0] == batch and block_table.stride(1) == 1,
                     f"block_table: expected int32 [{batch}, pages], last dim contiguous")
        self._expect(max_context >= 1 and block_table.shape[1] * PAGE_TOKENS >= max_context,
                     f"max_context {max_context}: block_table covers "
                     f"{block_table.shape[1] * PAGE_TOKENS} positions")
        if out is None:
            out = torch.empty(rows, max_context, dtype=torch.float32, device=self.device)
        self._expect(out.dtype == torch.float32 and out.dim() == 2 and out.shape[0] == rows and
                     out.shape[1] >= max_context and out.stride(1) == 1,
                     f"logits: expected fp32 [{rows}, >= {max_context}], last dim contiguous")
        args = _capi.IndexerLogitsArgs(
            q=q.data_ptr(), weights=w.data_ptr(), index_cache=index_cache.data_ptr(),
            block_table=block_table.data_ptr(), context_lens=context_lens.data_ptr(),
            logits=out.data_ptr(), q_row_stride=q.stride(0), weights_row_stride=w.stride(0),
            page_stride=index_cache.stride(0), block_table_stride=block_table.stride(0),
            block_table_cols=block_table.shape[1], logits_stride=out.stride(0),
            logits_cols=out.shape[1], batch=batch, s_q=s_q, max_context=max_context,
            rows=rows if qs_ptr else 0, query_start=qs_ptr)
        self._launch("logits", args)
        return out

    def topk(self, logits, context_lens, s_q, indices=None, *, mla_block_table=None, slots=None,
             slot_page_size=64, max_context=None, query_start=None):
        """Top-k positions of each row's valid logits (positions below
        max_context, default logits.shape[1]; int32 [rows, topk], indices
        or a new tensor) and, with mla_block_table, their slots
        (slots or a new tensor; else None). Returns (indices, slots).
        Prefill: query_start (module notes) and s_q None or 0; the rows are
        logits'."""
        torch = self._torch
        batch = context_lens.shape[0]
        qs_ptr = self._query_start(query_start, batch)
        if qs_ptr:
            self._expect(not s_q, f"s_q: got {s_q}; with query_start pass None or 0")
            s_q, rows = 0, logits.shape[0] if logits.dim() == 2 else -1
        else:
            rows = batch * s_q
        self._expect(context_lens.dtype == torch.int32 and context_lens.is_contiguous(),
                     "context_lens: int32 contiguous")
        self._expect(logits.dtype == torch.float32 and logits.dim() == 2 and
                     logits.shape[0] == rows and logits.stride(1) == 1,
                     f"logits: expected fp32 [{rows}, positions], last dim contiguous")
        k = self.topk_k
        if indices is None:
            indices = torch.empty(rows, k, dtype=torch.int32, device=self.device)
        self._expect(indices.dtype == torch.int32 and tuple(indices.shape) == (rows, k) and
                     indices.stride(1) == 1, f"indices: expected int32 [{rows}, {k}]")
        table_ptr = table_stride = slots_ptr = slots_stride = 0
        if mla_block_table is not None:
            self._expect(mla_block_table.dtype == torch.int32 and mla_block_table.dim() == 2 and
                         mla_block_table.shape[0] == batch and mla_block_table.stride(1) == 1,
                         f"mla_block_table: expected int32 [{batch}, pages]")
            if slots is None:
                slots = torch.empty(rows, k, dtype=torch.int32, device=self.device)
            self._expect(slots.dtype == torch.int32 and tuple(slots.shape) == (rows, k) and
                         slots.stride(1) == 1, f"slots: expected int32 [{rows}, {k}]")
            table_ptr, table_stride = mla_block_table.data_ptr(), mla_block_table.stride(0)
            slots_ptr, slots_stride = slots.data_ptr(), slots.stride(0)
        self._expect(slot_page_size >= 1, "slot_page_size: >= 1")
        if max_context is None:
            max_context = logits.shape[1]
        self._expect(1 <= max_context <= logits.shape[1],
                     f"max_context: got {max_context}, supported 1..{logits.shape[1]}")
        args = _capi.IndexerTopkArgs(
            logits=logits.data_ptr(), context_lens=context_lens.data_ptr(),
            indices=indices.data_ptr(), block_table=table_ptr, slots=slots_ptr,
            logits_stride=logits.stride(0), indices_stride=indices.stride(0),
            block_table_stride=table_stride, slots_stride=slots_stride, batch=batch, s_q=s_q,
            slot_page_size=slot_page_size, max_context=max_context, query_start=qs_ptr,
            rows=rows if qs_ptr else 0)
        self._launch("topk", args)
        return indices, slots


def dsa_indexer_topk(indexer, q, weights, index_cache, block_table, context_lens, *,
                     max_context, mla_block_table=None, slot_page_size=64, logits=None,
                     indices=None, slots=None, query_start=None):
    """Logits then top-k on torch's current stream (CUDA-graph safe: no
    sync; allocates only the outputs not given). Returns (indices, slots);
    slots is None without mla_block_table. query_start: prefill's ragged
    rows (module notes)."""
    if query_start is not None:
        s_q = 0
    else:
        s_q = q.shape[1] if q.dim() == 4 else q.shape[0] // max(1, context_lens.shape[0])
    logits = indexer.logits(q, weights, index_cache, block_table, context_lens, max_context,
                            out=logits, query_start=query_start)
    return indexer.topk(logits, context_lens, s_q, indices, mla_block_table=mla_block_table,
                        slots=slots, slot_page_size=slot_page_size, max_context=max_context,
                        query_start=query_start)


def quantize_index_keys(keys):
    """keys [tokens, 128] float -> (e4m3 values uint8 [tokens, 128], fp32
    scales [tokens]) as the models' writers do: scale = max(amax, 1e-4) /
    448 per token (docs/DESIGN.md)."""
    torch = _torch()
    k = keys.float()
    scale = k.abs().amax(dim=-1).clamp(min=1e-4) / 448.0
    values = (k / scale[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return values, scale


def write_index_pages(values, scales, num_pages, page_of_position):
    """A cache uint8 [num_pages, 64 * 132] holding token p's key at page
    page_of_position[p // 64], row p % 64 (values [tokens, 128] uint8,
    scales [tokens] fp32); other bytes zero."""
    torch = _torch()
    cache = torch.zeros(num_pages, PAGE_BYTES, dtype=torch.uint8, device=values.device)
    tokens = values.shape[0]
    pos = torch.arange(tokens, device=values.device)
    page = page_of_position[pos // PAGE_TOKENS].long()
    row = pos % PAGE_TOKENS
    vals = cache[:, :PAGE_TOKENS * HEAD_DIM].view(num_pages, PAGE_TOKENS, HEAD_DIM)
    vals[page, row] = values
    sc = cache[:, PAGE_TOKENS * HEAD_DIM:].view(torch.float32)
    sc[page, row] = scales.float()
    return cache

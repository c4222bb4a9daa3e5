"""One PlanDecode per call signature: what lets an eager decode call cost
pointer arithmetic and a launch.

PlanDecode (model/decode_plan.h, through the C ABI) checks a call and
returns its launch and parameter blocks. Its result depends on the pointers
only through whether each is null and its value modulo
kDecodePointerModulus, and it copies them into the blocks at fields whose
offsets the library reports (kforge_offsetof). So PlanCache keys a plan on
everything the checks read (every tensor's shape, strides, dtype and device,
each pointer's class, the scale) and, on a hit, only writes the call's
pointers into the plan's prebuilt blocks. Each new plan is checked against
C++ once: the same call planned again with other pointers of the same
classes must give exactly the blocks this module writes for them, else
KforgeError (so a change to what PlanDecode derives from a pointer cannot
make a cached plan wrong silently).

Needs no torch: tensors are anything with shape,
stride(), dtype, device and data_ptr().
"""

import ctypes
import struct
import threading

from kforge import _capi
from kforge.errors import KforgeError
from kforge.plan import ManifestRef, plan_decode

# A call's pointers, in the order every tuple of pointers here has them
# (DecodeArgs' field names; each from lse on 0 when absent); the index
# after the last is the workspace.
POINTERS = ("q", "kv", "indices", "out", "lse", "topk_length", "sink", "extra_kv",
            "extra_indices", "extra_topk_length")
_WORKSPACE = len(POINTERS)
# Each pointer field of the parameter blocks and what it holds.
_MAIN_FIELDS = tuple((name, i) for i, name in enumerate(POINTERS)) + (
    ("o_accum", _WORKSPACE), ("lse_accum", _WORKSPACE))
_COMBINE_FIELDS = (("o_accum", _WORKSPACE), ("lse_accum", _WORKSPACE), ("out", 3), ("lse", 4),
                   ("sink", 6))
_WORD = struct.Struct("=Q")
# Pointers and a workspace of the same classes as a plan's own, for the
# check of a new plan (far from any real address's class change: each
# shift is a multiple of the modulus, and distinct, so a field that copies
# the wrong pointer shows).
_SHIFT = 1 << 24


class _Block:
    """One kernel's parameter block, prebuilt: its bytes as PlanDecode made
    them, and how to write another call's pointers into them."""

    __slots__ = ("buffer", "pointer", "size", "runs")

    def __init__(self, struct_name, data, fields, workspace, with_workspace):
        self.buffer = ctypes.create_string_buffer(bytes(data), len(data))
        # What a launch passes (kforge_module_launch): the block's address
        # and size; the launch copies it.
        self.pointer = ctypes.addressof(self.buffer)
        self.size = len(data)
        words = []  # (offset, source, delta)
        for field, source in fields:
            if source == _WORKSPACE and not with_workspace:
                continue  # null without a combine; PlanDecode's bytes stand
            offset = _capi.offsetof(struct_name, field)
            if offset + 8 > len(data):
                raise KforgeError(f"{struct_name}.{field} at {offset}: past the "
                                  f"{len(data)}-byte block PlanDecode returned")
            delta = _WORD.unpack_from(data, offset)[0] - workspace if source == _WORKSPACE else 0
            words.append((offset, source, delta))
        words.sort()
        # Contiguous words are written by one pack_into.
        self.runs = []
        for offset, source, delta in words:
            if self.runs and self.runs[-1][0] + 8 * len(self.runs[-1][1]) == offset:
                self.runs[-1][1].append((source, delta))
            else:
                self.runs.append((offset, [(source, delta)]))
        self.runs = tuple((offset, struct.Struct("=" + "Q" * len(items)), tuple(items))
                          for offset, items in self.runs)

    def write(self, values):
        """values: the call's pointers + (workspace,)."""
        buffer = self.buffer
        for offset, packer, items in self.runs:
            packer.pack_into(buffer, offset, *[values[i] + d for i, d in items])


class BoundPlan:
    """A plan for one call signature. launch = (grid x, y, z, block x, 1, 1,
    dynamic smem) of the main kernel; combine_launch likewise or None.
    bind() writes a call's pointers into the blocks; hold `lock` from bind
    until the launch has copied them (cuLaunchKernel copies)."""

    __slots__ = ("selection", "variant", "kernel", "workspace_bytes", "launch",
                 "combine_launch", "main", "combine", "entry", "programmatic", "lock")

    def __init__(self, selection, workspace):
        p = selection.plan
        self.selection = selection
        self.variant = selection.variant
        self.kernel = None
        self.workspace_bytes = p.workspace_bytes if p.needs_combine else 0
        self.launch = (p.grid_x, p.grid_y, p.grid_z, p.block_threads, 1, 1,
                       p.dynamic_smem_bytes)
        self.entry = p.main_entry  # the module's main kernel to launch
        # cuLaunchKernelEx with programmatic stream serialization (the
        # selector's rule, model/arch.h LaunchesProgrammatically).
        self.programmatic = p.programmatic
        self.main = _Block("DecodeParams", p.main_params, _MAIN_FIELDS, workspace,
                           p.needs_combine)
        self.combine = self.combine_launch = None
        if p.needs_combine:
            self.combine_launch = (p.combine_grid_x, p.combine_grid_y, 1,
                                   p.combine_block_threads, 1, 1, 0)
            self.combine = _Block("CombineParams", p.combine_params, _COMBINE_FIELDS, workspace,
                                  True)
        self.lock = threading.Lock()

    def bind(self, pointers, workspace=0):
        """Writes pointers (POINTERS' order; each from lse on 0 when
        absent) and the workspace address into both blocks."""
        values = (*pointers, workspace)
        self.main.write(values)
        if self.combine is not None:
            self.combine.write(values)

    def blocks(self):
        """(main block bytes, combine block bytes or b"")."""
        return self.main.buffer.raw, (self.combine.buffer.raw if self.combine else b"")


def _launch_fields(plan):
    copy = type(plan)()
    copy.CopyFrom(plan)
    copy.ClearField("main_params")
    copy.ClearField("combine_params")
    return copy


def _optional_key(t, m):
    """(key, pointer) of an optional tensor of a call (None: absent)."""
    if t is None:
        return None, 0
    p = t.data_ptr()
    return (t.shape, t.stride(), t.dtype, t.device, p % m if p else -1), p


class PlanCache:
    """Plans of one decoder (manifest, device) by call signature.

    make_args(q, kv, indices, out, lse, topk_length, sink, scale, extra) ->
    kforge._capi.DecodeArgs maps a call's tensors (lse, topk_length and
    sink may be None; extra None or (extra_kv, extra_indices,
    extra_topk_length or None); raising TypeError / ValueError for what the
    mapping cannot express); kernel_for(variant) -> the loaded kernel a
    plan launches (stored as plan.kernel), or None."""

    def __init__(self, manifest, device, make_args, kernel_for=None, max_plans=4096):
        self._manifest = ManifestRef(manifest)
        self._given = self._manifest.manifest  # the decoder's: a whole module planned as given
        self._device = device
        self._make_args = make_args
        self._kernel_for = kernel_for
        self._max_plans = max_plans
        self._plans = {}
        self._lock = threading.Lock()
        self.modulus = _capi.decode_pointer_modulus()
        self.misses = 0

    def __len__(self):
        return len(self._plans)

    def lookup(self, q, kv, indices, out, lse, topk_length, sink, scale, extra=None):
        """(BoundPlan, pointers) for one call (lse, topk_length, sink may
        be None; extra as make_args takes it); scale a float. Plans (and
        checks) the call with PlanDecode when its signature is new."""
        m = self.modulus
        qp, kp, ip, op = q.data_ptr(), kv.data_ptr(), indices.data_ptr(), out.data_ptr()
        # Absent inputs (the common call) cost no function call.
        lse_key, lp = (None, 0) if lse is None else _optional_key(lse, m)
        topk_key, tp = (None, 0) if topk_length is None else _optional_key(topk_length, m)
        sink_key, sp = (None, 0) if sink is None else _optional_key(sink, m)
        if extra is None:
            extra_key, xp = None, (0, 0, 0)
        else:
            keys = [_optional_key(t, m) for t in extra]
            extra_key = tuple(k for k, _ in keys)
            xp = tuple(p for _, p in keys)
        key = (q.shape, q.stride(), q.dtype, q.device, qp % m if qp else -1,
               kv.shape, kv.stride(), kv.dtype, kv.device, kp % m if kp else -1,
               indices.shape, indices.stride(), indices.dtype, indices.device,
               ip % m if ip else -1,
               out.shape, out.stride(), out.dtype, out.device, op % m if op else -1,
               lse_key, topk_key, sink_key, extra_key, scale)
        pointers = (qp, kp, ip, op, lp, tp, sp, *xp)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(key, q, kv, indices, out, lse, topk_length, sink, scale, extra,
                              pointers)
        return plan, pointers

    def _plan(self, key, q, kv, indices, out, lse, topk_length, sink, scale, extra, pointers):
        args = self._make_args(q, kv, indices, out, lse, topk_length, sink, scale, extra)
        if tuple(getattr(args, name) for name in POINTERS) != pointers:
            raise KforgeError("make_args put other pointers in DecodeArgs than the tensors'")
        sel = plan_decode(self._manifest, self._device, args, 0)
        workspace = 0
        if sel.needs_combine:
            # PlanDecode does not read the workspace address; any will do.
            workspace = _SHIFT * self.modulus
            sel = plan_decode(self._manifest, self._device, args, workspace)
        plan = BoundPlan(sel, workspace)
        self._check(plan, args, workspace)
        if self._kernel_for is not None:
            kernel = self._kernel_for(sel.variant)
            if self.note_kernel(kernel):
                return self._plan(key, q, kv, indices, out, lse, topk_length, sink, scale, extra,
                                  pointers)
            plan.kernel = kernel
        with self._lock:
            self.misses += 1
            if len(self._plans) >= self._max_plans:
                self._plans.clear()  # signatures beyond any engine's; start over
            return self._plans.setdefault(key, plan)

    @property
    def manifest(self):
        """The manifest planned with (a ManifestRef): the decoder's, with
        each loaded first answer's own variant in its variant's place."""
        return self._manifest

    def note_kernel(self, kernel):
        """Learns from a loaded kernel: a first answer (its artifact's
        `partial`) is planned as the module it is (its own variant, its main
        and combine entries), a whole module that replaced one as the
        decoder's manifest has it, and the device's cluster capacity comes
        from the first kernel with a cluster entry (its
        max_active_clusters). True when any of these changed the plans,
        which are then dropped."""
        changed = self._note_variant(getattr(kernel, "artifact", None))
        clusters = getattr(kernel, "max_active_clusters", 0)
        if not clusters or self._device.max_active_clusters:
            return changed
        with self._lock:
            self._device.max_active_clusters = clusters
            self._plans.clear()
        return True

    def _note_variant(self, artifact):
        if artifact is None:
            return False
        if artifact.partial:
            own = _capi.manifest_for_artifact(artifact).variants[0]
        else:
            own = next((v for v in self._given.variants if v.key == artifact.key), None)
            if own is None:
                return False
        manifest = self._manifest.manifest
        for i, variant in enumerate(manifest.variants):
            if variant.key == own.key and variant != own:
                planned = type(manifest)()
                planned.CopyFrom(manifest)
                planned.variants[i].CopyFrom(own)
                with self._lock:
                    self._manifest = ManifestRef(planned)
                    self._plans.clear()
                return True
        return False

    def _check(self, plan, args, workspace):
        """The blocks bind() writes for other pointers of the same classes
        are PlanDecode's for them, and so is the launch."""
        other = _capi.DecodeArgs()
        ctypes.memmove(ctypes.byref(other), ctypes.byref(args), ctypes.sizeof(args))
        shifted = []
        for i, name in enumerate(POINTERS):
            value = getattr(args, name)
            if value:
                value += (i + 1) * _SHIFT * self.modulus
                setattr(other, name, value)
            shifted.append(value)
        other_ws = workspace + (len(POINTERS) + 2) * _SHIFT * self.modulus if workspace else 0
        want = plan_decode(self._manifest, self._device, other, other_ws)
        plan.bind(shifted, other_ws)
        got = plan.blocks()
        plan.bind(tuple(getattr(args, name) for name in POINTERS), workspace)
        if got != (want.plan.main_params, want.plan.combine_params) or \
                _launch_fields(want.plan) != _launch_fields(plan.selection.plan):
            raise KforgeError(
                "PlanDecode's parameter blocks depend on the pointers in a way kforge.launch "
                "does not reproduce (kforge_offsetof / kforge_decode_pointer_modulus); "
                "rebuild the package and the library from one tree")

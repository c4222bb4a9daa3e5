"""kforge-vllm: kforge's sparse-MLA kernels as a vLLM attention backend.

vLLM calls register() in every process it starts (entry point group
vllm.general_plugins, see pyproject.toml). It registers
kforge_vllm.backend.KforgeSparseMlaBackend under a name of its own,
KFORGE_MLA_SPARSE (`--attention-backend KFORGE_MLA_SPARSE`), and as
AttentionBackendEnum.CUSTOM (`--attention-backend CUSTOM`, which any other
plugin registering CUSTOM replaces: the last one loaded wins). With
KFORGE_VLLM_TAKE_OVER=1 it also takes the slot vLLM picks on its own for
sparse MLA on sm_120 (FLASHINFER_MLA_SPARSE_SM120), so an RTX PRO 6000 /
RTX 50xx runs kforge with no flag, with that slot's default fp8_ds_mla
cache (backend.KforgeSm120TakeOverBackend).

Importing this package imports no vLLM and no torch: register() does, and
kforge_vllm.core (the kernel-calling core) needs only torch and kforge.
"""

import copyreg
import os

BACKEND = "kforge_vllm.backend.KforgeSparseMlaBackend"
TAKE_OVER_BACKEND = "kforge_vllm.backend.KforgeSm120TakeOverBackend"
# The AttentionBackendEnum member register() adds (the backend's get_name()).
NAME = "KFORGE_MLA_SPARSE"
TAKE_OVER_ENV = "KFORGE_VLLM_TAKE_OVER"
# The AttentionBackendEnum member of vLLM's automatic sm_120 sparse-MLA
# choice (vllm/platforms/cuda.py _get_backend_priorities).
TAKE_OVER_SLOT = "FLASHINFER_MLA_SPARSE_SM120"


def take_over_requested(environ=None):
    """Whether KFORGE_VLLM_TAKE_OVER asks for the sm_120 slot: 1/true/yes/on
    (any case); 0/false/no/off or unset leave it; anything else is an error,
    so that a typo does not silently run another backend."""
    value = (os.environ if environ is None else environ).get(TAKE_OVER_ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{TAKE_OVER_ENV}: got {value!r}, expected 1 or 0")


def register():
    """The vllm.general_plugins entry point: registers the backend (safe to
    call more than once; vLLM loads plugins in each process)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    if NAME in AttentionBackendEnum.__members__:
        register_backend(AttentionBackendEnum[NAME], BACKEND)
    else:
        register_backend(NAME, BACKEND)  # a new member (vLLM refuses a second one)
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)
    if take_over_requested():
        register_backend(AttentionBackendEnum[TAKE_OVER_SLOT], TAKE_OVER_BACKEND)
    _pickle_by_name(AttentionBackendEnum)


def backend_member(name):
    """The AttentionBackendEnum member `name`, registering the plugin first:
    how a pickled KFORGE_MLA_SPARSE comes back (_pickle_by_name)."""
    register()
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    return AttentionBackendEnum[name]


def _pickle_by_name(enum_cls):
    """Makes KFORGE_MLA_SPARSE survive pickling into a process that has not
    loaded plugins yet. An Enum member pickles as a lookup of its value, and
    vLLM unpickles its config (attention_config.backend) in a spawned engine
    core or worker, or a Ray actor, before it loads plugins there
    (EngineCore.__init__, WorkerBase.init_worker): a member registered at
    run time would not be found. This member pickles as a call of
    backend_member, which registers it; every other member as before."""
    previous = copyreg.dispatch_table.get(enum_cls)
    if getattr(previous, "kforge_by_name", False):
        return

    def reduce(member):
        if member.name == NAME:
            return backend_member, (NAME,)
        if previous is not None:
            return previous(member)
        return member.__reduce_ex__(4)

    reduce.kforge_by_name = True
    copyreg.pickle(enum_cls, reduce)

"""kforge-vllm: kforge's sparse-MLA kernels as a vLLM attention backend.

vLLM calls register() in every process it starts (entry point group
vllm.general_plugins, see pyproject.toml). It registers
kforge_vllm.backend.KforgeSparseMlaBackend as AttentionBackendEnum.CUSTOM,
selected with `--attention-backend CUSTOM`. With KFORGE_VLLM_TAKE_OVER=1 it
also takes the slot vLLM picks on its own for sparse MLA on sm_120
(FLASHINFER_MLA_SPARSE_SM120), so an RTX PRO 6000 / RTX 50xx runs kforge
with no flag.

Importing this package imports no vLLM and no torch: register() does, and
kforge_vllm.core (the kernel-calling core) needs only torch and kforge.
"""

import os

BACKEND = "kforge_vllm.backend.KforgeSparseMlaBackend"
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
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)
    if take_over_requested():
        register_backend(AttentionBackendEnum[TAKE_OVER_SLOT], BACKEND)

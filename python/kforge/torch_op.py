"""kforge::sparse_mla_decode, a PyTorch custom op (torch.library), so that
torch.compile traces a decode call as one node of its graph:

    kforge::sparse_mla_decode(Tensor q, Tensor kv_cache, Tensor indices,
                              Tensor(a!) out, Tensor(b!)? lse,
                              Tensor? topk_length, Tensor? sink,
                              Tensor? extra_kv_cache, Tensor? extra_indices,
                              Tensor? extra_topk_length,
                              float softmax_scale, int decoder) -> ()

It writes out (and lse, when given), reads topk_length, sink and the extra
cache's tensors when given (SparseMlaDecoder's optional inputs), and returns nothing; `decoder` names a
SparseMlaDecoder of this process (each registers itself when built, and is
forgotten when collected). Its
fake (meta) implementation writes nothing and allocates nothing, which is
all a mutating op with no outputs needs for tracing. Nobody calls it
directly: SparseMlaDecoder.__call__ becomes this op while torch.compile
traces it, and otherwise launches with no dispatcher in the way.

Defined on first use (a SparseMlaDecoder's construction), so importing
kforge needs no torch. Needs torch.library.custom_op (PyTorch 2.4+); with an
older torch, eager calls work and a compiled one raises KforgeError.
"""

import itertools
import threading
import weakref

from kforge.errors import KforgeError

OP = "kforge::sparse_mla_decode"

_lock = threading.Lock()
_decoders = weakref.WeakValueDictionary()  # id -> SparseMlaDecoder
_ids = itertools.count(1)
_defined = None  # None: not tried; else True / the reason it is unavailable


def _define(torch):
    from typing import Optional

    Tensor = torch.Tensor

    def sparse_mla_decode(q: Tensor, kv_cache: Tensor, indices: Tensor, out: Tensor,
                          lse: Optional[Tensor], topk_length: Optional[Tensor],
                          sink: Optional[Tensor], extra_kv_cache: Optional[Tensor],
                          extra_indices: Optional[Tensor], extra_topk_length: Optional[Tensor],
                          softmax_scale: float, decoder: int) -> None:
        try:
            target = _decoders[decoder]
        except KeyError:
            raise KforgeError(f"{OP}: no SparseMlaDecoder {decoder} in this process") from None
        target.run(q, kv_cache, indices, out, lse, softmax_scale, topk_length=topk_length,
                   sink=sink, extra_kv_cache=extra_kv_cache, extra_indices=extra_indices,
                   extra_topk_length=extra_topk_length)

    op = torch.library.custom_op(OP, mutates_args=("out", "lse"))(sparse_mla_decode)

    @op.register_fake
    def _(q, kv_cache, indices, out, lse, topk_length, sink, extra_kv_cache, extra_indices,
          extra_topk_length, softmax_scale, decoder):
        return None


def register(torch, decoder):
    """Defines the op (once) and returns the id by which it finds decoder."""
    global _defined
    with _lock:
        if _defined is None:
            if not hasattr(torch.library, "custom_op"):
                _defined = (f"{OP} needs torch.library.custom_op (PyTorch 2.4+); this is "
                            f"PyTorch {torch.__version__}")
            else:
                _define(torch)
                _defined = True
        decoder_id = next(_ids)
        _decoders[decoder_id] = decoder
        return decoder_id


def is_compiling(torch):
    """The function that says whether torch.compile is tracing (constant
    True while it traces); KforgeError in a trace when the op is
    unavailable."""
    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    if check is None:
        check = getattr(getattr(torch, "_dynamo", None), "is_compiling", None)
    if check is None:
        return lambda: False
    if _defined is not True and _defined is not None:
        reason = _defined

        def check_available():
            if check():
                raise KforgeError(reason)
            return False
        return check_available
    return check

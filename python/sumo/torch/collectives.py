"""Horovod's collectives on sumo's communicator: allreduce (in and out of place, grouped),
allgather, broadcast, reducescatter, barrier, objects, parameters and optimizer state, and
join for uneven inputs. The asynchronous allreduces and their fusion are _fused.py's; every
collective here is one call (or a fixed few) of the C library, nothing else in between.

join. A rank that has run out of data calls sumo_join (sumo.h), which answers the others'
collectives from the agreement every collective of the C library starts with: zeros in an
allreduce with Average or Sum (so Average still divides by every rank: the sum of the active
ranks' tensors over size(), as Horovod's joined ranks give), its part of a barrier. Any other
collective while ranks have joined (a broadcast, an allgather, a reducescatter, Adasum) fails
on every rank, the joined ones included, and the communicator stays usable. join() returns
once every rank is in it, with the rank that joined last (of several that joined in the same
round, the highest). This covers every Average or Sum allreduce on sumo's communicator: the
DDP hooks' and SlowMo's too.
"""
import ctypes
import os
import pickle
import time

import torch

from .. import Sum, Adasum
from .. import _lib
from .._abi import (SUMO_COLLECTIVE_ALLGATHER, SUMO_COLLECTIVE_BROADCAST,
                    SUMO_COLLECTIVE_REDUCE_SCATTER, sumo_comm_stats)
from .._lib import lib
from . import _calls, _runtime as rt, _tensors
from ._surface import resolve_op, check_tensor, run, allreduce_inplace
from ._fused import Pending, pending, handle_ids
from .compression import Compression, check as check_compression


def join(device=-1):
    """Horovod's join: this rank has no more data. It takes part in the other ranks'
    allreduces (Average, Sum) with zeros and in their barriers until every rank has called
    join(), and returns the rank that joined last (of several that joined in the same round,
    the highest). Anything else the others run meanwhile raises on every rank. `device` is
    accepted for Horovod's signature: a joined rank's zeros lie in the memory the others'
    buffers do (sumo_join makes them with that memory's kernel table)."""
    rt.require_init()
    if rt.state.size == 1:
        return 0
    rt.sync()
    last = ctypes.c_int(-1)
    rt.raise_for(lib.sumo_join(rt.state.comm, ctypes.byref(last)), "join")
    return last.value


def comm_stats():
    """{"rounds": collectives of the C library this process's communicator has run,
    "bytes": their receive buffers' bytes} (sumo_comm_get_stats): what a call costs."""
    s = sumo_comm_stats()
    rt.raise_for(lib.sumo_comm_get_stats(rt.require_init(), ctypes.byref(s)), "comm_stats")
    return {"rounds": int(s.rounds), "bytes": int(s.bytes)}


# -- allreduce ---------------------------------------------------------------------------------

class _Allreduce(torch.autograd.Function):
    """Differentiable, as Horovod's: the gradient of an allreduce is the allreduce (same op
    and factors) of the gradients."""

    @staticmethod
    def forward(ctx, tensor, op, name, prescale, postscale):
        ctx.args = (op, name, prescale, postscale)
        out = tensor.detach().clone(memory_format=torch.contiguous_format)
        return allreduce_inplace(out, op, name, prescale, postscale)

    @staticmethod
    def backward(ctx, grad):
        op, name, prescale, postscale = ctx.args
        out = grad.detach().clone(memory_format=torch.contiguous_format)
        allreduce_inplace(out, op, name + " (gradient)", prescale, postscale)
        return out, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0):
    """A new tensor: op over the ranks' tensors of postscale * op(prescale * tensor); the
    input is not modified. Differentiable."""
    rt.require_init()
    op = resolve_op(op, average, "allreduce")
    check_compression(compression, "allreduce")
    name = name or "tensor"
    check_tensor(tensor, name)
    sent, ctx = compression.compress(tensor)
    out = _Allreduce.apply(sent, op, name, float(prescale_factor), float(postscale_factor))
    return compression.decompress(out, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """In place: every rank ends with the combined tensor (Adasum: the tensor as one)."""
    rt.require_init()
    op = resolve_op(op, average, "allreduce_")
    return allreduce_inplace(tensor, op, name or "tensor", float(prescale_factor),
                              float(postscale_factor))


def _grouped(tensors, op, name, prescale, postscale):
    """Each tensor reduced in place; tensors of one floating dtype travel in one buffer for
    Sum and Average (elementwise, so the same bits as one by one), Adasum one by one (per
    tensor, as Horovod's grouped Adasum)."""
    for i, t in enumerate(tensors):
        check_tensor(t, "%s[%d]" % (name, i))
    _tensors.same_device([("%s[%d]" % (name, i), t) for i, t in enumerate(tensors)],
                         "grouped allreduce of %s" % name)
    by_dtype = {}
    for i, t in enumerate(tensors):
        if op != Adasum and t.dtype in _tensors._DTYPES:
            by_dtype.setdefault(t.dtype, []).append(i)
        else:
            allreduce_inplace(t, op, "%s[%d]" % (name, i), prescale, postscale)
    for dtype, idx in by_dtype.items():
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in idx])
        allreduce_inplace(flat, op, "%s (%d %s tensors)" % (name, len(idx), dtype), prescale,
                           postscale)
        off = 0
        for i in idx:
            n = tensors[i].numel()
            tensors[i].detach().copy_(flat[off:off + n].view_as(tensors[i]))
            off += n
    return tensors


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0):
    """New tensors, each the allreduce of the corresponding input."""
    rt.require_init()
    op = resolve_op(op, average, "grouped_allreduce")
    check_compression(compression, "grouped_allreduce")
    sent = [compression.compress(t) for t in tensors]
    outs = [s.detach().clone(memory_format=torch.contiguous_format) for s, _ in sent]
    _grouped(outs, op, name or "tensors", float(prescale_factor), float(postscale_factor))
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, sent)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0):
    rt.require_init()
    op = resolve_op(op, average, "grouped_allreduce_")
    return _grouped(list(tensors), op, name or "tensors", float(prescale_factor),
                    float(postscale_factor))


# -- bytes: broadcast and allgather of any dtype --------------------------------------------------

def _to_words(t):
    """t's bytes (C order) in a float64 tensor padded with zeros to whole words: a
    broadcast or an allgather copies them bit for bit, whatever t's dtype."""
    flat = t.detach().contiguous().view(-1)
    u8 = flat.view(torch.uint8)
    words = u8.new_zeros((u8.numel() + 7) // 8, dtype=torch.float64)  # on t's device
    words.view(torch.uint8)[:u8.numel()] = u8
    return words, u8.numel()


def _from_bytes(u8, dtype, shape):
    return u8.clone().view(dtype).view(shape)


def _broadcast_raw(t, root, name):
    """t (any dtype) replaced by the root's, in place."""
    check_tensor(t, name)
    if t.dtype in _tensors._DTYPES and t.is_contiguous():
        _calls.broadcast_tensor(t, root, name)
        return t
    words, nbytes = _to_words(t)
    _calls.broadcast_tensor(words, root, name)
    with torch.no_grad():
        t.copy_(_from_bytes(words.view(torch.uint8)[:nbytes], t.dtype, t.shape))
    return t


def _check_root(root_rank, where):
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or \
            not 0 <= root_rank < rt.state.size:
        raise ValueError("%s: root_rank %r is not a rank of %d" % (where, root_rank, rt.state.size))


def broadcast_(tensor, root_rank=0, name=None):
    """In place: the root's tensor on every rank (any dtype, bit for bit)."""
    rt.require_init()
    name = name or "tensor"
    _check_root(root_rank, "broadcast_ of %s" % name)
    check_tensor(tensor, name)
    return _broadcast_raw(tensor, root_rank, name)


class _Broadcast(torch.autograd.Function):
    """Differentiable, as Horovod's: the root's gradient is the sum of every rank's, the
    others' zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank, ctx.name = root_rank, name
        out = tensor.detach().clone(memory_format=torch.contiguous_format)
        return _broadcast_raw(out, root_rank, name)

    @staticmethod
    def backward(ctx, grad):
        out = grad.detach().clone(memory_format=torch.contiguous_format)
        allreduce_inplace(out, Sum, ctx.name + " (gradient)", 1.0, 1.0)
        if rt.state.rank != ctx.root_rank:
            out.zero_()
        return out, None, None


def broadcast_async_(tensor, root_rank=0, name=None):
    """Starts an in-place broadcast (sumo_broadcast_start) and returns a handle for poll()
    and synchronize(), which returns the tensor. float32/64 and float16/bfloat16 only."""
    rt.require_init()
    name = name or "tensor"
    _check_root(root_rank, "broadcast_async_ of %s" % name)
    check_tensor(tensor, name)
    ptr, n, dt = _tensors.checked_tensor(tensor, name)
    rt.sync()
    req = ctypes.c_void_p()
    t0 = time.perf_counter()
    rt.raise_for(run(SUMO_COLLECTIVE_BROADCAST, tensor, ptr, ptr, n, dt, root=int(root_rank),
                      request=req,
                      cpu=lambda: lib.sumo_broadcast_start(ptr, ptr, n, dt, int(root_rank),
                                                           rt.state.comm, ctypes.byref(req))),
                 "broadcast of %s" % name)
    handle = next(handle_ids)
    pending[handle] = Pending(req, tensor, 1.0, name, t0)
    return handle


def _reducescatter_args(tensor, op, name, where):
    rt.require_init()
    op = resolve_op(op, None, where)
    if op == Adasum:
        raise ValueError("%s: Adasum's result is not defined piece by piece; use Sum or "
                         "Average" % where)
    check_tensor(tensor, name)
    size = rt.state.size
    if tensor.dim() == 0 or tensor.shape[0] % size:
        rt.fail_together(ValueError("%s of %s: the first dimension (%s) must divide among the "
                                    "%d ranks" % (where, name, tuple(tensor.shape), size)))
    src = tensor.detach().contiguous()
    ptr, n, dt = _tensors.checked_tensor(src, name)
    out = src.new_empty((tensor.shape[0] // size,) + tuple(tensor.shape[1:]))
    return src, ptr, out, out.numel(), dt, op


def reducescatter(tensor, op=None, name=None):
    """Every rank's tensor reduced (Sum or Average), split along the first dimension: rank r
    gets rows [r n / P, (r + 1) n / P) (the first dimension must divide among the ranks)."""
    name = name or "tensor"
    src, ptr, out, n, dt, op = _reducescatter_args(tensor, op, name, "reducescatter")
    rt.sync()
    t0 = time.perf_counter()
    recv = _tensors.tensor_args(out, name)[0]
    rt.raise_for(run(SUMO_COLLECTIVE_REDUCE_SCATTER, src, ptr, recv, n, dt, op=op,
                      cpu=lambda: lib.sumo_reduce_scatter(ptr, recv, n, dt, op, rt.state.comm)),
                 "reducescatter of %s" % name)
    rt.record(t0, time.perf_counter(), src.numel() * src.element_size())
    return out


def reducescatter_async(tensor, op=None, name=None):
    """reducescatter started (sumo_reduce_scatter_start): a handle for poll() and
    synchronize(), which returns this rank's rows. The input stays untouched until then."""
    name = name or "tensor"
    src, ptr, out, n, dt, op = _reducescatter_args(tensor, op, name, "reducescatter_async")
    rt.sync()
    req = ctypes.c_void_p()
    t0 = time.perf_counter()
    recv = _tensors.tensor_args(out, name)[0]
    rt.raise_for(run(SUMO_COLLECTIVE_REDUCE_SCATTER, src, ptr, recv, n, dt, op=op, request=req,
                      cpu=lambda: lib.sumo_reduce_scatter_start(ptr, recv, n, dt, op,
                                                                rt.state.comm,
                                                                ctypes.byref(req))),
                 "reducescatter of %s" % name)
    handle = next(handle_ids)
    p = Pending(req, out, 1.0, name, t0)
    p.keep = src  # read by sumo until the request completes
    pending[handle] = p
    return handle


def broadcast(tensor, root_rank=0, name=None):
    """A new tensor holding the root's; the input is not modified. Differentiable."""
    rt.require_init()
    name = name or "tensor"
    _check_root(root_rank, "broadcast of %s" % name)
    check_tensor(tensor, name)
    return _Broadcast.apply(tensor, root_rank, name)


def _allgather_tensor(send, recv, name):
    sp, n, dt = _tensors.checked_tensor(send, name)
    rp = _tensors.tensor_args(recv, name)[0]
    rt.sync()
    t0 = time.perf_counter()
    rt.raise_for(run(SUMO_COLLECTIVE_ALLGATHER, send, sp, rp, n, dt,
                      cpu=lambda: lib.sumo_allgather(sp, rp, n, dt, rt.state.comm)),
                 "allgather of %s" % name)
    rt.record(t0, time.perf_counter(), recv.numel() * recv.element_size())


_CODES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]
_META = 12  # rows, bytes, dims, dtype code, then up to 8 trailing dimensions


def _allgather_raw(t, name):
    """Every rank's t concatenated along dim 0 (first dimensions may differ) and the
    ranks' first dimensions. Two allgathers: the shapes, then the bytes, each rank's padded
    to the longest."""
    t = t.detach()
    if t.dim() == 0:
        t = t.view(1)
    if t.dim() > _META - 3 or t.dtype not in _CODES:
        raise ValueError("sumo: allgather of %s: %d dimensions of %s; at most %d dimensions of "
                         "%s" % (name, t.dim(), t.dtype, _META - 3,
                                 ", ".join(str(d).replace("torch.", "") for d in _CODES)))
    size = rt.state.size
    words, nbytes = _to_words(t)
    meta = torch.zeros(_META, dtype=torch.float64)
    meta[:4] = torch.tensor([t.shape[0], nbytes, t.dim(), _CODES.index(t.dtype)],
                            dtype=torch.float64)
    meta[4:4 + t.dim() - 1] = torch.tensor(t.shape[1:], dtype=torch.float64)
    metas = torch.empty(size * _META, dtype=torch.float64)
    _allgather_tensor(meta, metas, name + " (shapes)")
    metas = metas.view(size, _META)
    # Every rank sees the same shapes, so all raise alike.
    if not bool((metas[:, 2:] == metas[0, 2:]).all()):
        def shape(m):
            dims = [int(m[0])] + [int(d) for d in m[4:4 + int(m[2]) - 1]]
            return "%s %s" % (str(_CODES[int(m[3])]).replace("torch.", ""), tuple(dims))
        raise ValueError("sumo: allgather of %s: the ranks' tensors differ in dtype or in a "
                         "dimension after the first: %s" % (
                             name, ", ".join("rank %d %s" % (r, shape(metas[r].tolist()))
                                             for r in range(size))))
    rows = [int(r) for r in metas[:, 0].tolist()]
    lengths = [int(b) for b in metas[:, 1].tolist()]
    width = (max(lengths) + 7) // 8
    if width == 0:
        return t.new_empty((sum(rows),) + tuple(t.shape[1:])), rows
    send = words.new_zeros(width)  # on t's device, as recv
    send[:words.numel()] = words
    recv = words.new_empty(size * width)
    _allgather_tensor(send, recv, name)
    u8 = recv.view(size, width).view(torch.uint8)
    joined = torch.cat([u8[r, :lengths[r]] for r in range(size)])
    return _from_bytes(joined, t.dtype, (sum(rows),) + tuple(t.shape[1:])), rows


class _Allgather(torch.autograd.Function):
    """Differentiable, as Horovod's: each rank's gradient is its rows of the sum of the
    ranks' gradients."""

    @staticmethod
    def forward(ctx, tensor, name):
        ctx.name = name
        out, rows = _allgather_raw(tensor, name)
        ctx.offset, ctx.rows = sum(rows[:rt.state.rank]), rows[rt.state.rank]
        ctx.scalar = tensor.dim() == 0
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.detach().clone(memory_format=torch.contiguous_format)
        allreduce_inplace(out, Sum, ctx.name + " (gradient)", 1.0, 1.0)
        mine = out.narrow(0, ctx.offset, ctx.rows)
        return (mine.view(()) if ctx.scalar else mine), None


def allgather(tensor, name=None):
    """Every rank's tensor concatenated along the first dimension, in rank order; the
    first dimensions may differ, the others and the dtype must not. Any dtype.
    Differentiable."""
    rt.require_init()
    name = name or "tensor"
    check_tensor(tensor, name)
    return _Allgather.apply(tensor, name)


def barrier():
    rt.sync()
    rt.raise_for(lib.sumo_barrier(rt.require_init()), "barrier")


# -- objects, parameters, optimizer state ---------------------------------------------------------

def _broadcast_bytes(data, root_rank, what):
    n = torch.tensor([float(len(data)) if data is not None else 0.0], dtype=torch.float64)
    _calls.broadcast_tensor(n, root_rank, what + " (length)")
    nbytes = int(n[0].item())
    if nbytes == 0:
        return b""
    if data is not None:
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        buf = torch.empty(nbytes, dtype=torch.uint8)
    words, _ = _to_words(buf)
    _calls.broadcast_tensor(words, root_rank, what)
    return ctypes.string_at(words.data_ptr(), nbytes)


def broadcast_object(obj, root_rank=0, name=None):
    """The root's object (pickled) on every rank."""
    rt.require_init()
    name = name or type(obj).__name__
    _check_root(root_rank, "broadcast_object of %s" % name)
    data = pickle.dumps(obj) if rt.state.rank == root_rank else None
    data = _broadcast_bytes(data, root_rank, name)
    return obj if rt.state.rank == root_rank else pickle.loads(data)


def allgather_object(obj, name=None):
    """Every rank's object (pickled), as a list in rank order."""
    rt.require_init()
    name = name or type(obj).__name__
    data = pickle.dumps(obj)
    gathered, rows = _allgather_raw(torch.frombuffer(bytearray(data), dtype=torch.uint8), name)
    out, off = [], 0
    for n in rows:
        out.append(pickle.loads(ctypes.string_at(gathered.data_ptr() + off, n)))
        off += n
    return out


@torch.no_grad()
def broadcast_parameters(params, root_rank=0):
    """Copies the root's tensors into every rank's, in place: a state_dict (in key order),
    named_parameters() pairs or plain tensors, as Horovod takes them. Any dtype, bit for
    bit (BatchNorm's counters too)."""
    rt.require_init()
    _check_root(root_rank, "broadcast_parameters")
    items = sorted(params.items()) if isinstance(params, dict) else list(params)
    named = []
    for i, item in enumerate(items):
        name, t = item if isinstance(item, tuple) else ("params[%d]" % i, item)
        if not isinstance(t, torch.Tensor):
            raise TypeError("broadcast_parameters: %s is not a tensor" % name)
        check_tensor(t, name)
        named.append((name, t))
    _tensors.same_device(named, "broadcast_parameters")
    for name, t in named:
        _broadcast_raw(t, root_rank, name)


def broadcast_optimizer_state(optimizer, root_rank=0, model=None):
    """The root's optimizer state (moments, step counts, hyperparameters) on every rank.
    Any torch optimizer (LBFGS too), also one that has not stepped yet: its state_dict
    travels whole. `model` is accepted for Horovod's signature and not needed."""
    rt.require_init()
    sd = broadcast_object(optimizer.state_dict() if rt.state.rank == root_rank else None,
                          root_rank, "optimizer state")
    if rt.state.rank != root_rank:
        optimizer.load_state_dict(sd)


# -- what this build has --------------------------------------------------------------------------

def mpi_built():
    """Whether libsumo was built with its MPI transport (libsumo_mpi beside it)."""
    return bool(_lib.HAVE_MPI)


def mpi_enabled():
    """Whether this process's communicator runs over MPI."""
    return rt.state.comm is not None and rt.state.transport == "mpi"


def gloo_built():
    """sumo's collectives never run on gloo (init() only sets up torch's gloo group for
    the program's own use)."""
    return False


def gloo_enabled():
    return False


def nccl_built():
    """1 where libsumo_cuda is built (its NCCL transport loads NCCL at run time), else 0."""
    return int(cuda_built())


def cuda_built():
    """Whether libsumo_cuda is built beside libsumo: CUDA tensors (sumo.torch.init with the
    threads or the NCCL transport)."""
    return os.path.exists(_lib.CUDA_LIBRARY)


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def is_initialized():
    return rt.state.comm is not None

"""What sumo makes of a tensor: its pointer, count and sumo dtype (tensor_args, refusing by name
what sumo cannot reduce in place), the refusal every rank sees (checked_tensor), tensors of
two devices in one call, the Adasum op of a layout of tensors, and the node-shared memory of
the buffers sumo reduces in place. A module because every collective's entry checks its
tensors here before any transport sees them.
"""
import ctypes

import torch

from .._abi import (SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16, SUMO_BFLOAT16,
                    sumo_adasum_options)
from .._lib import lib
from . import _cuda
from ._runtime import state, raise_for, fail_together, sync


_DTYPES = {
    torch.float32: SUMO_FLOAT32,
    torch.float64: SUMO_FLOAT64,
    torch.float16: SUMO_FLOAT16,
    torch.bfloat16: SUMO_BFLOAT16,
}


def adasum_op(comm, layout, what, device=None):
    """A sumo op for Adasum per tensor on buffers packing tensors of `layout` (their element
    counts, in order), valid on comm until sumo_op_destroy. Collective: every rank creates
    the same ops in the same order. On the two-level communicator across hosts, an op for
    buffers on a CUDA `device` is the hierarchical one (the tree over the hosts' averages,
    the level between the hosts NCCL's, added first: _cuda.across_ready); elsewhere the flat
    tree over every rank."""
    hierarchical = (device is not None and torch.device(device).type == "cuda"
                    and state.transport == "hierarchical"
                    and getattr(comm, "value", comm) == state.comm.value)
    if hierarchical:
        _cuda.across_ready()
    counts = (ctypes.c_size_t * len(layout))(*layout)
    opts = sumo_adasum_options(ctypes.sizeof(sumo_adasum_options), counts, len(layout),
                               int(hierarchical), 0)
    out = ctypes.c_uint32()
    raise_for(lib.sumo_op_create_adasum(comm, ctypes.byref(opts), ctypes.byref(out)),
              "sumo_op_create_adasum for " + what)
    return out.value


def tensor_args(t, name):
    """(pointer, count, sumo dtype) of a tensor sumo may read and write in place. Anything
    sumo would have to copy or cannot reduce is refused, naming the tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("sumo: %s is a %s, not a torch.Tensor" % (name, type(t).__name__))
    if t.device.type == "cuda":
        _cuda.cuda_ready(t, name)
    elif t.device.type != "cpu":
        raise ValueError("sumo: tensor %s is on %s; sumo reduces CPU and CUDA tensors"
                         % (name, t.device))
    if t.dtype not in _DTYPES:
        raise TypeError("sumo: tensor %s has dtype %s; sumo reduces float32, float64, float16 "
                        "and bfloat16 only" % (name, t.dtype))
    if not t.is_contiguous():
        raise ValueError("sumo: tensor %s is not contiguous (strides %s); pass .contiguous() "
                         "and copy the result back" % (name, tuple(t.stride())))
    if t.is_sparse:
        raise ValueError("sumo: tensor %s is sparse" % name)
    return ctypes.c_void_p(t.data_ptr()), t.numel(), _DTYPES[t.dtype]


def same_device(named, what):
    """Refuses tensors ((name, tensor) pairs) that one call would take from two devices, CPU
    and CUDA or two GPUs, naming the first of each."""
    first = {}
    for name, t in named:
        if isinstance(t, torch.Tensor):
            first.setdefault(str(t.device), name)
    if len(first) > 1:
        (d0, n0), (d1, n1) = list(first.items())[:2]
        raise ValueError("sumo: %s mixes devices: %s is on %s and %s on %s; one call takes "
                         "tensors of one device" % (what, n0, d0, n1, d1))


def checked_tensor(t, name):
    """tensor_args for a tensor that is about to enter a collective: refused on every rank."""
    try:
        return tensor_args(t, name)
    except (TypeError, ValueError) as e:
        fail_together(e)


def shared_empty(numel, dtype, what):
    """An uninitialised 1-D tensor for a buffer sumo reduces in place. Under MPI or the
    shared-memory transport it lives in
    sumo_mem_alloc's memory, which every process of the node maps, so a collective whose
    buffers are all such runs without staging copies. Collective under MPI: every rank calls
    it in the same order. The memory goes with the communicator (shutdown())."""
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if state.transport not in ("mpi", "shm") or nbytes == 0:
        return torch.empty(numel, dtype=dtype)
    sync()
    ptr = ctypes.c_void_p()
    raise_for(lib.sumo_mem_alloc(state.comm, nbytes, ctypes.byref(ptr)),
              "sumo_mem_alloc for " + what)
    return torch.frombuffer((ctypes.c_byte * nbytes).from_address(ptr.value), dtype=dtype)


def node_maps_memory():
    """True when every rank is an MPI process of one node: shared_empty's memory is then
    mapped by every process, and collectives on it run without staging copies."""
    return state.transport in ("mpi", "shm") and state.size > 1 and state.local_size == state.size


def shared_free(t, what):
    """Gives back a tensor shared_empty made (collective under MPI, like the allocation). The
    tensor must not be used afterwards: its storage is the freed memory."""
    if state.transport not in ("mpi", "shm") or t.numel() == 0:
        return
    sync()
    raise_for(lib.sumo_mem_free(state.comm, ctypes.c_void_p(t.data_ptr())),
              "sumo_mem_free for " + what)

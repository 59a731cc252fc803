"""CUDA tensors and devices: the libsumo_cuda kernels of each device (made at the first tensor
on it and added to the communicator), the refusals of a tensor the communicator cannot take,
the streams sumo's kernels run on and what must be complete on them before a peer reads a
buffer, the NCCL id every rank of an NCCL communicator needs, and the CUDA level of the
two-level communicator across hosts (across_ready, device_op). A module because every path
that takes a tensor asks it the same questions, whatever the transport.
"""
import ctypes
from datetime import timedelta

import torch

from .. import _lib
from .._abi import SUMO_SUCCESS, SUMO_OP_ADASUM, sumo_adasum_options
from .._lib import lib
from . import _stores
from ._runtime import state, broken_by, raise_for, _deadline_s


# A CUDA tensor goes to sumo as its device pointer: libsumo_cuda's kernels (one object per
# device, made at the first tensor on it and added to the communicator) run every touch of its
# data on the device, on the caller's current stream, and the host waits for them before the
# call returns; no byte goes through host memory. Transports that move device memory: the
# threads transport (one rank: nothing moves), NCCL (init(transport="nccl")), and the shared-
# memory transport (torchrun's processes on one node), whose ranks' kernels read and write each
# other's device buffers through CUDA IPC (one GPU or several; memory IPC cannot export, as
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True gives, is refused by the C library, naming
# what to change), and the two-level communicator across hosts (init()'s default there): CUDA
# IPC inside each host, and between the hosts an NCCL communicator of each local rank, which
# the first CUDA collective adds (across_ready). The MPI and process-group transports, and
# the flat TCP one, move host memory only and refuse CUDA tensors.

# Transports whose collectives take device buffers.
CUDA_TRANSPORTS = ("threads", "nccl", "shm", "hierarchical")
# Of those, the ones whose peers read this rank's device buffers outside its current stream
# (NCCL's own stream, other processes): what was queued on that stream must be complete first.
_PEERS_READ_ELSEWHERE = ("nccl", "shm", "hierarchical")


class _Cuda:
    kernels = {}     # device index -> sumo_cuda_kernels (ctypes.c_void_p)
    device = None    # the NCCL communicator's device
    across = None    # the two-level communicator its NCCL level was added to
    adasum = None    # (that communicator, its hierarchical Adasum op of one tensor)


def _device_index(device):
    return device.index if device.index is not None else torch.cuda.current_device()


def _peers_read_elsewhere():
    return state.transport in _PEERS_READ_ELSEWHERE


def cuda_ready(t, name):
    """Makes the communicator take CUDA tensor t (its device's kernels, once), or refuses it
    by name: a transport that cannot move device memory, a device other than the NCCL
    communicator's, no libsumo_cuda, no device."""
    if state.comm is not None and state.transport not in CUDA_TRANSPORTS:
        raise ValueError("sumo: tensor %s is on %s; the %s transport moves host memory only "
                         "(init(transport=\"nccl\") takes CUDA tensors, one GPU per rank)"
                         % (name, t.device, state.transport))
    index = _device_index(t.device)
    if index in _Cuda.kernels:
        return
    if state.transport in ("nccl", "hierarchical") and _Cuda.device is not None \
            and index != _Cuda.device:
        raise ValueError("sumo: tensor %s is on cuda:%d; this rank's NCCL communicator is on "
                         "cuda:%d" % (name, index, _Cuda.device))
    try:
        cu = _lib.cuda()
    except RuntimeError as e:
        raise ValueError("sumo: tensor %s is on %s: %s" % (name, t.device, e)) from None
    _add_kernels(cu, index, "tensor %s is on %s" % (name, t.device))


def _add_kernels(cu, index, what):
    k = ctypes.c_void_p()
    code = cu.sumo_cuda_kernels_create(index, ctypes.byref(k))
    if code != SUMO_SUCCESS:
        count, why = _lib.cuda_devices()
        raise ValueError("sumo: %s: sumo_cuda_kernels_create(%d) failed (%s): %s"
                         % (what, index, _lib.result_name(code), why))
    if state.comm is not None:
        code = cu.sumo_comm_add_cuda(state.comm, k)
        if code != SUMO_SUCCESS:
            cu.sumo_cuda_kernels_destroy(k)
            raise_for(code, "sumo_comm_add_cuda for " + what)
    _Cuda.kernels[index] = k


def _release_kernels():
    """After the communicator is gone (it borrows them)."""
    if _Cuda.kernels:
        cu = _lib.cuda()
        for k in _Cuda.kernels.values():
            cu.sumo_cuda_kernels_destroy(k)
    _Cuda.kernels = {}
    _Cuda.device = None
    _Cuda.across = None
    _Cuda.adasum = None


def current_stream(t):
    """The stream sumo's kernels run on for tensor t: the caller's current CUDA stream
    (torch.cuda.current_stream().cuda_stream), 0 for a CPU tensor."""
    if t.device.type != "cuda":
        return 0
    return torch.cuda.current_stream(t.device).cuda_stream


def inputs_ready(t):
    """Before a collective of CUDA tensor t on the current stream: where the transport moves
    data on a stream of its own (NCCL) or the peers read t from their own processes (shm,
    through CUDA IPC), what was queued on the current stream must be
    complete first (as sumo_cuda_allreduce does in C). A no-op for CPU tensors and on the
    threads transport (one rank: the kernels on the current stream are ordered already)."""
    if t.device.type == "cuda" and _peers_read_elsewhere():
        torch.cuda.current_stream(t.device).synchronize()


def inputs_event(t):
    """inputs_ready for a collective run later from the worker thread: an event recorded on
    the current stream now, which the worker waits for (None where nothing need wait)."""
    if t.device.type == "cuda" and _peers_read_elsewhere():
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(t.device))
        return ev
    return None


def legacy_ready(t):
    """Before a C call that takes no stream (the legacy default stream runs its kernels):
    the caller's current stream is waited for when it is another, or when the transport
    moves data on a stream of its own (NCCL). A no-op for CPU tensors, and on the threads
    transport from torch's default stream."""
    if t.device.type == "cuda":
        s = torch.cuda.current_stream(t.device)
        if s.cuda_stream != 0 or _peers_read_elsewhere():
            s.synchronize()


def future_devices(t):
    """The devices a Future completed with t must name (torch refuses CUDA tensors in a
    Future made without them)."""
    return [t.device] if t.device.type == "cuda" else None


NCCL_ID_BYTES = 128  # ncclUniqueId


def nccl_rendezvous(store, key, rank, make_id, timeout_s):
    """The NCCL unique id every rank of the group needs: rank 0 makes it (make_id() -> bytes)
    and sets it in the store under key; the others wait for it there. Returns the id."""
    if rank == 0:
        uid = bytes(make_id())
        if len(uid) != NCCL_ID_BYTES:
            raise RuntimeError("sumo.torch.init: an NCCL id of %d bytes, not %d"
                               % (len(uid), NCCL_ID_BYTES))
        store.set(key, uid)
        return uid
    store.wait([key], timedelta(seconds=timeout_s))
    uid = bytes(store.get(key))
    if len(uid) != NCCL_ID_BYTES:
        raise RuntimeError("sumo.torch.init: the store holds %d bytes under %s, not an NCCL id "
                           "of %d" % (len(uid), key, NCCL_ID_BYTES))
    return uid


def _make_nccl_id(cu):
    buf = ctypes.create_string_buffer(NCCL_ID_BYTES)
    code = cu.sumo_nccl_unique_id(buf, NCCL_ID_BYTES)
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "sumo_nccl_unique_id (NCCL loads at run time: "
                         "SUMO_NCCL_LIBRARY, else libnccl.so.2; sumo printed why on stderr)")
    return buf.raw


def across_ready():
    """The two-level communicator (init() across hosts) at its first CUDA collective: the
    kernels of this rank's device, and the NCCL communicator of this rank's local rank on
    every host (its id through the group's store), added as the level between the hosts that
    carries device memory (sumo_comm_hier_add_across). Collective: every rank reaches it at
    the same collective. A no-op once made, and on other communicators."""
    if state.transport != "hierarchical" or _Cuda.across == state.comm.value:
        return
    cu = _lib.cuda()
    device = _Cuda.device
    if device is None:
        current = torch.cuda.current_device()
        device = current if current in _Cuda.kernels or not _Cuda.kernels \
            else next(iter(_Cuda.kernels))
    if device not in _Cuda.kernels:
        _add_kernels(cu, device, "the device cuda:%d between the hosts" % device)
    hosts, host = state.size // state.local_size, state.rank // state.local_size
    where = "host %d of %d, local rank %d, cuda:%d" % (host, hosts, state.local_rank, device)
    uid = nccl_rendezvous(_stores._store_of(state.group),
                          "%shier_nccl/%d" % (state.key_root, state.local_rank), host,
                          lambda: _make_nccl_id(cu), _deadline_s())
    across = ctypes.c_void_p()
    code = cu.sumo_comm_create_nccl_rank(hosts, uid, len(uid), host, device, None,
                                         ctypes.byref(across))
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "sumo_comm_create_nccl_rank between the hosts (%s; sumo "
                         "printed NCCL's reason on stderr)" % where)
    code = cu.sumo_comm_add_cuda(across, _Cuda.kernels[device])
    if code == SUMO_SUCCESS:
        code = lib.sumo_comm_hier_add_across(state.comm, across)
    if code != SUMO_SUCCESS:
        err = _lib.error(code, state.comm, "sumo_comm_hier_add_across (%s)" % where)
        lib.sumo_comm_destroy(across)  # still ours: the two-level communicator did not take it
        raise broken_by(err)
    _Cuda.device = device
    _Cuda.across = state.comm.value


def device_op(op):
    """The op a CUDA allreduce on the two-level communicator runs: Adasum of one tensor
    (SUMO_OP_ADASUM) as the hierarchical op (made at the first, collective), whose tree runs
    over the hosts' averages on the NCCL level; any other op as it is (an Adasum op of a
    layout made for CUDA buffers is hierarchical already: _tensors.adasum_op)."""
    if op != SUMO_OP_ADASUM:
        return op
    if _Cuda.adasum is None or _Cuda.adasum[0] != state.comm.value:
        opts = sumo_adasum_options(ctypes.sizeof(sumo_adasum_options), None, 0, 1, 0)
        out = ctypes.c_uint32()
        raise_for(lib.sumo_op_create_adasum(state.comm, ctypes.byref(opts), ctypes.byref(out)),
                  "sumo_op_create_adasum (hierarchical, for CUDA tensors across hosts)")
        _Cuda.adasum = (state.comm.value, out.value)
    return _Cuda.adasum[1]

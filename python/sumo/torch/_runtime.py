"""The process's sumo communicator, tensor checks, and the one worker thread that completes
asynchronous work (DDP hook futures).

Where the communicator comes from (init):
  - mpirun (Open MPI, MPICH): sumo's MPI transport over MPI_COMM_WORLD, as before;
  - torchrun, or any torch.distributed process group (init_process_group already called, or a
    group passed in): every rank of the group on one host -> sumo's shared-memory transport,
    rendezvousing through the group's store ("shm"); across hosts -> sumo's collectives over
    TCP connections of its own, met through the group's store ("tcp"; transport="group":
    over the group's own point-to-point calls, _pg_transport.py), with sum and average on
    the hierarchical path (_hier.py);
  - srun (a Slurm job step): the process group made from the step's variables (_slurm.py:
    rank 0 on the step's first host, a port from the job and step ids), then as torchrun's;
  - init(store=..., rank=..., size=...): processes started each on its own (no launcher that
    ends them all when one fails) meet through a store that lives in none of them: those of
    one host over sumo's shared memory, those of several hosts over sumo's TCP connections
    met through the store (transport="tcp"; "group": a gloo group made from the store), one
    communicator per membership: the communicator sumo.torch.elastic shrinks and grows;
  - no launcher: one rank (threads transport).
A launcher sumo cannot join (PBS, LSF, a WORLD_SIZE without a rendezvous, a Slurm step that
lacks a variable) is refused with a message, never turned into a world of one.
"""
import atexit
import collections
import ctypes
import os
import queue
import socket
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import _lib, _slurm
from .._abi import (SUMO_SUCCESS, SUMO_ERR_INVALID_ARGUMENT, SUMO_ERR_TIMEOUT,
                    SUMO_ERR_PEER_FAILURE, SUMO_FLOAT32, SUMO_FLOAT64, SUMO_FLOAT16,
                    SUMO_BFLOAT16, SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM,
                    SUMO_COLLECTIVE_ALLREDUCE, SUMO_COLLECTIVE_BROADCAST,
                    SUMO_COLLECTIVE_BARRIER, sumo_adasum_options, sumo_agree_options,
                    sumo_collective, sumo_shm_options, sumo_tcp_options,
                    sumo_shrink_info, sumo_shrink_options)
from .._lib import lib, check, SumoError

_DTYPES = {
    torch.float32: SUMO_FLOAT32,
    torch.float64: SUMO_FLOAT64,
    torch.float16: SUMO_FLOAT16,
    torch.bfloat16: SUMO_BFLOAT16,
}

# Launchers that start one process per rank set one of these.
_MPI_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
# torchrun (torch.distributed.run) and torch's env:// rendezvous.
_TORCHRUN_VARS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
_ENV_RENDEZVOUS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Launchers that start several processes that sumo does not join by itself.
_OTHER_LAUNCHERS = (("SLURM_NTASKS", "a Slurm batch script outside an srun step"),
                    ("PBS_NP", "PBS"), ("LSB_DJOB_NUMPROC", "LSF"))

class _State:
    comm = None          # ctypes.c_void_p: the sumo_comm
    transport = None     # "mpi", "shm", "tcp", "group", "nccl" or "threads"
    group = None         # the torch.distributed group the ranks are (process-group path)
    pg_transport = None  # the group's operations, kept alive while sumo may call them
    pg_transport_old = None  # the previous membership's, until its communicator is gone
    store = None         # the store adapter, likewise
    key_root = None      # the store's keys of this job: new memberships meet under it
    memberships = 0      # communicators that replaced the first (shrinks, grows)
    agreements = 0       # group store jobs: agreements tried since the last membership
    heart = None         # group store jobs: the thread that beats for this process
    stranded = None      # why this process cannot follow its peers' new membership
    admitted = 0         # join tickets handed out that a grow took in (store jobs)
    joined = False       # this process joined a running job (it came without the state)
    hier = None          # _hier.Hierarchy: the allreduce across hosts, hierarchical
    made_group = False   # sumo called init_process_group, so it destroys the group
    failed = False       # an unhandled exception is ending the process
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    worker = None
    broken = False       # a peer failed or timed out: end by aborting, not finalizing
    initialized_mpi = 0  # sumo initialised MPI, so it finalizes it


state = _State()

# Every collective sumo.torch ran: (start, end, bytes) in time.perf_counter() seconds, for
# "time in communication" and "bytes exchanged" figures. take_timeline() empties it; bounded,
# so a program that never reads it does not grow.
_timeline = collections.deque(maxlen=1 << 16)
_timeline_lock = threading.Lock()


def record(t0, t1, nbytes):
    with _timeline_lock:
        _timeline.append((t0, t1, nbytes))


def take_timeline():
    with _timeline_lock:
        out = list(_timeline)
        _timeline.clear()
    return out


def union_seconds(intervals):
    """Length of the union of (start, end, ...) intervals: overlapping buckets count once."""
    total, end = 0.0, None
    for t0, t1, *_ in sorted(intervals):
        if end is None or t0 > end:
            total += t1 - t0
            end = t1
        elif t1 > end:
            total += t1 - end
            end = t1
    return total


def require_init():
    if state.comm is None:
        raise RuntimeError("sumo.torch: call sumo.torch.init() first")
    return state.comm


class HorovodInternalError(RuntimeError):
    """A collective failed because a peer was lost or did not come in time (Horovod's name for
    it): sumo.torch.elastic.run rolls back to the last commit and goes on with the processes
    still there."""


class HostsUpdatedInterrupt(RuntimeError):
    """Processes asked to join (Horovod's name): sumo.torch.elastic.run makes the
    communicator again with them, at the commit() that found them. skip_sync: the state need
    not be synced afterwards (as in Horovod: only when hosts were removed)."""

    def __init__(self, skip_sync=False):
        super().__init__("the membership changed: processes asked to join")
        self.skip_sync = skip_sync


class PeerLost(SumoError, HorovodInternalError):
    """The SumoError of a collective that failed with SUMO_ERR_PEER_FAILURE or SUMO_ERR_TIMEOUT:
    a HorovodInternalError too, which is what elastic.run recovers from."""


def lost_or(e):
    """SumoError e, or its PeerLost where a peer was lost or late."""
    if e.code in (SUMO_ERR_TIMEOUT, SUMO_ERR_PEER_FAILURE):
        return PeerLost(e.code, e.name, str(e))
    return e


def error_for(code, what=None):
    """The exception for a failed call's `code` (PeerLost for a lost or late peer)."""
    return lost_or(_lib.error(code, state.comm, what))


def broken_by(e):
    """lost_or(e), the job marked broken where that is a PeerLost: what a failed collective
    raises, here (raise_for) or in the paths across hosts, which get SumoErrors of their own."""
    lost = lost_or(e)
    if lost is not e:
        state.broken = True
    return lost


def raise_for(code, what=None):
    """Raises the SumoError for `code`; a timeout or dead peer marks the job as broken."""
    if code == SUMO_SUCCESS:
        return
    raise broken_by(_lib.error(code, state.comm, what))


def adasum_op(comm, layout, what):
    """A sumo op for Adasum per tensor on buffers packing tensors of `layout` (their element
    counts, in order), valid on comm until sumo_op_destroy. Collective: every rank creates
    the same ops in the same order."""
    counts = (ctypes.c_size_t * len(layout))(*layout)
    opts = sumo_adasum_options(ctypes.sizeof(sumo_adasum_options), counts, len(layout), 0, 0)
    out = ctypes.c_uint32()
    raise_for(lib.sumo_op_create_adasum(comm, ctypes.byref(opts), ctypes.byref(out)),
              "sumo_op_create_adasum for " + what)
    # The CUDA design across hosts takes the layout itself (_hier_collective).
    _ADASUM_LAYOUTS[(comm.value, out.value)] = tuple(layout)
    return out.value


# (communicator, op) -> the layout of an Adasum op adasum_op made.
_ADASUM_LAYOUTS = {}


def tensor_args(t, name):
    """(pointer, count, sumo dtype) of a tensor sumo may read and write in place. Anything
    sumo would have to copy or cannot reduce is refused, naming the tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("sumo: %s is a %s, not a torch.Tensor" % (name, type(t).__name__))
    if t.device.type == "cuda":
        cuda_ready(t, name)
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


# -- CUDA tensors ---------------------------------------------------------------------------------
#
# A CUDA tensor goes to sumo as its device pointer: libsumo_cuda's kernels (one object per
# device, made at the first tensor on it and added to the communicator) run every touch of its
# data on the device, on the caller's current stream, and the host waits for them before the
# call returns; no byte goes through host memory. Transports that move device memory: the
# threads transport (one rank: nothing moves), NCCL (init(transport="nccl")), and the shared-
# memory transport (torchrun's processes on one node), whose ranks' kernels read and write each
# other's device buffers through CUDA IPC (one GPU or several; memory IPC cannot export, as
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True gives, is refused by the C library, naming
# what to change). Across hosts (the hierarchical path, init()'s default there), the allreduce
# of CUDA tensors is sumo_hier.h's: CUDA IPC inside each host, NCCL between the hosts
# (_hier.py). The MPI and process-group transports move host memory only and refuse CUDA
# tensors.

# Transports whose collectives take device buffers.
CUDA_TRANSPORTS = ("threads", "nccl", "shm")
# Of those, the ones whose peers read this rank's device buffers outside its current stream
# (NCCL's own stream, other processes): what was queued on that stream must be complete first.
_PEERS_READ_ELSEWHERE = ("nccl", "shm")


class _Cuda:
    kernels = {}     # device index -> sumo_cuda_kernels (ctypes.c_void_p)
    device = None    # the NCCL communicator's device


def _device_index(device):
    return device.index if device.index is not None else torch.cuda.current_device()


def _peers_read_elsewhere():
    return state.transport in _PEERS_READ_ELSEWHERE or state.hier is not None


def cuda_ready(t, name):
    """Makes the communicator take CUDA tensor t (its device's kernels, once), or refuses it
    by name: a transport that cannot move device memory, a device other than the NCCL
    communicator's, no libsumo_cuda, no device."""
    if state.comm is not None and state.transport not in CUDA_TRANSPORTS and state.hier is None:
        raise ValueError("sumo: tensor %s is on %s; the %s transport moves host memory only "
                         "(init(transport=\"nccl\") takes CUDA tensors, one GPU per rank)"
                         % (name, t.device, state.transport))
    index = _device_index(t.device)
    if index in _Cuda.kernels:
        return
    if (state.transport == "nccl" or state.hier is not None) and _Cuda.device is not None \
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


def collective(kind, sendbuf, recvbuf, count, dtype, stream, op=0, root=0, request=None):
    """sumo_collective_run (or _start into request) of one collective whose kernels run on
    `stream`: the stream-taking form of sumo_allreduce and the others, for CUDA tensors."""
    if state.hier is not None:
        return _hier_collective(kind, sendbuf, recvbuf, count, dtype, stream, op, request)
    c = sumo_collective(ctypes.sizeof(sumo_collective), kind, sendbuf, recvbuf, count, dtype,
                        op, root, stream or None)
    if request is None:
        return lib.sumo_collective_run(state.comm, ctypes.byref(c))
    return lib.sumo_collective_start(state.comm, ctypes.byref(c), ctypes.byref(request))


def _hier_collective(kind, sendbuf, recvbuf, count, dtype, stream, op, request):
    """A CUDA buffer across hosts: the allreduce of sumo_hier.h (_hier.py), set up at the first
    one. It has no asynchronous form: it runs now, and a request asked for is a barrier's on
    the flat communicator (every rank asks for it at the same call), complete soon after."""
    if kind != SUMO_COLLECTIVE_ALLREDUCE:
        raise ValueError("sumo: across hosts, CUDA tensors take the allreduce alone (CUDA IPC in "
                         "each host, NCCL between them); for broadcast, allgather and "
                         "reduce-scatter of CUDA tensors use init(transport=\"nccl\")")
    layout = None
    if op not in (SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM):
        layout = _ADASUM_LAYOUTS.get((state.comm.value, op))
        if layout is None:
            raise ValueError("sumo: op %d is not one the allreduce of CUDA tensors across hosts "
                             "takes (sum, average, Adasum)" % op)
        op = SUMO_OP_ADASUM
    hier = state.hier
    try:
        if hier.cuda is None:
            _setup_cuda_hier(hier)
        hier.cuda_allreduce(sendbuf, recvbuf, count, dtype, op, layout, stream,
                            "allreduce of a CUDA buffer across hosts")
    except SumoError as e:
        raise broken_by(e) from None
    if request is None:
        return SUMO_SUCCESS
    c = sumo_collective(ctypes.sizeof(sumo_collective), SUMO_COLLECTIVE_BARRIER, None, None, 0,
                        0, 0, 0, None)
    return lib.sumo_collective_start(state.comm, ctypes.byref(c), ctypes.byref(request))


def _setup_cuda_hier(hier):
    cu = _lib.cuda()
    device = _Cuda.device
    if device is None:
        current = torch.cuda.current_device()
        device = current if current in _Cuda.kernels or not _Cuda.kernels \
            else next(iter(_Cuda.kernels))
    if device not in _Cuda.kernels:
        _add_kernels(cu, device, "the hierarchical path's device cuda:%d" % device)
    store = _store_of(state.group)

    def nccl_id(local_rank, host):
        return nccl_rendezvous(store, "%shier_nccl/%d" % (state.key_root, local_rank), host,
                               lambda: _make_nccl_id(cu), _deadline_s())

    hier.setup_cuda(cu, _Cuda.kernels[device], device, nccl_id)
    _Cuda.device = device


def allreduce_call(t, ptr, n, dt, op, request=None):
    """sumo_allreduce (request None) or sumo_allreduce_start of tensor t in place: for a CUDA
    tensor the stream-taking form, its kernels on the current stream. Returns the code."""
    if t.device.type != "cuda":
        if request is None:
            return lib.sumo_allreduce(ptr, ptr, n, dt, op, state.comm)
        return lib.sumo_allreduce_start(ptr, ptr, n, dt, op, state.comm, ctypes.byref(request))
    stream = current_stream(t)
    inputs_ready(t)
    return collective(SUMO_COLLECTIVE_ALLREDUCE, ptr, ptr, n, dt, stream, op=op,
                      request=request)


def fail_together(exc, code=SUMO_ERR_INVALID_ARGUMENT):
    """Raises exc here after failing this rank's peers at once: they are entering (or will
    enter) the collective this rank cannot make, and get `code` naming this rank instead of
    waiting out the deadline."""
    if state.comm is not None and state.size > 1:
        sync()
        lib.sumo_comm_fail(state.comm, code, str(exc).encode(errors="replace")[:200])
    raise exc


def checked_tensor(t, name):
    """tensor_args for a tensor that is about to enter a collective: refused on every rank."""
    try:
        return tensor_args(t, name)
    except (TypeError, ValueError) as e:
        fail_together(e)


class Worker:
    """One persistent thread that runs blocking sumo calls (request waits, ACGA's apply) in
    the order they were queued and completes their futures. Persistent because a new thread
    per bucket costs milliseconds a step; one thread because sumo's collectives must run in
    the same order on every rank, and the queue keeps the order the backward pass made."""

    def __init__(self):
        self._q = queue.Queue()
        self._t = threading.Thread(target=self._run, name="sumo-worker", daemon=True)
        self._t.start()

    def _run(self):
        while True:
            job = self._q.get()
            if job is None:
                self._q.task_done()
                return
            fn, fut = job
            try:
                value = fn()
            except BaseException as e:  # handed to whoever waits on the future
                fut.set_exception(e)
            else:
                fut.set_result(value)
            self._q.task_done()

    def submit(self, fn, devices=None):
        """devices: the CUDA devices of the result's tensors (future_devices)."""
        fut = torch.futures.Future(devices=devices) if devices else torch.futures.Future()
        self._q.put((fn, fut))
        return fut

    def drain(self):
        """Returns when every queued job has finished: a blocking collective issued from the
        caller's thread must not overtake the queued ones."""
        self._q.join()

    def busy(self):
        """Whether queued jobs have not finished."""
        return self._q.unfinished_tasks > 0

    def stop(self):
        self._q.put(None)
        self._t.join()


def _launcher():
    """Who started this process: "mpi", "torchrun", None (nobody), or the name of a launcher
    sumo does not join."""
    if any(v in os.environ for v in _MPI_VARS):
        return "mpi"
    if any(v in os.environ for v in _TORCHRUN_VARS) or all(v in os.environ for v in _ENV_RENDEZVOUS):
        return "torchrun"
    if _slurm.in_step(os.environ):
        return "srun"
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return "a launcher that set WORLD_SIZE=%s without MASTER_ADDR and MASTER_PORT" \
            % os.environ["WORLD_SIZE"]
    for var, name in _OTHER_LAUNCHERS:
        if int(os.environ.get(var, "1") or 1) > 1:
            return name
    return None


def _deadline_s():
    """SUMO_TIMEOUT as sumo reads it, its default included (the environment was checked
    before)."""
    value = ctypes.c_char_p()
    lib.sumo_setting(b"SUMO_TIMEOUT", ctypes.byref(value))
    return float(value.value)


def _check_environment():
    msg = ctypes.create_string_buffer(256)
    if lib.sumo_env_check(msg, len(msg)) != SUMO_SUCCESS:
        raise ValueError("sumo.torch.init: " + msg.value.decode())


def init(timeout=None, process_group=True, transport=None, group=None, store=None, rank=None,
         size=None, join=False):
    """Creates the process's communicator: over MPI under mpirun, over the torch.distributed
    group under torchrun (or when one exists, or `group` is given: a subgroup's ranks alone),
    else one rank. transport forces "mpi", "shm" (one host), "tcp" (sumo's own connections,
    met through the group's store: the default across hosts), "group" (the group's own calls,
    a callback per message), "hierarchical" or "threads". With
    process_group, torch.distributed's default group is created too when nobody has (gloo),
    for the user's own DDP.

    store, rank, size: processes started each on its own meet through `store` as rank `rank`
    of `size`, with no launcher and no process group: what sumo.torch.elastic needs
    (docs/torch.md, "Elastic training"). Those of one host go over sumo's shared memory
    (transport "shm", the default); transport="tcp" puts them on sumo's TCP connections met
    through the store, one communicator per membership, which is what spans hosts ("group":
    a gloo group made from the store instead, every message through the interpreter). The store must outlive any one
    process: a torch.distributed.FileStore, a TCPStore served by a process of its own, or
    (shm only) the path of a directory (sumo's directory store), fresh for each job.
    join=True with a torch.distributed.Store instead of rank and size: this process joins the
    job running on that store at its next commit (sumo.torch.elastic), and init returns once
    it is a member."""
    if state.comm is not None:
        return
    over = None
    if store is not None or rank is not None or size is not None or join:
        _check_store_args(store, rank, size, transport, group, join)
        over, transport = transport or "shm", "store"
    _check_environment()
    launcher = _launcher()
    if launcher == "srun" and not dist.is_initialized():
        _slurm.step(os.environ)  # refused here, naming the variable, when incomplete
    if transport is None:
        if group is not None or (dist.is_initialized() and launcher != "mpi"):
            transport = "pg"
        elif launcher == "mpi":
            transport = "mpi"
        elif launcher in ("torchrun", "srun"):
            transport = "pg"
        elif launcher is not None:
            raise RuntimeError(
                "sumo.torch.init: this process was started by %s, which sumo does not join: "
                "start the job with torchrun or mpirun, or call "
                "torch.distributed.init_process_group yourself first (sumo then joins its "
                "group), rather than train as independent worlds of one" % launcher)
        else:
            transport = "threads"
    if transport not in ("mpi", "threads", "shm", "tcp", "group", "hierarchical", "pg", "nccl",
                         "store"):
        raise ValueError("sumo.torch.init: transport must be 'mpi', 'shm', 'tcp', 'group', "
                         "'hierarchical', 'nccl' or 'threads', not %r" % (transport,))
    try:
        if transport == "mpi":
            _init_mpi(process_group)
        elif transport == "threads":
            comm = ctypes.c_void_p()
            check(lib.sumo_comm_create_threads(1, ctypes.byref(comm)), None,
                  "sumo_comm_create_threads")
            _adopt(comm, "threads", 0, 1)
            if process_group and not dist.is_initialized():
                _init_gloo()  # a world of one, for DDP
                state.made_group = True
        elif transport == "nccl":
            _init_nccl(group)
        elif transport == "store":
            _init_join(store) if join else _init_store(store, rank, size, over)
        else:
            _init_group(group, transport)
        if timeout is not None:
            set_timeout(timeout)
    except BaseException:
        # Nothing half made survives a failed init (MPI is finalized again by sumo itself
        # when it started it and failed).
        _teardown()
        raise
    state.worker = Worker()
    atexit.register(shutdown)
    _watch_exceptions()


def _adopt(comm, transport, local_rank, local_size):
    state.comm = comm
    state.transport = transport
    r, s = ctypes.c_int(), ctypes.c_int()
    check(lib.sumo_comm_rank(comm, ctypes.byref(r)), comm)
    check(lib.sumo_comm_size(comm, ctypes.byref(s)), comm)
    state.rank, state.size = r.value, s.value
    state.local_rank, state.local_size = local_rank, local_size


def _init_mpi(process_group):
    if not _lib.HAVE_MPI:
        raise RuntimeError("sumo.torch.init: launched by mpirun but libsumo was built "
                           "without MPI: no %s (install libopenmpi-dev and rebuild)"
                           % _lib.MPI_LIBRARY)
    mpi = _lib.mpi()
    comm = ctypes.c_void_p()
    initialized = ctypes.c_int(0)
    check(mpi.sumo_mpi_world_create(ctypes.byref(initialized), ctypes.byref(comm)), None,
          "sumo_mpi_world_create (MPI with MPI_THREAD_MULTIPLE on MPI_COMM_WORLD)")
    state.initialized_mpi = initialized.value
    r, s = ctypes.c_int(), ctypes.c_int()
    _adopt(comm, "mpi", 0, 1)
    check(mpi.sumo_mpi_world_local(ctypes.byref(r), ctypes.byref(s)), comm)
    state.local_rank, state.local_size = r.value, s.value
    if process_group and not dist.is_initialized():
        _init_gloo()
        state.made_group = True


def _membership(group):
    """The group sumo.torch runs on (the default one when None), this rank in it, its size."""
    base = group if group is not None else dist.group.WORLD
    rank, size = dist.get_rank(base), dist.get_world_size(base)
    if rank < 0:
        raise RuntimeError("sumo.torch.init: this process is not a member of the group passed")
    return base, rank, size


def _init_group(group, transport):
    """sumo over a torch.distributed group: the processes of one host through sumo's shared
    memory (rendezvous through the group's store), else through the group itself."""
    from . import _pg_transport as pgt
    if not dist.is_initialized():
        if _launcher() == "srun":
            # The step's rank 0 listens on the first host of the step, at a port both the
            # job and the step name.
            step = _slurm.step(os.environ)
            dist.init_process_group("gloo", init_method="tcp://%s:%d" % (step["host"], step["port"]),
                                    rank=step["rank"], world_size=step["size"],
                                    timeout=timedelta(seconds=_deadline_s()))
        else:
            # torchrun's rendezvous: env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
            dist.init_process_group("gloo", timeout=timedelta(seconds=_deadline_s()))
        state.made_group = True
    base, rank, size = _membership(group)
    # Where each rank runs: hosts by name and boot id, so containers on one host that do not
    # share memory are not taken for one machine. (A digest in a tensor, not
    # all_gather_object, which needs numpy in torch 2.x.)
    import hashlib
    here = hashlib.sha256(("%s\0%s" % (socket.gethostname(), _boot_id())).encode()).digest()
    mine = torch.frombuffer(bytearray(here), dtype=torch.uint8)
    gathered = [torch.empty(len(here), dtype=torch.uint8) for _ in range(size)]
    dist.all_gather(gathered, mine, group=base)
    where = [bytes(t.tolist()) for t in gathered]
    from . import _hier
    hosts = _hier.hosts_of(where, _local_size())
    local = [r for r in range(size) if hosts[r] == hosts[rank]]
    one_host = len(local) == size
    state.group = base
    hierarchical = transport == "hierarchical"
    # Which allreduces take it: every one it offers when asked for by name; by default, across
    # hosts, sum and average only (the chain: faster than the flat path on both of
    # docs/results.md's models), while Adasum's gather design is slower than the flat path on
    # the larger one and stays opt-in. Everything else, and transport="group": the flat path.
    hier_ops = (SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM)
    # The flat path across hosts (every collective the hierarchical path does not take): sumo's
    # TCP transport, met through the group's store, whose messages never enter the
    # interpreter; transport="group" keeps the group's own calls (a callback per message).
    if transport == "pg":
        transport = "shm" if one_host and size > 1 else "tcp"
        hierarchical = not one_host
        hier_ops = (SUMO_OP_SUM, SUMO_OP_AVERAGE)
    if hierarchical:
        transport = "tcp"
    if transport == "shm" and not one_host:
        raise RuntimeError("sumo.torch.init: transport 'shm' needs every rank on one host; "
                           "this group spans %d" % len(set(where)))
    nodes = len(set(hosts))
    per_node = size // nodes if all(hosts.count(h) == size // nodes for h in set(hosts)) else 0
    if transport in ("shm", "tcp"):
        store = pgt.StoreAdapter(_store_of(base))
        state.store = store
        prefix = _key_prefix(base)
        state.key_root = prefix
        if transport == "shm":
            comm = make_shm(store, rank, size, prefix, "the group's store")
        else:
            comm = make_tcp(store, rank, size, prefix, per_node, "the group's store")
    else:
        state.pg_transport = pgt.GroupTransport(base)
        comm = state.pg_transport.comm(per_node, "sumo_comm_create_transport over the "
                                       "torch.distributed group")
    _adopt(comm, transport, local.index(rank), len(local))
    if hierarchical:  # over tcp (above): the store's adapter is made
        state.hier = _hier.Hierarchy(base, hosts, store, _key_prefix(base),
                                     lambda r: pgt_global(base, r), _deadline_s())
        state.hier.ops = frozenset(hier_ops)


def make_shm(store, rank, size, prefix, where):
    """sumo_comm_create_shm of `size` processes meeting through store (a _pg_transport
    adapter) under prefix; raises the SumoError with the transport's reason."""
    comm = ctypes.c_void_p()
    err = ctypes.create_string_buffer(256)
    opts = sumo_shm_options(ctypes.sizeof(sumo_shm_options), rank, size, store.pointer(),
                            prefix.encode(), 0, ctypes.cast(err, ctypes.c_char_p), len(err))
    code = lib.sumo_comm_create_shm(ctypes.byref(opts), ctypes.byref(comm))
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "sumo_comm_create_shm (rank %d of %d) over %s: %s"
                         % (rank, size, where, err.value.decode(errors="replace")))
    return comm


def make_tcp(store, rank, size, prefix, node_local_size, where, route=None, alive=None):
    """sumo_comm_create_tcp of `size` processes meeting through store (a _pg_transport
    adapter) under prefix: each listens, while they meet, on the address through which its
    host reaches route (default MASTER_ADDR: the store's host). alive: (prefix, the
    heartbeat's number of each rank, -1 for none) of an elastic job's members, watched while
    they meet. Raises the SumoError with the transport's reason."""
    comm = ctypes.c_void_p()
    err = ctypes.create_string_buffer(256)
    route = route or os.environ.get("MASTER_ADDR") or None
    opts = sumo_tcp_options(ctypes.sizeof(sumo_tcp_options), rank, size, store.pointer(),
                            prefix.encode(), None, route and route.encode(), node_local_size,
                            ctypes.cast(err, ctypes.c_char_p), len(err))
    if alive is not None:
        beats = (ctypes.c_int * size)(*alive[1])
        opts.alive_prefix, opts.alive_ranks = alive[0].encode(), beats
    code = lib.sumo_comm_create_tcp(ctypes.byref(opts), ctypes.byref(comm))
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "sumo_comm_create_tcp (rank %d of %d) over %s: %s"
                         % (rank, size, where, err.value.decode(errors="replace")))
    return comm


def _check_store_args(store, rank, size, transport, group, join):
    if transport not in (None,) + _STORE_TRANSPORTS or group is not None:
        raise ValueError("sumo.torch.init: store, rank and size make the communicator of "
                         "processes started on their own, over shared memory (transport "
                         "'shm'), sumo's TCP connections met through the store ('tcp') or a "
                         "gloo group made from the store ('group'); transport=%r and group do "
                         "not go with them" % (transport,))
    if transport in _ACROSS and isinstance(store, (str, bytes, os.PathLike)):
        raise ValueError("sumo.torch.init: transport=%r spans hosts, whose processes beat and "
                         "agree in the store: give a torch.distributed.Store (a FileStore or a "
                         "TCPStore), not a directory" % transport)
    if join:
        if store is None or rank is not None or size is not None:
            raise ValueError("sumo.torch.init: join=True takes a store and no rank or size "
                             "(the job hands them out)")
        return
    if store is None or rank is None or size is None:
        raise ValueError("sumo.torch.init: store, rank and size go together (got store=%r, "
                         "rank=%r, size=%r)" % (store, rank, size))
    for name, v in (("rank", rank), ("size", size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError("sumo.torch.init: %s must be an int, not %r" % (name, v))
    if not 0 <= rank < size:
        raise ValueError("sumo.torch.init: rank %d is not a rank of %d" % (rank, size))


def store_adapter(store):
    """The _pg_transport adapter of a store as init() takes it: a path names sumo's directory
    store, anything else is a torch.distributed.Store."""
    from . import _pg_transport as pgt
    if isinstance(store, (str, bytes, os.PathLike)):
        return pgt.DirStore(store)
    if not isinstance(store, dist.Store):
        raise TypeError("sumo.torch.init: store must be a torch.distributed.Store (FileStore, "
                        "TCPStore) or a directory's path, not %r" % (store,))
    return pgt.StoreAdapter(store)


# Keys of the communicators that processes started on their own make: one job per store, so
# the root is fixed; each membership adds its number.
_STORE_ROOT = "sumo/elastic/"
# The transports of such jobs, and of those the ones that span hosts: their processes cannot
# see each other's deaths, so they beat in the store and agree through it.
_STORE_TRANSPORTS = ("shm", "tcp", "group")
_ACROSS = ("tcp", "group")


def store_across():
    """Whether this process is in a store job across hosts (heartbeats, store agreement)."""
    return state.key_root == _STORE_ROOT and state.transport in _ACROSS


def _init_store(store, rank, size, over):
    """The communicator of processes started on their own, through `store`: over shared memory
    (over "shm"), sumo's TCP connections ("tcp") or a gloo group of its own ("group"). No
    torch.distributed default group is made: one would keep the membership it started
    with."""
    state.store = store_adapter(store)
    state.key_root = _STORE_ROOT
    comm = _make_member(over, _STORE_ROOT + "0/", rank, size, "the store given to init()")
    _adopt_member(comm, over, rank, size)


def _make_member(over, prefix, rank, size, where, alive=None):
    """A store job's communicator of one membership, meeting under prefix: over shared memory
    (over "shm"), sumo's TCP connections ("tcp") or a gloo group made from the store
    ("group"). alive (tcp): make_tcp's, the members' heartbeats. Raises PeerLost when a
    member does not come (or dies while they meet): the old communicator stays as it was."""
    if over == "shm":
        return make_shm(state.store, rank, size, prefix, where)

    def make():
        if over == "group":
            return make_group(prefix, rank, size, where)
        try:
            # Each listens on the address through which its host reaches the store's (a
            # TCPStore's host; a FileStore's hosts share a file system, not a route).
            return make_tcp(state.store, rank, size, prefix, 0, where,
                            getattr(state.store.store, "host", None), alive)
        except SumoError as e:
            raise lost_or(e) from None

    def drop(comm):
        lib.sumo_comm_destroy(comm)
        if over == "group":  # make_group's transport goes; the one in use stays
            state.pg_transport, state.pg_transport_old = state.pg_transport_old, None

    return _committed(make, prefix, rank, size, where, alive, drop)


# What compare_set returns for a key the store does not hold (its expected value).
_ABSENT = b"\0absent\0"


def _committed(make, prefix, rank, size, where, alive, drop):
    """make()'s communicator once every member has made its own, or PeerLost on every member
    (drop(comm) then undoes the making).

    Across hosts a meeting can end differently on two ranks: a member that dies once some of
    its peers have met it fails the meeting on the others only. Those that kept the new
    communicator would count one membership more than those that agree again, and the two
    sides would never meet again. So each member counts itself in the store once it has made
    its communicator (prefix/made, the store's atomic add), and the first decision set under
    prefix/outcome stands, the same for every member (the store's compare-and-set): "ok" once
    all have counted themselves; "fail" from a member whose making failed, or that sees a
    member stop beating for SUMO_LIVENESS_TIMEOUT (alive: make_tcp's heartbeats), or the
    deadline pass. On "fail" every member drops what it made and raises PeerLost, so all agree
    again from the same membership."""
    store = state.store.store
    decided, counted = prefix + "outcome", prefix + "made"

    def decide(value):
        got = store.compare_set(decided, b"", value)
        return bytes(got) if got else value

    try:
        comm = make()
    except Exception:
        decide(b"fail")
        raise
    store.add(counted, 1)
    beats = {}
    if alive is not None:
        beats = {n: None for n in alive[1] if n >= 0}
    liveness, end = _liveness_s(), time.monotonic() + _deadline_s()
    looked = None  # when the beats were last read: as often as they change, not every poll
    while True:
        verdict = bytes(store.compare_set(decided, _ABSENT, _ABSENT))
        if verdict != _ABSENT:
            break
        if int(store.add(counted, 0)) >= size:
            verdict = decide(b"ok")
            break
        now, stalled = time.monotonic(), False
        if looked is None or now - looked >= liveness / 10:
            looked = now
            for n, last in beats.items():
                value = bytes(store.compare_set("%s%d" % (alive[0], n), _ABSENT, _ABSENT))
                if last is None or last[0] != value:
                    beats[n] = (value, now)
                stalled = stalled or now - beats[n][1] > liveness
        if stalled or now > end:
            verdict = decide(b"fail")
            break
        time.sleep(0.01)
    if verdict != b"ok":
        drop(comm)
        raise PeerLost(SUMO_ERR_PEER_FAILURE, _lib.result_name(SUMO_ERR_PEER_FAILURE),
                       "making the communicator of %d over %s: a member failed to make its own "
                       "or was lost while they met (the store's verdict under %s)"
                       % (size, where, decided))
    return comm


def _adopt_member(comm, over, rank, size):
    """Makes a store job's first communicator this process's. A tcp or group job's processes
    may span hosts: their place on this one is the launcher's LOCAL_RANK and LOCAL_WORLD_SIZE
    where it sets them, and each beats in the store from now on."""
    if over not in _ACROSS:
        _adopt(comm, "shm", rank, size)
        return
    _adopt(comm, over, int(os.environ.get("LOCAL_RANK", 0)),
           int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    _start_heart()


def make_group(prefix, rank, size, where):
    """sumo's communicator of `size` processes over a gloo group made from the job's store
    under prefix (rank `rank`). Its transport becomes state.pg_transport, and the one before
    stays referenced (state.pg_transport_old) until replace_comm has destroyed the old
    communicator. Raises PeerLost when a member does not come: the caller's old communicator
    stays as it was."""
    from . import _pg_transport as pgt
    try:
        pg = pgt.make_gloo(dist.PrefixStore(prefix + "pg/", state.store.store), rank, size,
                           _deadline_s())
    except Exception as e:  # a member that never came (dead, or left out)
        code = SUMO_ERR_TIMEOUT if "timeout" in str(e).lower() else SUMO_ERR_PEER_FAILURE
        raise PeerLost(code, _lib.result_name(code), "making the gloo group of %d over %s: %s"
                       % (size, where, e)) from None
    t = pgt.GroupTransport(None, name="torch.distributed (elastic)", own=pg)
    comm = t.comm(0, "sumo_comm_create_transport over the gloo group of %d" % size)
    # The old transport stays referenced until its communicator is destroyed.
    state.pg_transport, state.pg_transport_old = t, state.pg_transport
    return comm


# -- heartbeats (store jobs across hosts) ------------------------------------------------------------
#
# Across hosts no process sees another's end, so each one beats in the store: a counter under
# the current membership's alive/<rank>, rewritten ten times per SUMO_LIVENESS_TIMEOUT. The
# survivors' agreement (sumo_store_agree) takes a rank whose beat stood still that long for
# dead, so a lost process costs that, not the collectives' deadline.

def _liveness_s():
    value = ctypes.c_char_p()
    raise_for(lib.sumo_setting(b"SUMO_LIVENESS_TIMEOUT", ctypes.byref(value)),
              "SUMO_LIVENESS_TIMEOUT")
    return float(value.value)


def alive_prefix():
    return "%sm%d/alive/" % (state.key_root, state.memberships)


class _Heart:
    def __init__(self, store, period_s):
        self.store, self.period_s = store, period_s
        self.beats = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sumo-heartbeat", daemon=True)
        self.thread.start()

    def beat(self):
        with self.lock:
            self.beats += 1
            beats = self.beats
        self.store.set("%s%d" % (alive_prefix(), state.rank), str(beats))

    def _run(self):
        while not self.stop.is_set():
            try:
                self.beat()
            except Exception:  # the store gone: the job is ending, or this process is lost
                return
            self.stop.wait(self.period_s)

    def halt(self):
        self.stop.set()
        self.thread.join()


def _start_heart():
    state.heart = _Heart(state.store.store, _liveness_s() / 10)


def _stop_heart():
    heart, state.heart = state.heart, None
    if heart is not None:
        heart.halt()


# -- processes that join a running job (store jobs) ----------------------------------------------
#
# Through the store's keys under key_root: a joiner takes a ticket (the store's atomic add on
# join/tickets) and waits for join/<ticket>; at each commit() rank 0 reads how many tickets
# were handed out and every member learns it (elastic.State.check_host_updates); when some are
# new, every member raises HostsUpdatedInterrupt, rank 0 writes each new ticket's place (its
# rank, the new size, the memberships so far, the tickets taken in, the key prefix, the
# transport, the members' number: across hosts the joiners watch the members' heartbeats
# while they meet), and the members and the joiners make the larger communicator together,
# the members keeping their ranks. A ticket is taken in once, whether its holder comes or not: one
# that does not come makes the making time out on the members, who then shrink back to
# themselves. Only a torch.distributed.Store has the atomic add; sumo's directory store has not.

_TICKETS = "join/tickets"
_CLOSED = "join/closed"


def _join_store():
    """The torch.distributed.Store joiners meet the members in, or None (no store job, or a
    store without add)."""
    if state.key_root != _STORE_ROOT or state.store is None:
        return None
    return state.store.store


def join_tickets():
    """Rank 0: the join tickets handed out so far (state.admitted where no one can join);
    the others' answer is not read."""
    store = _join_store()
    if state.rank != 0 or store is None:
        return state.admitted
    return int(store.add(_STORE_ROOT + _TICKETS, 0))


def grow(tickets):
    """Every member, after HostsUpdatedInterrupt: the communicator made again with the holders
    of the tickets after state.admitted up to `tickets`, ranked after the members in ticket
    order. A PeerLost when the making fails (a joiner or a member did not come): the members'
    old communicator is still theirs to shrink."""
    store = _join_store()
    new = tickets - state.admitted
    if store is None or new <= 0:
        return
    first, size = state.admitted + 1, state.size + new
    prefix = membership_prefix("grow")
    state.admitted = tickets
    if state.rank == 0:
        for k in range(new):
            store.set(_STORE_ROOT + "join/%d" % (first + k), "%d %d %d %d %s %s %d" % (
                state.size + k, size, state.memberships + 1, tickets, prefix, state.transport,
                state.size))
    # The members keep their ranks and beat; the joiners do not yet.
    alive = (alive_prefix(), list(range(state.size)) + [-1] * new) if store_across() else None
    try:
        comm = _make_member(state.transport, prefix, state.rank, size,
                            "the store (processes joining)", alive)
    except SumoError as e:
        raise error_for(e.code, "making the communicator with %d joining process%s: %s"
                        % (new, "" if new == 1 else "es", e)) from None
    beats, old_size = alive_prefix(), state.size
    replace_comm(comm, state.rank, size)
    if store_across():
        _forget(beats, old_size, [])


def _init_join(store):
    """A process joining the job on `store`: a ticket, then its place once the members are at
    a commit, then the larger communicator with them."""
    adapter = store_adapter(store)
    if adapter.store is None:
        adapter.close()
        raise ValueError("sumo.torch.init: join=True needs a torch.distributed.Store (its atomic "
                         "add hands out the tickets); sumo's directory store has set and get only")
    torch_store = adapter.store
    ticket = int(torch_store.add(_STORE_ROOT + _TICKETS, 1))
    key = _STORE_ROOT + "join/%d" % ticket
    # The members take joiners in at their next commit, which may be a while: wait in slices,
    # and give up once the job has ended (rank 0's shutdown says so).
    while True:
        try:
            torch_store.wait([key], timedelta(seconds=1))
            break
        except RuntimeError:  # the slice passed (torch 2.x: DistStoreError, a RuntimeError)
            if torch_store.add(_STORE_ROOT + _CLOSED, 0):
                adapter.close()
                raise RuntimeError("sumo.torch.init: the job on this store ended before "
                                   "taking in join ticket %d" % ticket) from None
    rank, size, memberships, admitted, prefix, over, members = \
        bytes(torch_store.get(key)).decode().split()
    state.store = adapter
    state.key_root = _STORE_ROOT
    # The members beat under the membership before the one made now, each at its rank.
    alive = None
    if over in _ACROSS:
        alive = ("%sm%d/alive/" % (_STORE_ROOT, int(memberships) - 1),
                 [r if r < int(members) else -1 for r in range(int(size))])
    comm = _make_member(over, prefix, int(rank), int(size), "the store (joining)", alive)
    state.memberships, state.admitted = int(memberships), int(admitted)  # the heart's keys
    state.joined = True
    _adopt_member(comm, over, int(rank), int(size))


def _close_job():
    """Rank 0 of a store job, leaving: processes still waiting to join stop waiting."""
    store = _join_store()
    if store is not None and state.rank == 0:
        try:
            store.add(_STORE_ROOT + _CLOSED, 1)
        except Exception:  # leaving anyway: a store already gone has no one waiting on it
            pass


def _local_size():
    """SUMO_LOCAL_SIZE (ranks per simulated host), or 0 when unset."""
    value = ctypes.c_char_p()
    lib.sumo_setting(b"SUMO_LOCAL_SIZE", ctypes.byref(value))
    return int(value.value) if value.value else 0


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


def _init_nccl(group):
    """sumo over NCCL, one GPU per rank (the current CUDA device: torch.cuda.set_device first),
    the id shared through the torch.distributed group's store (init_process_group is made, as
    for the other group transports, when nobody has). Every collective takes CUDA tensors of
    that device (and CPU tensors, through NCCL's staging)."""
    try:
        cu = _lib.cuda()
    except RuntimeError as e:
        raise RuntimeError("sumo.torch.init: transport 'nccl' needs libsumo_cuda: %s" % e) \
            from None
    count, why = _lib.cuda_devices()
    if count == 0:
        raise RuntimeError("sumo.torch.init: transport 'nccl' needs a CUDA device: %s" % why)
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=_deadline_s()))
        state.made_group = True
    base, rank, size = _membership(group)
    device = torch.cuda.current_device()
    uid = nccl_rendezvous(_store_of(base), _key_prefix(base) + "nccl_id", rank,
                          lambda: _make_nccl_id(cu), _deadline_s())
    comm = ctypes.c_void_p()
    code = cu.sumo_comm_create_nccl_rank(size, uid, len(uid), rank, device, None,
                                         ctypes.byref(comm))
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "sumo_comm_create_nccl_rank (rank %d of %d on cuda:%d; "
                         "sumo printed NCCL's reason on stderr)" % (rank, size, device))
    state.group = base
    _adopt(comm, "nccl", 0, 1)
    _Cuda.device = device
    _add_kernels(cu, device, "the NCCL communicator's device cuda:%d" % device)


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _store_of(group):
    store = dist.distributed_c10d._get_default_store()
    if group is not None and group is not dist.group.WORLD:
        ranks = "-".join(str(pgt_global(group, r)) for r in range(dist.get_world_size(group)))
        store = dist.PrefixStore("group%s/" % ranks, store)
    return store


def pgt_global(group, r):
    from ._pg_transport import global_rank
    return global_rank(group, r)


_communicators_made = [0]


def _key_prefix(group):
    """Unique per communicator in the store: the run, its restart (a torchrun restart meets
    a fresh store key space), and a count of the communicators this process made."""
    _communicators_made[0] += 1
    return "sumo/%s/%s/%d/" % (os.environ.get("TORCHELASTIC_RUN_ID", "run"),
                               os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
                               _communicators_made[0])


def _watch_exceptions():
    """An unhandled exception ends the process: remember it, so shutdown tells the peers at
    once (sumo_comm_abort) instead of leaving them to their deadline."""
    import sys
    previous = sys.excepthook

    def hook(kind, value, tb):
        state.failed = True
        previous(kind, value, tb)

    if getattr(sys.excepthook, "_sumo", False):
        return
    hook._sumo = True
    sys.excepthook = hook


def set_timeout(seconds):
    """The deadline of every wait inside sumo's collectives (the environment's SUMO_TIMEOUT,
    else 300 s, by default)."""
    raise_for(lib.sumo_comm_set_timeout(require_init(), float(seconds)), "sumo_comm_set_timeout")


def _init_gloo():
    # Rank 0 chooses the address and a free port and broadcasts them over sumo, so no
    # MASTER_ADDR/MASTER_PORT has to be set; values from the environment win.
    msg = torch.zeros(258, dtype=torch.float64)
    if state.rank == 0:
        addr = os.environ.get("MASTER_ADDR")
        if not addr:
            addr = "127.0.0.1" if state.local_size == state.size else socket.gethostname()
        port = os.environ.get("MASTER_PORT")
        if not port:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        raw = addr.encode()[:256]
        msg[0] = int(port)
        msg[1] = len(raw)
        msg[2:2 + len(raw)] = torch.tensor(list(raw), dtype=torch.float64)
    broadcast_tensor(msg, 0, "the gloo rendezvous address")
    port = int(msg[0])
    addr = bytes(int(v) for v in msg[2:2 + int(msg[1])]).decode()
    timeout = ctypes.c_double()
    lib.sumo_comm_get_timeout(state.comm, ctypes.byref(timeout))
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (addr, port), rank=state.rank,
                            world_size=state.size,
                            timeout=timedelta(seconds=timeout.value))


def _in_place(fn, t, arg, what, name):
    """Runs a blocking in-place collective on t after the queued ones, timed and checked."""
    ptr, n, dt = tensor_args(t, name)
    sync()
    t0 = time.perf_counter()
    if t.device.type == "cuda":
        stream = current_stream(t)
        inputs_ready(t)
        if fn is lib.sumo_broadcast:
            code = collective(SUMO_COLLECTIVE_BROADCAST, ptr, ptr, n, dt, stream, root=int(arg))
        else:
            code = collective(SUMO_COLLECTIVE_ALLREDUCE, ptr, ptr, n, dt, stream, op=int(arg))
    else:
        code = fn(ptr, ptr, n, dt, int(arg), state.comm)
    raise_for(code, "%s of %s" % (what, name))
    record(t0, time.perf_counter(), n * t.element_size())


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
    raise_for(lib.sumo_mem_alloc(state.comm, nbytes, ctypes.byref(ptr)), "sumo_mem_alloc for " + what)
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
    raise_for(lib.sumo_mem_free(state.comm, ctypes.c_void_p(t.data_ptr())), "sumo_mem_free for " + what)


def broadcast_tensor(t, root, name):
    _in_place(lib.sumo_broadcast, t, root, "broadcast", name)


def allreduce_tensor(t, op, name):
    # CUDA tensors across hosts take the C design (collective(), _hier_collective).
    if state.hier is not None and int(op) in state.hier.ops and t.device.type != "cuda":
        hier_allreduce(t, int(op), None, "allreduce of " + name)
        return
    _in_place(lib.sumo_allreduce, t, op, "allreduce", name)


def hier_allreduce(t, kind, layout, what):
    """The hierarchical allreduce (state.hier), blocking, after the queued collectives."""
    dt = tensor_args(t, what)[2]
    sync()
    hier_run(t, dt, kind, layout, what, time.perf_counter())


def hier_run(t, dt, kind, layout, what, t0):
    """The hierarchical allreduce itself, on whatever thread keeps the collectives' order (the
    caller's after sync(), or the worker's): a peer lost or late makes the communicator
    unusable and raises PeerLost, as sumo's own collectives do (elastic.run recovers from
    that one only)."""
    try:
        state.hier.allreduce(t, dt, kind, layout, what)
    except SumoError as e:
        raise broken_by(e) from None
    record(t0, time.perf_counter(), t.numel() * t.element_size())


# Set by collectives.py: starts the asynchronous allreduces still waiting in fused buffers,
# so that they keep their place before the collective about to be issued.
before_collective = None


def sync():
    """Waits for the worker's queued collectives before the caller issues one of its own."""
    if state.worker is not None:
        state.worker.drain()
    if before_collective is not None:
        before_collective()


def _drop_hierarchy():
    hier, state.hier = state.hier, None
    if hier is not None:
        hier.destroy()


def _close_store():
    _stop_heart()  # it beats in the store
    store, state.store = state.store, None
    state.key_root = None
    if store is not None:
        store.close()


def _teardown():
    """Releases what a failed init made: the communicator, and the group sumo created."""
    comm, state.comm = state.comm, None
    _drop_hierarchy()
    if comm is not None:
        if state.transport == "mpi":
            _lib.mpi().sumo_mpi_world_finalize(comm, state.initialized_mpi)
        else:
            lib.sumo_comm_destroy(comm)
    _close_store()
    _release_kernels()
    if state.made_group and dist.is_initialized():
        dist.destroy_process_group()
    state.made_group = False
    state.transport = None


def shutdown():
    """Destroys the communicator without meeting the peers: a rank still busy after training
    (saving a checkpoint) is not taken for a dead one, and exit never waits on a peer. After
    a failure here (an unhandled exception, collectives still in flight) the peers are told
    at once; after a failed peer an MPI job is aborted (MPI_Finalize would wait for the
    missing process)."""
    if state.comm is None:
        return
    comm = state.comm
    pending = state.worker is not None and state.worker.busy()
    if state.failed or pending:
        lib.sumo_comm_abort(comm, b"the process is ending with an error" if state.failed
                            else b"the process is ending with collectives in flight")
        if state.hier is not None:
            state.hier.abort("the process is ending with an error" if state.failed
                             else "the process is ending with collectives in flight")
    if state.worker is not None and not state.broken:
        state.worker.stop()
    state.worker = None
    state.comm = None
    _drop_hierarchy()
    if state.transport == "mpi":
        if state.broken:
            _lib.mpi().sumo_mpi_world_abort(1)
        # Closing the group's connections first lets a peer blocked in it (DDP's constructor
        # checking shapes) fail at once rather than at its timeout.
        if state.made_group and dist.is_initialized():
            dist.destroy_process_group()
        _lib.mpi().sumo_mpi_world_finalize(comm, state.initialized_mpi)
    else:
        lib.sumo_comm_destroy(comm)
        if state.made_group and dist.is_initialized():
            dist.destroy_process_group()
    _close_job()
    _close_store()
    _release_kernels()  # the communicator borrowed them
    state.made_group = False


# -- a communicator replaced: what was made on it -------------------------------------------------
#
# When sumo.torch.elastic replaces the communicator (a shrink after a lost process, a grow when
# processes join), what was made on the old one goes with it: Adasum ops, memory from
# sumo_mem_alloc, C objects that keep it (ACGA's aggregators, DiLoCo's outer loop), requests in
# flight. The objects holding such things register here (bind) and are told twice:
# comm_closing() before the old communicator is destroyed (wait for what runs on it, let go of
# what it owns; never a collective: it is broken), comm_opened() once the new one is in place
# (make it again there). The second is collective (sumo_mem_alloc, sumo_op_create_adasum), so
# the objects are told in the order they were made, the same on every rank of a program that
# makes the same objects.

_bound = []  # weakref.ref of each bound object, in the order they were made


def bind(obj):
    """Registers obj (comm_closing(), comm_opened()) for replacements of the communicator."""
    if len(_bound) >= 256:
        _bound_objects()  # forget the dead ones
    _bound.append(weakref.ref(obj))


def _bound_objects():
    live = [o for o in (r() for r in _bound) if o is not None]
    _bound[:] = [weakref.ref(o) for o in live]
    return live


def replace_comm(comm, rank, size):
    """Makes comm (a sumo_comm of the current one's transport, this process rank `rank` of
    `size`, every rank on this host) the process's communicator in place of the current one,
    which is destroyed; the bound objects let go of the old one and make again on the new one
    what they need (collective)."""
    objects = _bound_objects()
    if state.worker is not None:
        state.worker.drain()  # the hooks' futures: on a broken communicator they fail at once
    for o in objects:
        o.comm_closing()
    old, state.comm = state.comm, None
    if old is not None:
        lib.sumo_comm_destroy(old)  # never waits for the peers
    state.pg_transport_old = None
    if state.transport == "group" or store_across():
        _adopt(comm, state.transport, state.local_rank, state.local_size)  # hosts' own numbering
    else:
        _adopt(comm, state.transport, rank, size)
    state.broken = False
    state.memberships += 1
    state.agreements = 0
    if state.heart is not None:
        # The new membership's first beat at once, not up to a period later: a member that
        # ends sooner (a fast communicator, a short job) has beaten in it all the same.
        try:
            state.heart.beat()
        except Exception:  # the store gone: the heart's own beat finds it so too
            pass
    for o in objects:
        o.comm_opened()


def membership_prefix(kind):
    """The store's key prefix under which the next membership meets (kind: "shrink" or
    "grow"): every process that takes part has seen the same memberships, so they agree."""
    return "%s%s%d/" % (state.key_root, kind, state.memberships + 1)


def shrink(value):
    """After a lost (or late) process: the processes still here agree (sumo_comm_shrink) and
    go on as a smaller communicator, numbered in their old order. Returns the smallest `value`
    any of them brought and the old rank of each new rank. A process that cannot go on with
    them (left out: it came after the deadline; or its transport cannot shrink) gets a
    SumoError that is not a HorovodInternalError, so elastic.run does not try again."""
    comm = require_init()
    if state.stranded:
        raise SumoError(SUMO_ERR_PEER_FAILURE, _lib.result_name(SUMO_ERR_PEER_FAILURE),
                        state.stranded)
    if state.worker is not None:
        state.worker.drain()
    if store_across():
        return _shrink_group(value)
    opts = sumo_shrink_options()
    raise_for(lib.sumo_shrink_options_default(ctypes.byref(opts)))
    err = ctypes.create_string_buffer(256)
    opts.value = int(value)
    opts.error = ctypes.cast(err, ctypes.c_char_p)
    opts.error_bytes = len(err)
    prefix = None
    if state.store is not None and state.key_root is not None:
        prefix = membership_prefix("shrink").encode()
        opts.store = state.store.pointer()
        opts.key_prefix = prefix
    old, info = _verdict_buffers()
    out = ctypes.c_void_p()
    code = lib.sumo_comm_shrink(comm, ctypes.byref(opts), ctypes.byref(out), ctypes.byref(info))
    _stranded_unless(code, err, "sumo_comm_shrink")
    replace_comm(out, info.rank, info.size)
    return info.value, list(old[:info.size])


def _verdict_buffers():
    """The sumo_shrink_info an agreement fills, and its array of the survivors' old ranks."""
    old = (ctypes.c_int * state.size)()
    return old, sumo_shrink_info(ctypes.sizeof(sumo_shrink_info), 0, 0, 0,
                                 ctypes.cast(old, ctypes.POINTER(ctypes.c_int)))


def _stranded_unless(code, err, call):
    """A failed agreement leaves this process out for good: it is remembered (state.stranded)
    and raised as a SumoError that elastic.run does not try again."""
    if code == SUMO_SUCCESS:
        return
    why = err.value.decode(errors="replace") or "no detail"
    state.stranded = ("sumo.torch.elastic: rank %d of %d cannot go on with the others after "
                      "a lost process: %s: %s: %s"
                      % (state.rank, state.size, call, _lib.result_name(code), why))
    raise SumoError(code, _lib.result_name(code), state.stranded)


def _shrink_group(value):
    """shrink() for a store job across hosts (over "tcp" or "group"): the agreement through
    the store (sumo_store_agree, with the heartbeats), then the survivors' communicator made
    from it. A member that died after it came makes the making fail on every survivor (over
    tcp within about SUMO_LIVENESS_TIMEOUT: the meeting watches the verdict's members'
    heartbeats): they raise PeerLost and agree again, under the next prefix, over the same
    old membership."""
    state.agreements += 1
    prefix = "%sshrink%d.%d/" % (state.key_root, state.memberships + 1, state.agreements)
    opts = sumo_agree_options()
    raise_for(lib.sumo_agree_options_default(ctypes.byref(opts)))
    err = ctypes.create_string_buffer(256)
    timeout = ctypes.c_double()
    lib.sumo_comm_get_timeout(state.comm, ctypes.byref(timeout))
    opts.rank, opts.size, opts.value = state.rank, state.size, int(value)
    opts.store = state.store.pointer()
    opts.key_prefix = prefix.encode()
    opts.timeout_s = timeout.value
    alive = alive_prefix().encode()
    opts.alive_prefix = alive
    opts.error = ctypes.cast(err, ctypes.c_char_p)
    opts.error_bytes = len(err)
    old, info = _verdict_buffers()
    code = lib.sumo_store_agree(ctypes.byref(opts), ctypes.byref(info))
    _stranded_unless(code, err, "sumo_store_agree")
    comm = _make_member(state.transport, prefix, info.rank, info.size,
                        "the store (after a lost process)", (alive_prefix(), old[:info.size]))
    beats, size, tried = alive_prefix(), state.size, state.agreements
    replace_comm(comm, info.rank, info.size)
    _forget(beats, size, ["%sshrink%d.%d/" % (state.key_root, state.memberships, a)
                          for a in range(1, tried + 1)])
    return info.value, list(old[:info.size])


def _forget(beats, size, agreements):
    """Rank 0 of a new membership of a store job across hosts: the old membership's heartbeats
    and the agreements' entries leave the store, the lost processes' among them. Every member
    made the new communicator, so every member has read the verdicts (the meetings' own keys
    are gone: each rank removes its own once its peers have read them). The verdicts stay: a process
    left out that comes only now must find the one that leaves it out, not agree alone and go
    on as a job of its own."""
    if state.rank != 0 or state.store is None or state.store.store is None:
        return
    store = state.store.store
    keys = ["%s%d" % (beats, r) for r in range(size)]
    for prefix in agreements:
        keys += ["%sin/%d" % (prefix, r) for r in range(size)]
    for key in keys:
        try:
            store.delete_key(key)
        except Exception:  # a store without delete keeps them: one store per job
            return

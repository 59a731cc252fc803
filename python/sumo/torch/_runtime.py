"""The process's sumo communicator, tensor checks, and the one worker thread that completes
asynchronous work (DDP hook futures)."""
import atexit
import collections
import ctypes
import os
import queue
import socket
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import _lib
from .._lib import lib, check, SumoError

_DTYPES = {
    torch.float32: _lib.FLOAT32,
    torch.float64: _lib.FLOAT64,
    torch.float16: _lib.FLOAT16,
    torch.bfloat16: _lib.BFLOAT16,
}

# Launchers that start one process per rank set one of these.
_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


class _State:
    comm = None          # ctypes.c_void_p: the sumo_comm
    transport = None     # "mpi" or "threads"
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


def raise_for(code, what=None):
    """Raises the SumoError for `code`; a timeout or dead peer marks the job as broken."""
    if code == _lib.SUCCESS:
        return
    if code in (4, 5):  # SUMO_ERR_TIMEOUT, SUMO_ERR_PEER_FAILURE
        state.broken = True
    raise _lib.error(code, state.comm, what)


def tensor_args(t, name):
    """(pointer, count, sumo dtype) of a tensor sumo may read and write in place. Anything
    sumo would have to copy or cannot reduce is refused, naming the tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("sumo: %s is a %s, not a torch.Tensor" % (name, type(t).__name__))
    if t.device.type != "cpu":
        raise ValueError("sumo: tensor %s is on %s; this build of sumo reduces CPU tensors only"
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

    def submit(self, fn):
        fut = torch.futures.Future()
        self._q.put((fn, fut))
        return fut

    def drain(self):
        """Returns when every queued job has finished: a blocking collective issued from the
        caller's thread must not overtake the queued ones."""
        self._q.join()

    def stop(self):
        self._q.put(None)
        self._t.join()


def _under_launcher():
    return any(v in os.environ for v in _LAUNCHER_VARS)


def init(timeout=None, process_group=True, transport=None):
    """Creates the communicator (MPI under mpirun, else the threads transport with one rank)
    and, with process_group, torch.distributed's gloo group for the user's own use."""
    if state.comm is not None:
        return
    if transport is None:
        transport = "mpi" if _under_launcher() else "threads"
    comm = ctypes.c_void_p()
    if transport == "mpi":
        if not _lib.HAVE_MPI:
            raise RuntimeError("sumo.torch.init: launched by mpirun but libsumo was built "
                               "without MPI (install libopenmpi-dev and rebuild)")
        initialized = ctypes.c_int(0)
        check(lib.sumo_mpi_world_create(ctypes.byref(initialized), ctypes.byref(comm)), None,
              "sumo_mpi_world_create (MPI with MPI_THREAD_MULTIPLE on MPI_COMM_WORLD)")
    elif transport == "threads":
        check(lib.sumo_comm_create_threads(1, ctypes.byref(comm)), None, "sumo_comm_create_threads")
    else:
        raise ValueError("sumo.torch.init: transport must be 'mpi' or 'threads'")
    state.comm = comm
    state.transport = transport
    state.initialized_mpi = initialized.value if transport == "mpi" else 0
    r, s = ctypes.c_int(), ctypes.c_int()
    check(lib.sumo_comm_rank(comm, ctypes.byref(r)), comm)
    check(lib.sumo_comm_size(comm, ctypes.byref(s)), comm)
    state.rank, state.size = r.value, s.value
    if transport == "mpi":
        check(lib.sumo_mpi_world_local(ctypes.byref(r), ctypes.byref(s)), comm)
        state.local_rank, state.local_size = r.value, s.value
    else:
        state.local_rank, state.local_size = 0, 1
    if timeout is not None:
        set_timeout(timeout)
    state.worker = Worker()
    atexit.register(shutdown)
    if process_group and not dist.is_initialized():
        _init_gloo()


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
                            timeout=timedelta(seconds=max(timeout.value, 30.0)))


def _in_place(collective, t, arg, what, name):
    """Runs a blocking in-place collective on t after the queued ones, timed and checked."""
    ptr, n, dt = tensor_args(t, name)
    sync()
    t0 = time.perf_counter()
    raise_for(collective(ptr, ptr, n, dt, int(arg), state.comm), "%s of %s" % (what, name))
    record(t0, time.perf_counter(), n * t.element_size())


def shared_empty(numel, dtype, what):
    """An uninitialised 1-D tensor for a buffer sumo reduces in place. Under MPI it lives in
    sumo_mem_alloc's memory, which every process of the node maps, so a collective whose
    buffers are all such runs without staging copies. Collective under MPI: every rank calls
    it in the same order. The memory goes with the communicator (shutdown())."""
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if state.transport != "mpi" or nbytes == 0:
        return torch.empty(numel, dtype=dtype)
    sync()
    ptr = ctypes.c_void_p()
    raise_for(lib.sumo_mem_alloc(state.comm, nbytes, ctypes.byref(ptr)), "sumo_mem_alloc for " + what)
    return torch.frombuffer((ctypes.c_byte * nbytes).from_address(ptr.value), dtype=dtype)


def node_maps_memory():
    """True when every rank is an MPI process of one node: shared_empty's memory is then
    mapped by every process, and collectives on it run without staging copies."""
    return state.transport == "mpi" and state.size > 1 and state.local_size == state.size


def shared_free(t, what):
    """Gives back a tensor shared_empty made (collective under MPI, like the allocation). The
    tensor must not be used afterwards: its storage is the freed memory."""
    if state.transport != "mpi" or t.numel() == 0:
        return
    sync()
    raise_for(lib.sumo_mem_free(state.comm, ctypes.c_void_p(t.data_ptr())), "sumo_mem_free for " + what)


def broadcast_tensor(t, root, name):
    _in_place(lib.sumo_broadcast, t, root, "broadcast", name)


def allreduce_tensor(t, op, name):
    _in_place(lib.sumo_allreduce, t, op, "allreduce", name)


def sync():
    """Waits for the worker's queued collectives before the caller issues one of its own."""
    if state.worker is not None:
        state.worker.drain()


def shutdown():
    """Destroys the communicator. After a failed peer the job is aborted (MPI_Finalize
    would wait for the missing process)."""
    if state.comm is None:
        return
    comm, state.comm = state.comm, None
    if state.worker is not None and not state.broken:
        state.worker.stop()
    state.worker = None
    if state.transport == "mpi":
        if state.broken:
            lib.sumo_mpi_world_abort(1)
        if dist.is_initialized():
            dist.destroy_process_group()
        lib.sumo_mpi_world_finalize(comm, state.initialized_mpi)
    else:
        lib.sumo_comm_destroy(comm)

"""The process's runtime, which every module of sumo.torch stands on: the communicator's state
(one _State object: its communicator, transport, rank and size, the store job's membership),
the errors a failed call raises (PeerLost for a lost or late peer, which marks the job
broken), the worker thread that completes asynchronous work in the order it was queued and
sync(), which keeps a blocking collective behind it, the timeline of collectives, and the
settings sumo reads (SUMO_TIMEOUT, SUMO_LIVENESS_TIMEOUT, SUMO_LOCAL_SIZE).

It imports none of the package's other modules: they import it, and each stands on it for one
concern of its own: _init.py (the launchers and the making of the first communicator),
_shutdown.py (letting go of it), _cuda.py (CUDA tensors and devices), _tensors.py (tensor
arguments, dtypes, node-shared memory), _calls.py (the blocking collectives on tensors and
the stream-taking calls of CUDA tensors), _stores.py (meeting through a store),
_membership.py (the store jobs' memberships on libsumo's sumo_elastic, and the
communicator replaced). The functions a test replaces (_cuda.py's CUDA plumbing,
_calls.collective, _stores.make_tcp) are reached through their module by every caller, so that
the replacement reaches them all.
"""
import collections
import ctypes
import queue
import threading

import torch

from .. import _lib
from .._abi import (SUMO_SUCCESS, SUMO_ERR_INVALID_ARGUMENT, SUMO_ERR_TIMEOUT,
                    SUMO_ERR_PEER_FAILURE)
from .._lib import lib, check, SumoError


class _State:
    comm = None          # ctypes.c_void_p: the sumo_comm
    transport = None     # "mpi", "shm", "hierarchical", "tcp", "group", "nccl" or "threads"
    group = None         # the torch.distributed group the ranks are (process-group path)
    pg_transport = None  # the group's operations, kept alive while sumo may call them
    pg_transport_old = None  # the previous membership's, until its communicator is gone
    store = None         # the store adapter, likewise
    key_root = None      # the store's keys of this job: new memberships meet under it
    elastic = None       # a store job's membership (_membership._Elastic: libsumo's)
    memberships = 0      # the current membership's number (shrinks and grows count)
    stranded = None      # why this process cannot follow its peers' new membership
    joined = False       # this process joined a running job (it came without the state)
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


def fail_together(exc, code=SUMO_ERR_INVALID_ARGUMENT):
    """Raises exc here after failing this rank's peers at once: they are entering (or will
    enter) the collective this rank cannot make, and get `code` naming this rank instead of
    waiting out the deadline."""
    if state.comm is not None and state.size > 1:
        sync()
        lib.sumo_comm_fail(state.comm, code, str(exc).encode(errors="replace")[:200])
    raise exc


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


def _deadline_s():
    """SUMO_TIMEOUT as sumo reads it, its default included (the environment was checked
    before)."""
    value = ctypes.c_char_p()
    lib.sumo_setting(b"SUMO_TIMEOUT", ctypes.byref(value))
    return float(value.value)


def _liveness_s():
    """SUMO_LIVENESS_TIMEOUT: how long a store job's member across hosts may stop beating
    before the others take it for dead (_membership.py)."""
    value = ctypes.c_char_p()
    raise_for(lib.sumo_setting(b"SUMO_LIVENESS_TIMEOUT", ctypes.byref(value)),
              "SUMO_LIVENESS_TIMEOUT")
    return float(value.value)


def _local_size():
    """SUMO_LOCAL_SIZE (ranks per simulated host), or 0 when unset."""
    value = ctypes.c_char_p()
    lib.sumo_setting(b"SUMO_LOCAL_SIZE", ctypes.byref(value))
    return int(value.value) if value.value else 0


def set_timeout(seconds):
    """The deadline of every wait inside sumo's collectives (the environment's SUMO_TIMEOUT,
    else 300 s, by default)."""
    raise_for(lib.sumo_comm_set_timeout(require_init(), float(seconds)), "sumo_comm_set_timeout")


def _adopt(comm, transport, local_rank, local_size):
    """Makes comm, over transport, the process's communicator: its rank and size as the
    communicator says, its place on this host as the caller knows it."""
    state.comm = comm
    state.transport = transport
    r, s = ctypes.c_int(), ctypes.c_int()
    check(lib.sumo_comm_rank(comm, ctypes.byref(r)), comm)
    check(lib.sumo_comm_size(comm, ctypes.byref(s)), comm)
    state.rank, state.size = r.value, s.value
    state.local_rank, state.local_size = local_rank, local_size


# Set by _fused.py: starts the asynchronous allreduces still waiting in fused buffers,
# so that they keep their place before the collective about to be issued.
before_collective = None


def sync():
    """Waits for the worker's queued collectives before the caller issues one of its own."""
    if state.worker is not None:
        state.worker.drain()
    if before_collective is not None:
        before_collective()

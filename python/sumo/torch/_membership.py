"""The memberships of a store job (processes started each on its own that meet through a
store, init(store=..., rank=..., size=...), or init(store=..., join=True) for one that comes
later): one libsumo sumo_elastic object per process (sumo_elastic.h) holds them. It beats in
the store, makes and keeps each membership's communicator, counts the join tickets at each
commit point, and replaces the communicator when a lost process makes the others shrink or
joiners make it grow; this module adapts it to the binding (the store adapter, a gloo group
as a making of the caller's, the objects made on the communicator, told of a replacement:
bind). The one-host shrink of a communicator no store job made (sumo_comm_shrink) is here too.
"""
import ctypes
import os
import threading
import weakref

import torch.distributed as dist

from .. import _lib
from .._abi import (ELASTIC_MAKE, SUMO_SUCCESS, SUMO_ERR_TIMEOUT, SUMO_ERR_PEER_FAILURE,
                    SUMO_ELASTIC_SHM, SUMO_ELASTIC_TCP, sumo_elastic_options, sumo_shrink_info,
                    sumo_shrink_options)
from .._lib import lib, SumoError
from . import _stores
from ._runtime import state, PeerLost, lost_or, raise_for, require_init, _adopt, _deadline_s


# The job's keys in its store (one job per store): libsumo's <root>a<n>/ per making and
# <root>join/ for the tickets.
_STORE_ROOT = "sumo/elastic/"
# The transports of such jobs, and of those the ones that span hosts.
_STORE_TRANSPORTS = ("shm", "tcp", "group")
_ACROSS = ("tcp", "group")


def store_job():
    """Whether this process is a member of a store job (its membership is the object's)."""
    return state.elastic is not None


class _Elastic:
    """This process's sumo_elastic. Over "shm" and "tcp" libsumo makes each membership
    itself; over "group" it calls back here (make_group) for a gloo group made from the
    store, whose transport must live as long as its communicator: the transports made are
    kept by communicator until it is gone."""

    def __init__(self, adapter, over, rank, size, join, timeout):
        self.adapter, self.over = adapter, over
        self.handle = ctypes.c_void_p()
        self.transports = {}  # communicator handle -> the GroupTransport it calls
        self.make = ELASTIC_MAKE(self._make) if over == "group" else ELASTIC_MAKE()
        opts = sumo_elastic_options()
        raise_for(lib.sumo_elastic_options_default(ctypes.byref(opts)))
        err = ctypes.create_string_buffer(512)
        opts.store = adapter.pointer()
        opts.key_prefix = _STORE_ROOT.encode()
        opts.rank, opts.size = (0, 0) if join else (rank, size)
        opts.transport = SUMO_ELASTIC_SHM if over == "shm" else SUMO_ELASTIC_TCP
        # Each listens on the address through which its host reaches the store's (a
        # TCPStore's host; a FileStore's hosts share a file system, not a route).
        route = getattr(adapter.store, "host", None) or os.environ.get("MASTER_ADDR")
        self.route = route.encode() if route else None
        opts.route_host = self.route
        opts.make = self.make
        opts.timeout_s = float(timeout) if timeout is not None else _deadline_s()
        opts.error = ctypes.cast(err, ctypes.c_char_p)
        opts.error_bytes = len(err)
        if join:
            code = _interruptible(lambda: lib.sumo_elastic_join(ctypes.byref(opts),
                                                                ctypes.byref(self.handle)))
        else:
            code = lib.sumo_elastic_create(ctypes.byref(opts), ctypes.byref(self.handle))
        if code != SUMO_SUCCESS:
            what = "joining the job" if join else "making the job's first communicator"
            raise lost_or(_lib.error(code, None, "sumo.torch.init: %s on %s: %s" % (
                what, "the store", err.value.decode(errors="replace"))))
        self._keep_current()

    def _make(self, ctx, making, out, error, error_bytes):
        m = making.contents
        try:
            comm, transport = make_group(self.adapter, m.key_prefix.decode(), m.rank, m.size,
                                         "the store")
        except Exception as e:  # noqa: BLE001 - a callback must not raise into C
            text = str(e).encode(errors="replace")[:max(error_bytes - 1, 0)] + b"\0"
            if error and error_bytes:
                ctypes.memmove(error, text, len(text))
            return getattr(e, "code", SUMO_ERR_PEER_FAILURE)
        self.transports[comm.value] = transport
        out[0] = comm.value
        return SUMO_SUCCESS

    def _keep_current(self):
        """Lets go of the transports whose communicators libsumo destroyed."""
        current = self.comm().value
        self.transports = {c: t for c, t in self.transports.items() if c == current}
        state.pg_transport = self.transports.get(current)
        state.pg_transport_old = None

    def _fail(self, code, what):
        msg = ctypes.c_char_p()
        lib.sumo_elastic_error_message(self.handle, ctypes.byref(msg))
        return _lib.error(code, None, "%s: %s" % (what, (msg.value or b"").decode(
            errors="replace")))

    def comm(self):
        comm = ctypes.c_void_p()
        raise_for(lib.sumo_elastic_comm(self.handle, ctypes.byref(comm)), "sumo_elastic_comm")
        return comm

    def generation(self):
        n = ctypes.c_int()
        lib.sumo_elastic_generation(self.handle, ctypes.byref(n))
        return n.value

    def commit(self):
        joiners = ctypes.c_int()
        code = lib.sumo_elastic_commit(self.handle, ctypes.byref(joiners))
        if code != SUMO_SUCCESS:
            state.broken = code in (SUMO_ERR_TIMEOUT, SUMO_ERR_PEER_FAILURE)
            raise lost_or(self._fail(code, "sumo.torch.elastic: the commit point"))
        return joiners.value

    def shrink(self, value, old):
        info = sumo_shrink_info(ctypes.sizeof(sumo_shrink_info), 0, 0, 0,
                                ctypes.cast(old, ctypes.POINTER(ctypes.c_int)))
        code = lib.sumo_elastic_shrink(self.handle, int(value), ctypes.byref(info))
        if code != SUMO_SUCCESS:
            return code, info
        self._keep_current()
        return code, info

    def grow(self, joiners):
        joined = ctypes.c_int()
        code = lib.sumo_elastic_grow(self.handle, int(joiners), ctypes.byref(joined))
        if code != SUMO_SUCCESS:
            raise self._fail(code, "sumo.torch.elastic: taking in %d joining process%s"
                             % (joiners, "" if joiners == 1 else "es"))
        self._keep_current()
        return joined.value

    def close(self):
        lib.sumo_elastic_close(self.handle)

    def destroy(self):
        handle, self.handle = self.handle, None
        if handle:
            lib.sumo_elastic_destroy(handle)  # the communicator, the heart, its beat
        self.transports = {}


_abandoned = []  # store adapters of joins interrupted while their thread still waits


def _interruptible(call):
    """call()'s result, the call on a thread of its own: a joiner waits in libsumo until a
    commit point takes it in or the job closes (join_wait_s 0), which may be long, and the
    interpreter sees Ctrl-C only between its own steps. (An interrupted wait leaves the
    thread with its ticket: the process is ending, and the members' making with a holder
    that never comes fails, which they survive.)"""
    out = []
    t = threading.Thread(target=lambda: out.append(call()), name="sumo join", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.5)
    return out[0]


def _init_store(store, rank, size, over, timeout=None):
    """The first membership of processes started on their own, through `store`: over shared
    memory (over "shm"), sumo's TCP connections ("tcp") or gloo groups made from the store
    ("group"). No torch.distributed default group is made: one would keep the membership it
    started with."""
    state.store = _stores.store_adapter(store)
    state.key_root = _STORE_ROOT
    state.elastic = _Elastic(state.store, over, rank, size, False, timeout)
    _adopt_member(over)


def _init_join(store, over, timeout=None):
    """A process joining the job on `store`: a ticket, then its place once the members are at
    a commit point, then the larger communicator with them (sumo_elastic_join, which waits
    until a commit point takes it in or the job closes)."""
    adapter = _stores.store_adapter(store)
    if adapter.store is None:
        adapter.close()
        raise ValueError("sumo.torch.init: join=True needs a torch.distributed.Store (the "
                         "jobs that take joiners); a job on sumo's directory store takes none")
    try:
        elastic = _Elastic(adapter, over, None, None, True, timeout)
    except KeyboardInterrupt:
        _abandoned.append(adapter)  # the join's thread still calls it
        raise
    except BaseException:
        adapter.close()
        raise
    state.store, state.key_root, state.elastic = adapter, _STORE_ROOT, elastic
    state.joined = True
    _adopt_member(over)


def _adopt_member(over):
    """Makes the object's communicator this process's. A tcp or group job's processes may
    span hosts: their place on this one is the launcher's where it says (torchrun's
    LOCAL_RANK and LOCAL_WORLD_SIZE, as libsumo reads them)."""
    comm = state.elastic.comm()
    state.memberships = state.elastic.generation()
    if over not in _ACROSS:
        _adopt(comm, over, *_rank_size(comm))  # one host: its place is its rank
        return
    if state.transport is None:  # the first: where the launcher put this process
        launch = _lib.bootstrap()
        known = launch.local_rank >= 0 and launch.local_size > 0
        state.local_rank, state.local_size = ((launch.local_rank, launch.local_size) if known
                                              else (0, 1))
    _adopt(comm, over, state.local_rank, state.local_size)


def make_group(adapter, prefix, rank, size, where):
    """sumo's communicator of `size` processes over a gloo group made from the job's store
    (adapter) under prefix (rank `rank`), and the transport it calls. Raises PeerLost when a
    member does not come."""
    from . import _pg_transport as pgt
    try:
        pg = pgt.make_gloo(dist.PrefixStore(prefix + "pg/", adapter.store), rank, size,
                           _deadline_s())
    except Exception as e:  # a member that never came (dead, or left out)
        code = SUMO_ERR_TIMEOUT if "timeout" in str(e).lower() else SUMO_ERR_PEER_FAILURE
        raise PeerLost(code, _lib.result_name(code), "making the gloo group of %d over %s: %s"
                       % (size, where, e)) from None
    t = pgt.GroupTransport(None, name="torch.distributed (elastic)", own=pg)
    return t.comm(0, "sumo_comm_create_transport over the gloo group of %d" % size), t


def tickets_taken():
    """The join tickets processes took in this store job so far (libsumo's count)."""
    count = ctypes.c_int()
    err = ctypes.create_string_buffer(256)
    code = lib.sumo_tickets_count(state.store.pointer(), _STORE_ROOT.encode(), 0,
                                  ctypes.byref(count), err, len(err))
    if code != SUMO_SUCCESS:
        raise _lib.error(code, None, "counting the join tickets: %s"
                         % err.value.decode(errors="replace"))
    return count.value


def close_job():
    """Leaving: rank 0 of a store job closes it to joiners still waiting; the object goes
    (its heart, its communicator, its beat in the store)."""
    elastic, state.elastic = state.elastic, None
    if elastic is None:
        return
    if state.rank == 0:
        elastic.close()
    elastic.destroy()
    state.pg_transport = None


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


def _closing():
    """Before the communicator goes: the hooks' futures finish (on a broken communicator they
    fail at once) and the bound objects let go of it. Returns them, for _opened."""
    objects = _bound_objects()
    if state.worker is not None:
        state.worker.drain()
    for o in objects:
        o.comm_closing()
    return objects


def _opened(objects, comm, rank, size):
    """comm (this process rank `rank` of `size`) is the process's communicator now; the bound
    objects make again on it what they need (collective)."""
    if store_job() and state.transport in _ACROSS:
        _adopt(comm, state.transport, state.local_rank, state.local_size)  # hosts' numbering
    else:
        _adopt(comm, state.transport, rank, size)
    state.broken = False
    state.memberships = state.elastic.generation() if store_job() else state.memberships + 1
    for o in objects:
        o.comm_opened()


def shrink(value):
    """After a lost (or late) process: the processes still here agree and go on as a smaller
    communicator, numbered in their old order. Returns the smallest `value` any of them
    brought and the old rank of each new rank. A process that cannot go on with them (left
    out: it came after the deadline; or its transport cannot shrink) gets a SumoError that is
    not a HorovodInternalError, so elastic.run does not try again."""
    comm = require_init()
    if state.stranded:
        raise SumoError(SUMO_ERR_PEER_FAILURE, _lib.result_name(SUMO_ERR_PEER_FAILURE),
                        state.stranded)
    objects = _closing()
    old = (ctypes.c_int * state.size)()
    if store_job():
        code, info = state.elastic.shrink(value, old)
        if code != SUMO_SUCCESS:
            _stranded(code, state.elastic._fail(code, "sumo_elastic_shrink"))
        _opened(objects, state.elastic.comm(), info.rank, info.size)
        return info.value, list(old[:info.size])
    # A communicator of one host that no store job made: it shrinks itself.
    opts = sumo_shrink_options()
    raise_for(lib.sumo_shrink_options_default(ctypes.byref(opts)))
    err = ctypes.create_string_buffer(256)
    opts.value = int(value)
    opts.error = ctypes.cast(err, ctypes.c_char_p)
    opts.error_bytes = len(err)
    if state.store is not None and state.key_root is not None:
        opts.store = state.store.pointer()
        opts.key_prefix = ("%sshrink%d/" % (state.key_root, state.memberships + 1)).encode()
    info = sumo_shrink_info(ctypes.sizeof(sumo_shrink_info), 0, 0, 0,
                            ctypes.cast(old, ctypes.POINTER(ctypes.c_int)))
    out = ctypes.c_void_p()
    code = lib.sumo_comm_shrink(comm, ctypes.byref(opts), ctypes.byref(out), ctypes.byref(info))
    if code != SUMO_SUCCESS:
        _stranded(code, _lib.error(code, None, "sumo_comm_shrink: %s"
                                   % (err.value.decode(errors="replace") or "no detail")))
    state.comm = None
    lib.sumo_comm_destroy(comm)  # never waits for the peers
    _opened(objects, out, info.rank, info.size)
    return info.value, list(old[:info.size])


def _stranded(code, error):
    """A failed agreement leaves this process out for good: it is remembered (state.stranded)
    and raised as a SumoError that elastic.run does not try again."""
    state.stranded = ("sumo.torch.elastic: rank %d of %d cannot go on with the others after "
                      "a lost process: %s" % (state.rank, state.size, error))
    raise SumoError(code, _lib.result_name(code), state.stranded)


def commit_point():
    """The processes that asked to join since the last membership (0 outside store jobs):
    collective over a store job's members, a PeerLost on every one of them when any saw a
    member's heartbeat stand still or the collective failed."""
    return state.elastic.commit() if store_job() else 0


def grow(joiners):
    """Every member, after a commit point found joiners: the communicator made again with
    them, ranked after the members in ticket order. When the making fails (a joiner that
    never came, a member lost meanwhile) the members keep the communicator they had, and
    those tickets are spent. Returns the processes taken in."""
    if not store_job() or joiners <= 0:
        return 0
    objects = _closing()
    joined = 0
    try:
        joined = state.elastic.grow(joiners)
    finally:
        _opened(objects, state.elastic.comm(), *_rank_size(state.elastic.comm()))
    return joined


def _rank_size(comm):
    r, s = ctypes.c_int(), ctypes.c_int()
    lib.sumo_comm_rank(comm, ctypes.byref(r))
    lib.sumo_comm_size(comm, ctypes.byref(s))
    return r.value, s.value

"""The memberships of a store job (processes started each on its own that meet through a
store, init(store=..., rank=..., size=...)): the first communicator, the store's verdict that
every member made its own (_committed), the heartbeats of processes on several hosts, and the
communicator replaced when a lost process makes the others shrink (shrink) or joiners make
it grow (_joiners.py), with the objects made on it told (bind). A module because this is
what sumo.torch.elastic stands on; the rest of the package only binds its objects here.
"""
import ctypes
import weakref

import torch.distributed as dist

from .. import _lib
from .._abi import (SUMO_SUCCESS, SUMO_ERR_TIMEOUT, SUMO_ERR_PEER_FAILURE, sumo_agree_options,
                    sumo_commit_options, sumo_heart_options, sumo_shrink_info,
                    sumo_shrink_options)
from .._lib import lib, SumoError
from . import _stores
from ._runtime import (state, PeerLost, lost_or, raise_for, require_init, _adopt, _deadline_s,
                       _liveness_s)


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
    state.store = _stores.store_adapter(store)
    state.key_root = _STORE_ROOT
    comm = _make_member(over, _STORE_ROOT + "0/", rank, size, "the store given to init()")
    _adopt_member(comm, over, rank, size)


def _make_member(over, prefix, rank, size, where, alive=None):
    """A store job's communicator of one membership, meeting under prefix: over shared memory
    (over "shm"), sumo's TCP connections ("tcp") or a gloo group made from the store
    ("group"). alive (tcp): make_tcp's, the members' heartbeats. Raises PeerLost when a
    member does not come (or dies while they meet): the old communicator stays as it was."""
    if over == "shm":
        return _stores.make_shm(state.store, rank, size, prefix, where)

    def make():
        if over == "group":
            return make_group(prefix, rank, size, where)
        try:
            # Each listens on the address through which its host reaches the store's (a
            # TCPStore's host; a FileStore's hosts share a file system, not a route).
            return _stores.make_tcp(state.store, rank, size, prefix, 0, where,
                            getattr(state.store.store, "host", None), alive)
        except SumoError as e:
            raise lost_or(e) from None

    def drop(comm):
        lib.sumo_comm_destroy(comm)
        if over == "group":  # make_group's transport goes; the one in use stays
            state.pg_transport, state.pg_transport_old = state.pg_transport_old, None

    return _committed(make, prefix, rank, size, where, alive, drop)


def _committed(make, prefix, rank, size, where, alive, drop):
    """make()'s communicator once every member has made its own, or PeerLost on every member
    (drop(comm) then undoes the making).

    Across hosts a meeting can end differently on two ranks: a member that dies once some of
    its peers have met it fails the meeting on the others only. Those that kept the new
    communicator would count one membership more than those that agree again, and the two
    sides would never meet again. So one outcome in the store under prefix stands for every
    member (libsumo's sumo_store_commit, sumo_elastic.h): "ok" once every member said it made
    its own; "fail" from a member whose making failed, one that sees a member's beat stand
    still for SUMO_LIVENESS_TIMEOUT (alive: make_tcp's heartbeats), or the deadline. On "fail"
    every member drops what it made and raises PeerLost, so all agree again from the same
    membership."""
    try:
        comm = make()
    except Exception:
        _commit(prefix, rank, size, where, alive, False)  # the others drop theirs: fail stands
        raise
    try:
        _commit(prefix, rank, size, where, alive, True)
    except Exception:
        drop(comm)
        raise
    return comm


def _commit(prefix, rank, size, where, alive, made):
    """This member's part of sumo_store_commit: PeerLost when the outcome is fail (not raised
    for a member whose own making failed: its error is the one to raise)."""
    opts = sumo_commit_options()
    raise_for(lib.sumo_commit_options_default(ctypes.byref(opts)))
    err = ctypes.create_string_buffer(512)
    opts.rank, opts.size, opts.made = rank, size, int(made)
    opts.store = state.store.pointer()
    opts.key_prefix = prefix.encode()
    opts.timeout_s = _deadline_s()
    ranks = None
    if alive is not None:
        ranks = (ctypes.c_int * max(len(alive[1]), 1))(*alive[1])
        opts.alive_prefix = alive[0].encode()
        opts.alive_ranks = ranks
        opts.alive_s = _liveness_s()
    opts.error = ctypes.cast(err, ctypes.c_char_p)
    opts.error_bytes = len(err)
    code = lib.sumo_store_commit(ctypes.byref(opts))
    if code == SUMO_SUCCESS or not made:
        return
    detail = err.value.decode(errors="replace")
    if code == SUMO_ERR_PEER_FAILURE:
        raise PeerLost(code, _lib.result_name(code),
                       "making the communicator of %d over %s: a member failed to make its own "
                       "or was lost while they met (%s)" % (size, where, detail))
    raise _lib.error(code, None, detail)


def _adopt_member(comm, over, rank, size):
    """Makes a store job's first communicator this process's. A tcp or group job's processes
    may span hosts: their place on this one is the launcher's where it says (torchrun's
    LOCAL_RANK and LOCAL_WORLD_SIZE, as libsumo reads them), and each beats in the store from
    now on."""
    if over not in _ACROSS:
        _adopt(comm, "shm", rank, size)
        return
    launch = _lib.bootstrap()
    known = launch.local_rank >= 0 and launch.local_size > 0
    _adopt(comm, over, launch.local_rank if known else 0, launch.local_size if known else 1)
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


# -- heartbeats (store jobs across hosts) -------------------------------------------------------
#
# Across hosts no process sees another's end, so each one beats in the store: a counter under
# the current membership's alive/<rank>, rewritten ten times per SUMO_LIVENESS_TIMEOUT by
# libsumo's heart (sumo_heart, sumo_elastic.h), a thread of its own. The survivors' agreement
# (sumo_store_agree) takes a rank whose beat stood still that long for dead, so a lost process
# costs that, not the collectives' deadline.


def alive_prefix():
    return "%sm%d/alive/" % (state.key_root, state.memberships)


class _Heart:
    """This process's sumo_heart over the job's store. Its thread calls the store adapter's
    callbacks, which take the interpreter's lock: every call here goes through ctypes, which
    lets go of that lock, so halt() can wait for a beat under way. A store that fails stops
    the thread for good (the job is ending, or this process is lost to the others)."""

    def __init__(self, adapter):
        # The adapter holds the sumo_store and its callbacks: kept until the thread is joined.
        self.adapter = adapter
        opts = sumo_heart_options()
        raise_for(lib.sumo_heart_options_default(ctypes.byref(opts)))
        err = ctypes.create_string_buffer(256)
        opts.store = adapter.pointer()
        opts.key_prefix = alive_prefix().encode()
        opts.rank = state.rank  # period_s 0: a tenth of SUMO_LIVENESS_TIMEOUT, as the watches read it
        opts.error = ctypes.cast(err, ctypes.c_char_p)
        opts.error_bytes = len(err)
        handle = ctypes.c_void_p()
        code = lib.sumo_heart_start(ctypes.byref(opts), ctypes.byref(handle))
        if code != SUMO_SUCCESS:
            raise _lib.error(code, None, err.value.decode(errors="replace"))
        self.handle = handle

    def beat(self):
        """One beat now, under the current membership's key (a new membership's first);
        SumoError when the store fails."""
        raise_for(lib.sumo_heart_move(self.handle, alive_prefix().encode(), state.rank),
                  "sumo_heart_move")
        raise_for(lib.sumo_heart_beat(self.handle), "sumo_heart_beat")

    def halt(self):
        handle, self.handle = self.handle, None
        if handle:
            lib.sumo_heart_stop(handle)


def _start_heart():
    state.heart = _Heart(state.store)


def _stop_heart():
    heart, state.heart = state.heart, None
    if heart is not None:
        heart.halt()


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

"""sumo over a torch.distributed process group: the transport operations of sumo_ext.h
(sendrecv, allgather, barrier) on the group's own point-to-point and collective calls, and
the key-value store adapter that sumo's shared-memory transport rendezvouses through.

sumo's C collectives run unchanged over these operations (the seam of
docs/design/seams.md): the algorithms, the Gram form's single exchange, the agreement before
every call and the deadlines are the library's; this file only moves bytes. sumo calls the
operations from whichever thread runs its collective (the caller's, or its progress thread
for asynchronous requests), one call at a time per communicator.

The transport runs on a group of its own (dist.new_group over the same ranks), so its
messages never interleave with the user's collectives on their group. An elastic job across
hosts (sumo.torch.init(store=..., transport="group")) gives it instead a gloo group made from
the job's store and registered nowhere, one per membership: it ends that group's connections
when the communicator breaks, so that peers waiting on this rank fail at once rather than at
their deadline.
"""
import ctypes
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import _lib
from .._abi import (ABORT, ALLGATHER, BARRIER, CARRIES, DESTROY, ERROR_MESSAGE, SENDRECV,
                    STORE_GET, STORE_REMOVE, STORE_SET, SUMO_ERR_PEER_FAILURE, SUMO_ERR_TIMEOUT,
                    SUMO_SUCCESS, sumo_store, sumo_transport_desc, sumo_transport_ops)


def _remaining(deadline_ns):
    # sumo's deadlines are CLOCK_MONOTONIC nanoseconds, which time.monotonic_ns reads on Linux.
    return max(0.0, (deadline_ns - time.monotonic_ns()) / 1e9)


def _code_of(exc):
    """The sumo_result for what torch raised: a deadline passed, else a peer gone."""
    text = str(exc).lower()
    return SUMO_ERR_TIMEOUT if "timed out" in text or "timeout" in text else SUMO_ERR_PEER_FAILURE


def _bytes_at(ptr, n):
    """A uint8 tensor over n bytes at ptr (no copy); a one-byte dummy for empty messages, which
    still travel (both sides know they are empty)."""
    if n == 0 or not ptr:
        return torch.zeros(1, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_ubyte * n).from_address(ptr), dtype=torch.uint8)


def global_rank(group, rank):
    if group is None or group is dist.group.WORLD:
        return rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, rank)


def make_gloo(store, rank, size, timeout_s):
    """A gloo group of `size` processes that meet through `store` (a torch.distributed.Store,
    its keys under a prefix unique to this group), registered nowhere: torch.distributed's
    default group keeps the membership it was made with, and an elastic job has several."""
    return dist.ProcessGroupGloo(store, rank, size, timedelta(seconds=timeout_s))


class GroupTransport:
    """The operations sumo calls, over `group`'s ranks (its own private gloo group), or over
    `own`, a group from make_gloo that the transport takes over."""

    def __init__(self, group, name="torch.distributed", own=None):
        self.owned = own is not None  # never changes: _abort lets the group itself go
        if self.owned:
            self.rank, self.size = own.rank(), own.size()
            self.group = own
            self.global_of = list(range(self.size))
        else:
            self.rank = dist.get_rank(group)
            self.size = dist.get_world_size(group)
            ranks = [global_rank(group, r) for r in range(self.size)]
            # Every rank creates it, in the same order: a collective call.
            self.group = dist.new_group(ranks=ranks, backend="gloo")
            self.global_of = ranks
        self.base = group
        self.error = ctypes.create_string_buffer(256)
        self.aborted = False
        self.name = name.encode()
        # The callbacks stay referenced for the transport's life: ctypes frees a CFUNCTYPE
        # object's thunk with it.
        self.ops = sumo_transport_ops(ctypes.sizeof(sumo_transport_ops), self.name,
                                      SENDRECV(self._sendrecv), ALLGATHER(self._allgather),
                                      BARRIER(self._barrier), ABORT(self._abort),
                                      DESTROY(self._destroy), ERROR_MESSAGE(self._error_message),
                                      CARRIES(self._carries))

    def desc(self, node_local_size=0):
        return sumo_transport_desc(ctypes.sizeof(sumo_transport_desc), self.rank, self.size,
                                   node_local_size, ctypes.pointer(self.ops), None)

    def comm(self, node_local_size, what):
        """sumo_comm_create_transport over these operations (this object must outlive the
        communicator): the communicator, or the SumoError saying what was being made."""
        comm = ctypes.c_void_p()
        desc = self.desc(node_local_size)
        _lib.check(_lib.lib.sumo_comm_create_transport(ctypes.byref(desc), ctypes.byref(comm)),
                   None, what)
        return comm

    # -- the operations: never raise (ctypes would print and return 0, sumo's success) ------
    def _fail(self, code, what, exc):
        self.error.value = ("%s: %s" % (what, exc)).encode(errors="replace")[:250]
        return code

    def _wait(self, works, deadline_ns):
        for w in works:
            w.wait(timeout=timedelta(seconds=max(_remaining(deadline_ns), 0.001)))

    # The group's calls: a registered group's through torch.distributed (global ranks), an
    # owned one's on the group object itself (its own ranks).
    def _group(self):
        group = self.group
        if group is None:
            raise RuntimeError("this rank aborted the group")
        return group

    def _isend(self, t, dst):
        if self.owned:
            return self._group().send([t], dst, 0)
        return dist.isend(t, self.global_of[dst], group=self.group)

    def _irecv(self, t, src):
        if self.owned:
            return self._group().recv([t], src, 0)
        return dist.irecv(t, self.global_of[src], group=self.group)

    def _all_gather(self, out, mine):
        if self.owned:
            return self._group().allgather([out], [mine])
        return dist.all_gather(out, mine, group=self.group, async_op=True)

    def _all_reduce(self, t):
        if self.owned:
            return self._group().allreduce([t])
        return dist.all_reduce(t, group=self.group, async_op=True)

    def _sendrecv(self, ctx, sbuf, sbytes, dst, rbuf, rbytes, src, deadline_ns):
        if self.aborted:
            return self._fail(SUMO_ERR_PEER_FAILURE, "sendrecv", "this rank aborted the group")
        try:
            works = []
            if src >= 0:
                works.append(self._irecv(_bytes_at(rbuf, rbytes), src))
            if dst >= 0:
                works.append(self._isend(_bytes_at(sbuf, sbytes), dst))
            self._wait(works, deadline_ns)
            return SUMO_SUCCESS
        except Exception as e:  # a timeout, a peer that went away
            return self._fail(_code_of(e), "sendrecv with ranks %d/%d" % (dst, src), e)

    def _allgather(self, ctx, record, all_, nbytes, deadline_ns):
        try:
            mine = _bytes_at(record, nbytes).clone()
            out = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(self.size)]
            self._wait([self._all_gather(out, mine)], deadline_ns)
            joined = torch.cat(out)  # held: its memory must outlive the copy
            ctypes.memmove(all_, joined.data_ptr(), nbytes * self.size)
            return SUMO_SUCCESS
        except Exception as e:
            return self._fail(_code_of(e), "allgather", e)

    def _barrier(self, ctx, deadline_ns):
        try:
            t = torch.zeros(1)
            self._wait([self._all_reduce(t)], deadline_ns)
            return SUMO_SUCCESS
        except Exception as e:
            return self._fail(_code_of(e), "barrier", e)

    def _abort(self, ctx):
        # The peers learn of it through gloo's broken connections: an owned group is let go
        # (its connections close, and a peer blocked on this rank fails at once); a registered
        # one is the process's to destroy, so there they learn at their deadline.
        self.aborted = True
        if self.owned:
            self.group = None

    def _destroy(self, ctx):
        if self.owned:
            self.group = None
        return SUMO_SUCCESS

    def _error_message(self, ctx):
        return ctypes.addressof(self.error)

    def _carries(self, ctx, memory):
        return False


# ---- the store sumo's shared-memory transport rendezvouses through ------------------------

def _on_network(store):
    """Whether store is a TCPStore (under any PrefixStores): one whose calls can wait on a
    host that is gone."""
    while isinstance(store, dist.PrefixStore) and hasattr(store, "underlying_store"):
        store = store.underlying_store
    return isinstance(store, dist.TCPStore)


_MISSING = b"\0sumo: no value\0"


class StoreAdapter:
    """sumo_store over a torch.distributed Store (torchrun's TCPStore, the group's, or one
    given to init(store=...))."""

    def __init__(self, store, deadline_s=None):
        self.store = store
        # A TCPStore's calls wait on their socket past the store's own timeout when the store's
        # host is unreachable (a link down, every packet dropped: no reset ever comes), so on
        # one each call runs on a thread of the adapter's and is given up at its deadline: the
        # get's, or SUMO_TIMEOUT (deadline_s) for the calls sumo gives none. A call given up
        # keeps that thread; the next call gets another, and they end when the store answers
        # or with the process.
        self.deadline_s = deadline_s
        self.bounded = deadline_s is not None and _on_network(store)
        self.lock = threading.Lock()
        self.struct = sumo_store(ctypes.sizeof(sumo_store), None, STORE_SET(self._set),
                                 STORE_GET(self._get), STORE_SET(self._set_once),
                                 STORE_REMOVE(self._remove))

    def pointer(self):
        return ctypes.pointer(self.struct)

    def close(self):
        pass  # the Store is its owner's

    def _call(self, deadline_ns, fn, *args):
        """fn(*args), on a store that may never answer given up at deadline_ns (None: in
        SUMO_TIMEOUT) with a TimeoutError naming the call. A look at a key with its deadline
        already past (sumo_store_agree's) still gets up to a second: on a store that answers
        it takes a millisecond. The calls reach the store one at a time (self.lock), and a
        call given up before its turn never runs."""
        if not self.bounded:
            return fn(*args)
        now = time.monotonic_ns()
        if deadline_ns is None:
            deadline_ns = now + int(self.deadline_s * 1e9)
        deadline_ns = max(deadline_ns, now + int(min(1.0, self.deadline_s) * 1e9))
        done, box = threading.Event(), []

        def run():
            try:
                if not self.lock.acquire(timeout=_remaining(deadline_ns)):
                    return
                try:
                    if not done.is_set():
                        box.append((True, fn(*args)))
                finally:
                    self.lock.release()
            except Exception as e:  # handed to the caller
                box.append((False, e))
            done.set()

        threading.Thread(target=run, name="sumo-store-call", daemon=True).start()
        if not done.wait(_remaining(deadline_ns)) or not box:
            done.set()  # too late: a call not begun is not made
            raise TimeoutError("the store did not answer %s(%r) before the deadline "
                               "(SUMO_TIMEOUT): its host unreachable" % (fn.__name__, args[0]))
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _set(self, ctx, key, value, nbytes):
        try:
            self._call(None, self.store.set, key.decode(),
                       ctypes.string_at(value, nbytes) if nbytes else b"")
            return SUMO_SUCCESS
        except Exception as e:
            return _code_of(e)

    def _set_once(self, ctx, key, value, nbytes):
        try:
            # compare_set with an empty expected value sets a key that is missing, and leaves
            # one that is there (torch 1.13 and 2.x: TCPStore, FileStore, HashStore, PrefixStore).
            self._call(None, self.store.compare_set, key.decode(), "",
                       ctypes.string_at(value, nbytes) if nbytes else b"")
            return SUMO_SUCCESS
        except Exception as e:
            return _code_of(e)

    def _remove(self, ctx, key):
        try:
            self._call(None, self.store.delete_key, key.decode())
            return SUMO_SUCCESS
        except Exception as e:
            return _code_of(e)

    def _get(self, ctx, key, value, nbytes, deadline_ns):
        try:
            k = key.decode()
            # Polled, not store.wait(): a FileStore's wait takes a second at least and a
            # TCPStore's tens of milliseconds whatever the timeout, and sumo_store_agree looks
            # at keys without waiting. compare_set with a value no key holds reads a key
            # without making it (torch 1.13's stores have no check()).
            nap = 0.0005
            while True:
                data = self._call(deadline_ns, self.store.compare_set, k, _MISSING, _MISSING)
                if data != _MISSING:
                    break
                left = _remaining(deadline_ns)
                if left <= 0:
                    return SUMO_ERR_TIMEOUT
                time.sleep(min(nap, left))
                nap = min(2 * nap, 0.02)
            n = min(len(data), nbytes[0])
            if n:
                ctypes.memmove(value, data, n)
            nbytes[0] = len(data)
            return SUMO_SUCCESS
        except Exception as e:
            return _code_of(e)


class DirStore:
    """sumo's store in a directory of this machine (sumo_store_create_dir), for processes
    started on their own: it lives in files, not in one of them. No torch.distributed.Store
    is behind it, and sumo.torch takes joiners only on one (sumo.torch.elastic says so)."""

    store = None  # no torch.distributed.Store behind it

    def __init__(self, path):
        self.path = os.fsdecode(path)
        handle = ctypes.c_void_p()
        code = _lib.lib.sumo_store_create_dir(os.fsencode(path), ctypes.byref(handle))
        if code != SUMO_SUCCESS:
            raise _lib.error(code, None, "sumo_store_create_dir(%r) (a directory of this user's "
                             "that no one else may enter, made when missing)" % self.path)
        self.handle = handle

    def pointer(self):
        return ctypes.cast(self.handle, ctypes.POINTER(sumo_store))

    def close(self):
        handle, self.handle = self.handle, None
        if handle:
            _lib.lib.sumo_store_destroy_dir(handle, 0)  # the files stay: the peers may read them

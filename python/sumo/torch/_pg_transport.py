"""sumo over a torch.distributed process group: the transport operations of sumo_ext.h
(sendrecv, allgather, barrier) on the group's own point-to-point and collective calls, and
the key-value store adapter that sumo's shared-memory transport rendezvouses through.

sumo's C collectives run unchanged over these operations (the seam of
docs/design/seams.md): the algorithms, the Gram form's single exchange, the agreement before
every call and the deadlines are the library's; this file only moves bytes. sumo calls the
operations from whichever thread runs its collective (the caller's, or its progress thread
for asynchronous requests), one call at a time per communicator.

The transport runs on a group of its own (dist.new_group over the same ranks), so its
messages never interleave with the user's collectives on their group.
"""
import ctypes
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import _lib

_R = ctypes.c_int
SENDRECV = ctypes.CFUNCTYPE(_R, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64)
ALLGATHER = ctypes.CFUNCTYPE(_R, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.c_int64)
BARRIER = ctypes.CFUNCTYPE(_R, ctypes.c_void_p, ctypes.c_int64)
ABORT = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DESTROY = ctypes.CFUNCTYPE(_R, ctypes.c_void_p)
# Returns the address of a buffer the transport keeps (a callback cannot hand out a Python
# bytes object: it would be freed on return).
ERROR_MESSAGE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
CARRIES = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_char_p)

SUCCESS, TIMEOUT, PEER_FAILURE, INTERNAL = 0, 4, 5, 7


class TransportOps(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p),
                ("sendrecv", SENDRECV), ("allgather", ALLGATHER), ("barrier", BARRIER),
                ("abort", ABORT), ("destroy", DESTROY), ("error_message", ERROR_MESSAGE),
                ("carries", CARRIES)]


class TransportDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rank", ctypes.c_int), ("size", ctypes.c_int),
                ("node_local_size", ctypes.c_int), ("ops", ctypes.POINTER(TransportOps)),
                ("ctx", ctypes.c_void_p)]


def _remaining(deadline_ns):
    # sumo's deadlines are CLOCK_MONOTONIC nanoseconds, which time.monotonic_ns reads on Linux.
    return max(0.0, (deadline_ns - time.monotonic_ns()) / 1e9)


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


class GroupTransport:
    """The operations sumo calls, over `group`'s ranks (its own private gloo group)."""

    def __init__(self, group, name="torch.distributed"):
        self.base = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        ranks = [global_rank(group, r) for r in range(self.size)]
        # Every rank creates it, in the same order: a collective call.
        self.group = dist.new_group(ranks=ranks, backend="gloo")
        self.global_of = ranks
        self.error = ctypes.create_string_buffer(256)
        self.aborted = False
        self.name = name.encode()
        # The callbacks stay referenced for the transport's life: ctypes frees a CFUNCTYPE
        # object's thunk with it.
        self.ops = TransportOps(ctypes.sizeof(TransportOps), self.name,
                                SENDRECV(self._sendrecv), ALLGATHER(self._allgather),
                                BARRIER(self._barrier), ABORT(self._abort),
                                DESTROY(self._destroy), ERROR_MESSAGE(self._error_message),
                                CARRIES(self._carries))

    def desc(self, node_local_size=0):
        return TransportDesc(ctypes.sizeof(TransportDesc), self.rank, self.size, node_local_size,
                             ctypes.pointer(self.ops), None)

    # -- the operations: never raise (ctypes would print and return 0, sumo's success) ------
    def _fail(self, code, what, exc):
        self.error.value = ("%s: %s" % (what, exc)).encode(errors="replace")[:250]
        return code

    @staticmethod
    def _code_of(exc):
        text = str(exc).lower()
        return TIMEOUT if "timed out" in text or "timeout" in text else PEER_FAILURE

    def _wait(self, works, deadline_ns):
        for w in works:
            w.wait(timeout=timedelta(seconds=max(_remaining(deadline_ns), 0.001)))

    def _sendrecv(self, ctx, sbuf, sbytes, dst, rbuf, rbytes, src, deadline_ns):
        if self.aborted:
            return self._fail(PEER_FAILURE, "sendrecv", "this rank aborted the group")
        try:
            works = []
            if src >= 0:
                recv = _bytes_at(rbuf, rbytes)
                works.append(dist.irecv(recv, self.global_of[src], group=self.group))
            if dst >= 0:
                send = _bytes_at(sbuf, sbytes)
                works.append(dist.isend(send, self.global_of[dst], group=self.group))
            self._wait(works, deadline_ns)
            return SUCCESS
        except Exception as e:  # a timeout, a peer that went away
            return self._fail(self._code_of(e), "sendrecv with ranks %d/%d" % (dst, src), e)

    def _allgather(self, ctx, record, all_, nbytes, deadline_ns):
        try:
            mine = _bytes_at(record, nbytes).clone()
            out = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(self.size)]
            self._wait([dist.all_gather(out, mine, group=self.group, async_op=True)], deadline_ns)
            joined = torch.cat(out)  # held: its memory must outlive the copy
            ctypes.memmove(all_, joined.data_ptr(), nbytes * self.size)
            return SUCCESS
        except Exception as e:
            return self._fail(self._code_of(e), "allgather", e)

    def _barrier(self, ctx, deadline_ns):
        try:
            t = torch.zeros(1)
            self._wait([dist.all_reduce(t, group=self.group, async_op=True)], deadline_ns)
            return SUCCESS
        except Exception as e:
            return self._fail(self._code_of(e), "barrier", e)

    def _abort(self, ctx):
        # The peers learn of it through their own deadlines or gloo's broken connections.
        self.aborted = True

    def _destroy(self, ctx):
        return SUCCESS

    def _error_message(self, ctx):
        return ctypes.addressof(self.error)

    def _carries(self, ctx, memory):
        return False


# ---- the store sumo's shared-memory transport rendezvouses through ------------------------

STORE_SET = ctypes.CFUNCTYPE(_R, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
STORE_GET = ctypes.CFUNCTYPE(_R, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_size_t), ctypes.c_int64)


class Store(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("ctx", ctypes.c_void_p),
                ("set", STORE_SET), ("get", STORE_GET)]


class StoreAdapter:
    """sumo_store over a torch.distributed Store (torchrun's TCPStore, the group's)."""

    def __init__(self, store):
        self.store = store
        self.struct = Store(ctypes.sizeof(Store), None, STORE_SET(self._set), STORE_GET(self._get))

    def _set(self, ctx, key, value, nbytes):
        try:
            self.store.set(key.decode(), ctypes.string_at(value, nbytes) if nbytes else b"")
            return SUCCESS
        except Exception:
            return PEER_FAILURE

    def _get(self, ctx, key, value, nbytes, deadline_ns):
        try:
            k = key.decode()
            self.store.wait([k], timedelta(seconds=max(_remaining(deadline_ns), 0.001)))
            data = self.store.get(k)
            n = min(len(data), nbytes[0])
            if n:
                ctypes.memmove(value, data, n)
            nbytes[0] = len(data)
            return SUCCESS
        except Exception as e:
            return TIMEOUT if "timeout" in str(e).lower() or "timed out" in str(e).lower() \
                else PEER_FAILURE

"""The allreduce across hosts, hierarchical: sumo's shared memory inside each host, one
torch.distributed call between the hosts per collective, and sumo's own C algorithm for the
arithmetic, so no message re-enters the interpreter.

One allreduce of n elements (docs/torch.md, "Across hosts"):
  1. inside each host, an allgather over the host's shm communicator: local rank 0 (the
     host's leader) holds its host's inputs, in rank order;
  2. between hosts, one dist.all_gather of those blocks over a gloo group of the leaders:
     every leader holds every rank's input;
  3. each leader runs the flat process-group path's own computation on them: a threads
     communicator of P ranks inside the process (sumo_threads_run), rank r's input in slot r,
     with point-to-point algorithms forced for Adasum (the Gram form's message shape, the
     shards and chunks the group transport's ranks use) and the rank-order sum for Sum and
     Average: the same C code on the same ranges, so the same bits as the flat path;
  4. inside each host, a broadcast of the leader's result over shared memory.

Why the inputs cross and not host partials: every flat result sumo defines spans the ranks
in one order (the sum left to right over ranks; Adasum's dot products over each rank's shard
of all P inputs), and a host's partial would round where the flat path does not. The cost
is bytes: a leader sends its host's L inputs once and receives the other P - L, where a
ring allreduce's rank sends about 2n. With two hosts that is the same volume per host; with
more, the cross-host bytes grow with the host count (docs/torch.md says so).
"""
import ctypes
import torch
import torch.distributed as dist

from .._abi import (RANK_FN, SUMO_ALGORITHM_RANKED, SUMO_ERR_PEER_FAILURE, SUMO_ERR_TIMEOUT,
                    SUMO_OP_ADASUM, SUMO_OP_AVERAGE, SUMO_OP_SUM, SUMO_PARAM_ALGORITHM,
                    SUMO_SUCCESS, sumo_adasum_options, sumo_shm_options)
from .._lib import lib, SumoError
from .. import _lib


def hosts_of(where, local_size):
    """Host index per rank (hosts numbered by their lowest rank): from where each rank runs,
    or, with SUMO_LOCAL_SIZE = local_size, blocks of that many consecutive ranks. A simulated
    host must lie inside one real host (its ranks share memory)."""
    size = len(where)
    if local_size:
        hosts = [r // local_size for r in range(size)]
        for r in range(size):
            if where[r] != where[hosts[r] * local_size]:
                raise RuntimeError(
                    "sumo.torch.init: SUMO_LOCAL_SIZE=%d puts ranks %d and %d on one host, but "
                    "they run on different machines" % (local_size, hosts[r] * local_size, r))
        return hosts
    first = {}
    for r in range(size):
        first.setdefault(where[r], len(first))
    return [first[w] for w in where]


class Hierarchy:
    """The host's shm communicator and, on leaders, the leaders' gloo group. Made on every
    rank of `base` in the same order (dist.new_group is collective)."""

    def __init__(self, base, hosts, store, key_prefix, global_of):
        rank, size = dist.get_rank(base), dist.get_world_size(base)
        self.size = size
        self.hosts = hosts
        self.nhosts = max(hosts) + 1
        self.members = [[r for r in range(size) if hosts[r] == h] for h in range(self.nhosts)]
        self.host = hosts[rank]
        mine = self.members[self.host]
        self.local_rank, self.local_size = mine.index(rank), len(mine)
        self.leader = self.local_rank == 0
        self.max_local = max(len(m) for m in self.members)
        leaders = [global_of(m[0]) for m in self.members]
        # Every rank of the world calls new_group, members or not.
        self.leaders = dist.new_group(ranks=leaders, backend="gloo") if self.nhosts > 1 else None
        self.comm = ctypes.c_void_p()
        err = ctypes.create_string_buffer(256)
        opts = sumo_shm_options(ctypes.sizeof(sumo_shm_options), self.local_rank, self.local_size,
                                ctypes.pointer(store.struct),
                                ("%shost%d/" % (key_prefix, self.host)).encode(), 0,
                                ctypes.cast(err, ctypes.c_char_p), len(err))
        code = lib.sumo_comm_create_shm(ctypes.byref(opts), ctypes.byref(self.comm))
        if code != SUMO_SUCCESS:
            raise _lib.error(code, None, "sumo_comm_create_shm for host %d's ranks: %s"
                             % (self.host, err.value.decode(errors="replace")))
        self._scratch = {}

    def destroy(self):
        if self.comm:
            lib.sumo_comm_destroy(self.comm)
            self.comm = ctypes.c_void_p()

    def abort(self, why):
        if self.comm:
            lib.sumo_comm_abort(self.comm, why.encode()[:200])

    def _buffer(self, key, numel, dtype):
        t = self._scratch.get(key)
        if t is None or t.numel() < numel or t.dtype != dtype:
            t = self._scratch[key] = torch.empty(numel, dtype=dtype)
        return t[:numel]

    def _check(self, code, what):
        if code != SUMO_SUCCESS:
            raise _lib.error(code, self.comm, what)

    def allreduce(self, t, dt, kind, layout, what):
        """t (checked by the caller: contiguous, on the CPU, of sumo dtype dt) reduced in
        place on every rank: kind SUMO_OP_SUM, SUMO_OP_AVERAGE or SUMO_OP_ADASUM (per tensor
        of layout, a list of element counts; None: the buffer as one tensor). Blocking;
        every rank calls it in the same order."""
        n = t.numel()
        if n == 0:
            return t
        ptr = ctypes.c_void_p(t.data_ptr())
        # The leader's area holds every host's block, each padded to the largest host.
        span = self.max_local * n
        block = self._buffer("block", span, t.dtype)
        if self.leader and self.nhosts > 1:
            area = self._buffer("area", self.nhosts * span, t.dtype)
        else:
            area = block
        self._check(lib.sumo_allgather(ptr, ctypes.c_void_p(block.data_ptr()), n, dt, self.comm),
                    "%s: the allgather inside host %d" % (what, self.host))
        if self.leader:
            try:
                if self.nhosts > 1:
                    parts = list(area.view(self.nhosts, span).unbind(0))
                    dist.all_gather(parts, block, group=self.leaders)
                result = self._combine(area, span, n, dt, kind, layout, what)
            except SumoError:
                self.abort("%s failed on host %d's leader" % (what, self.host))
                raise
            except Exception as e:  # the leaders' group: a peer gone, or its deadline
                self.abort("%s: the exchange between hosts failed" % what)
                text = str(e).lower()
                code = SUMO_ERR_TIMEOUT if "timeout" in text or "timed out" in text \
                    else SUMO_ERR_PEER_FAILURE
                raise _lib.error(code, None, "%s: the exchange between hosts: %s"
                                 % (what, e)) from e
            src = ctypes.c_void_p(result.data_ptr())
        else:
            src = None
        self._check(lib.sumo_broadcast(src, ptr, n, dt, 0, self.comm),
                    "%s: the broadcast inside host %d" % (what, self.host))
        return t

    def _combine(self, area, span, n, dt, kind, layout, what):
        """Every rank's input lies in area (host h's block at h * span, its ranks in order):
        the flat path's result, computed on P threads, in rank 0's slot."""
        P = self.size
        slots = []
        for h, ranks in enumerate(self.members):
            for k, _ in enumerate(ranks):
                slots.append(area[h * span + k * n:h * span + (k + 1) * n])
        # slots are in host order; hosts are numbered by their lowest rank, so rank order
        # needs the ranks themselves.
        by_rank = [None] * P
        i = 0
        for ranks in self.members:
            for r in ranks:
                by_rank[r] = slots[i]
                i += 1
        ptrs = [ctypes.c_void_p(s.data_ptr()) for s in by_rank]
        counts = None
        if kind == SUMO_OP_ADASUM and layout is not None:
            counts = (ctypes.c_size_t * len(layout))(*layout)

        def rank_fn(comm, r, arg):
            # Runs on sumo's thread for rank r; ctypes releases the interpreter in each call.
            if kind == SUMO_OP_ADASUM:
                code = lib.sumo_comm_set_param(comm, SUMO_PARAM_ALGORITHM, SUMO_ALGORITHM_RANKED)
                if code != SUMO_SUCCESS:
                    return code
                op = ctypes.c_uint32(SUMO_OP_ADASUM)
                if counts is not None:
                    opts = sumo_adasum_options(ctypes.sizeof(sumo_adasum_options), counts,
                                               len(layout), 0, 0)
                    code = lib.sumo_op_create_adasum(comm, ctypes.byref(opts), ctypes.byref(op))
                    if code != SUMO_SUCCESS:
                        return code
                return lib.sumo_allreduce(ptrs[r], ptrs[r], n, dt, op.value, comm)
            return lib.sumo_allreduce(ptrs[r], ptrs[r], n, dt, kind, comm)

        fn = RANK_FN(rank_fn)
        results = (ctypes.c_int * P)()
        code = lib.sumo_threads_run(P, ctypes.cast(fn, ctypes.c_void_p), None, results)
        if code != SUMO_SUCCESS:
            raise _lib.error(code, None, "%s: the combine of the %d ranks' inputs on host %d's "
                             "leader" % (what, P, self.host))
        return by_rank[0]


def supports(kind):
    return kind in (SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM)

"""The allreduce across hosts, hierarchical: sumo's shared memory inside each host, a few large
torch.distributed calls between the hosts' leaders (local rank 0) per collective, and sumo's
own C kernels for the arithmetic, so no message re-enters the interpreter. The bits are the
flat process-group path's (sumo's C collectives over the group's own calls) on every rank.

Sum and average, when every host's ranks are consecutive (docs/torch/launching.md, "Across
hosts"): a chain in host order. The flat path sums every element left to right over the ranks,
((g0 + g1) + g2) + g3, in the accumulation type (fp32 for fp16 and bf16), and divides once at
the end for an average. So host h's leader gathers its host's inputs over shared memory,
receives the running partial of hosts 0..h-1 (in the accumulation type, exactly the value the
flat path holds after rank h's first rank - 1), adds its ranks to it in rank order with the
host kernel table's reduce (the kernel the flat path runs), and passes it on, chunk by chunk so
that host h+1 works on chunk k while host h computes chunk k+1. The last host's leader divides
and rounds once, as the flat path does, and broadcasts the result to the other leaders; each
leader then broadcasts it inside its host. Each host sends about one vector, not its L inputs.

CUDA tensors take another design, all of it in C (sumo_hier.h): the host's shm communicator,
whose kernels read the peers' device buffers over CUDA IPC, and per local rank an NCCL
communicator of that local rank on every host (one GPU per rank), made at the first CUDA
allreduce. Sum and average are a reduce-scatter in the host, an allreduce of each rank's slice
between the hosts and an allgather in the host (each level rounds once, so the bits are not the
flat path's); Adasum is the tree over the hosts' averages (sumo's hierarchical Adasum with a
group per host).

Adasum (and sum or average when a host's ranks are not consecutive, which no chain in host
order can sum in rank order): every rank's input crosses (the leader's all_gather of the hosts'
blocks), and each leader runs the flat path's own computation on a threads communicator of P
ranks kept for the job (point-to-point algorithms forced: the Gram form's message shape and
chunks, so the same C code on the same ranges). Adasum's result spans all P inputs in one
tree of dot products, and a host's partial would round where the flat path does not.
"""
import ctypes
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist

from .._abi import (SUMO_ALGORITHM_RANKED, SUMO_BFLOAT16, SUMO_ERR_PEER_FAILURE,
                    SUMO_ERR_TIMEOUT, SUMO_FLOAT16, SUMO_FLOAT32, SUMO_FLOAT64, SUMO_OP_ADASUM,
                    SUMO_OP_AVERAGE, SUMO_OP_SUM, SUMO_PARAM_ALGORITHM, SUMO_SUCCESS,
                    sumo_adasum_options, sumo_kernel_table, sumo_shm_options)
from .._lib import lib, SumoError
from .. import _lib

# The accumulation type of each dtype (sumo.h: fp16 and bf16 reduce in fp32).
_ACC = {SUMO_FLOAT32: SUMO_FLOAT32, SUMO_FLOAT64: SUMO_FLOAT64, SUMO_FLOAT16: SUMO_FLOAT32,
        SUMO_BFLOAT16: SUMO_FLOAT32}
_TORCH = {SUMO_FLOAT32: torch.float32, SUMO_FLOAT64: torch.float64}
# A chunk of the chain: large enough that a gloo message costs little per byte, small enough
# that the next host starts early (a 13 MB buffer goes in 4).
_CHUNK_BYTES = 4 << 20
# Adasum ops kept per layout on the threads communicator (a DDP model has a few bucket layouts).
_MAX_OPS = 64


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


class _Kernels:
    """The host kernel table's reduce and convert (sumo_ext.h): sumo's own arithmetic, called
    with the interpreter released."""

    def __init__(self):
        p = ctypes.c_void_p()
        code = lib.sumo_host_kernels(ctypes.byref(p))
        if code != SUMO_SUCCESS:
            raise _lib.error(code, None, "sumo_host_kernels")
        self.table = ctypes.cast(p, ctypes.POINTER(sumo_kernel_table)).contents

    def reduce(self, dtype, out, ins, n, divisor):
        """out = (ins[0] + .. + ins[-1]) / divisor, left to right, n elements of dtype."""
        outs = (ctypes.c_void_p * 1)(out)
        arr = (ctypes.c_void_p * len(ins))(*ins)
        return self.table.reduce(self.table.ctx, None, dtype, outs, 1, arr, len(ins), n, divisor)

    def convert(self, dst_dtype, dst, src_dtype, src, n):
        return self.table.convert(self.table.ctx, None, dst_dtype, dst, src_dtype, src, n)


class Hierarchy:
    """The host's shm communicator and, on leaders, the leaders' gloo group. Made on every
    rank of `base` in the same order (dist.new_group is collective)."""

    def __init__(self, base, hosts, store, key_prefix, global_of, timeout_s):
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
        # The chain sums in host order; it is rank order when each host is a block of
        # consecutive ranks (torchrun and SUMO_LOCAL_SIZE lay them out so).
        self.chain = [r for m in self.members for r in m] == list(range(size))
        self.leader_global = [global_of(m[0]) for m in self.members]
        # Every rank of the world calls new_group, members or not.
        self.leaders = (dist.new_group(ranks=self.leader_global, backend="gloo",
                                       timeout=timedelta(seconds=timeout_s))
                        if self.nhosts > 1 else None)
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
        # The allreduce kinds sumo.torch routes here (_init.py sets them; all by default).
        self.ops = frozenset((SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM))
        self._k = _Kernels()
        self._scratch = {}
        self._threads = None  # the leader's threads communicator for the gather design
        self._pool = None
        self._ops = {}
        self.cuda = None      # sumo_hier over self.comm and cuda_across (CUDA tensors)
        self.cuda_across = None

    def setup_cuda(self, cu, kernels, device, nccl_id):
        """The CUDA design: self.comm takes the device's kernels, and this rank joins the NCCL
        communicator of its local rank on every host (nccl_id(local_rank, host) -> the id,
        through the store). Collective; every rank calls it before its first CUDA allreduce."""
        sizes = sorted(set(len(m) for m in self.members))
        if len(sizes) != 1:
            raise ValueError("sumo: CUDA tensors across hosts need the same number of ranks on "
                             "every host (here %s)" % ", ".join(map(str, sizes)))
        code = cu.sumo_comm_add_cuda(self.comm, kernels)
        if code != SUMO_SUCCESS:
            raise _lib.error(code, self.comm, "sumo_comm_add_cuda on host %d's communicator"
                             % self.host)
        uid = nccl_id(self.local_rank, self.host)
        across = ctypes.c_void_p()
        code = cu.sumo_comm_create_nccl_rank(self.nhosts, uid, len(uid), self.host, device, None,
                                             ctypes.byref(across))
        if code != SUMO_SUCCESS:
            raise _lib.error(code, None, "sumo_comm_create_nccl_rank between the hosts (host %d "
                             "of %d, local rank %d, cuda:%d; sumo printed NCCL's reason on "
                             "stderr)" % (self.host, self.nhosts, self.local_rank, device))
        self.cuda_across = across
        code = cu.sumo_comm_add_cuda(across, kernels)
        hier = ctypes.c_void_p()
        if code == SUMO_SUCCESS:
            code = lib.sumo_hier_create(self.comm, across, ctypes.byref(hier))
        if code != SUMO_SUCCESS:
            raise _lib.error(code, None, "sumo_hier_create on host %d, local rank %d (sumo "
                             "printed why on stderr)" % (self.host, self.local_rank))
        self.cuda = hier

    def cuda_allreduce(self, send, recv, n, dt, kind, layout, stream, what):
        """The C design on device buffers (send and recv: pointers, the same one in place), its
        kernels on `stream`, whose queued work the caller has completed (the host's peers read
        the buffer over CUDA IPC)."""
        counts = (ctypes.c_size_t * len(layout))(*layout) if layout else None
        code = lib.sumo_hier_allreduce(send, recv, n, dt, kind, counts, len(layout or ()),
                                       stream or None, self.cuda)
        if code != SUMO_SUCCESS:
            m = ctypes.c_char_p()
            lib.sumo_hier_error_message(self.cuda, ctypes.byref(m))
            raise _lib.error(code, None, "%s: %s" % (what, (m.value or b"").decode(
                errors="replace")))

    def destroy(self):
        self._drop_threads()
        hier, self.cuda = self.cuda, None
        if hier:
            lib.sumo_hier_destroy(hier)
        across, self.cuda_across = self.cuda_across, None
        if across:
            lib.sumo_comm_destroy(across)
        if self.comm:
            lib.sumo_comm_destroy(self.comm)
            self.comm = ctypes.c_void_p()

    def abort(self, why):
        for comm in (self.comm, self.cuda_across):
            if comm:
                lib.sumo_comm_abort(comm, why.encode()[:200])

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
        # A flat view: the chunks and copies below slice and copy 1-D buffers, and a 0-dim
        # tensor (a metric's average) cannot be sliced. The caller's t holds the result.
        result, t = t, t.view(-1)
        ptr = ctypes.c_void_p(t.data_ptr())
        chained = self.chain and kind in (SUMO_OP_SUM, SUMO_OP_AVERAGE)
        # Inside the host: the leader gathers its ranks' inputs (in the gather design into
        # the first block of the area the leaders exchange).
        if chained:
            # The leader keeps the other L - 1 inputs; a rank other than the leader needs room
            # only to discard the broadcasts of ranks other than itself (hosts of 3 or more).
            keep = (self.local_size - 1 if self.leader else min(1, self.local_size - 2)) * n
            slots = self._buffer("local", keep, t.dtype)
        else:
            span = self.max_local * n
            block = self._buffer("block", span if self.leader else n, t.dtype)
            if self.leader:
                block[:n].copy_(t)
            slots = block[n:span] if self.leader else block
        ins = self._gather_local(t, n, dt, slots, what)
        if self.leader:
            try:
                if chained:
                    self._chain(t, n, dt, kind, ins)
                else:
                    area = self._buffer("area", self.nhosts * span, t.dtype)
                    dist.all_gather(list(area.view(self.nhosts, span).unbind(0)), block,
                                    group=self.leaders)
                    t.copy_(self._combine(area, span, n, dt, kind, layout, what))
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
        self._check(lib.sumo_broadcast(ptr if self.leader else None, ptr, n, dt, 0, self.comm),
                    "%s: the broadcast inside host %d" % (what, self.host))
        return result

    def _gather_local(self, t, n, dt, slots, what):
        """The host's inputs on its leader, in rank order: one shm broadcast from each other
        local rank into its slot (only the leader keeps them; with two ranks a host moves one
        vector). Returns their addresses on the leader, None elsewhere."""
        L = self.local_size
        ptr = t.data_ptr()
        esz = t.element_size()
        for k in range(1, L):
            if self.leader:
                dst = slots.data_ptr() + (k - 1) * n * esz
            elif self.local_rank == k:
                dst = ptr
            else:
                dst = slots.data_ptr()  # a rank between the root and the leader: discarded
            src = ptr if self.local_rank == k else None
            self._check(lib.sumo_broadcast(ctypes.c_void_p(src), ctypes.c_void_p(dst), n, dt, k,
                                           self.comm),
                        "%s: the gather inside host %d" % (what, self.host))
        if not self.leader:
            return None
        return [ptr] + [slots.data_ptr() + k * n * esz for k in range(L - 1)]

    def _kcheck(self, code, what):
        if code != SUMO_SUCCESS:
            raise _lib.error(code, None, "%s: a kernel on host %d's leader" % (what, self.host))

    def _chain(self, t, n, dt, kind, ins):
        """Sum or average by the chain in host order, on the leader; t ends with the result."""
        k = self._k
        acc = _ACC[dt]
        wide = acc != dt
        esz, aesz = t.element_size(), 8 if acc == SUMO_FLOAT64 else 4
        H, h = self.nhosts, self.host
        first, last = h == 0, h == H - 1
        g = self.leader_global
        step = max(1, _CHUNK_BYTES // aesz)
        chunks = [(a, min(n, a + step)) for a in range(0, n, step)]
        pin = None if first else self._buffer("pin", n, _TORCH[acc])
        pout = None if last else self._buffer("pout", n, _TORCH[acc])
        widened = self._buffer("wide", len(ins) * step, torch.float32) if wide else None
        divisor = self.size if last and kind == SUMO_OP_AVERAGE else 1
        # Every receive of the partial is posted at once: chunk k + 1 arrives while chunk k
        # is summed.
        recvs = [] if first else [dist.irecv(pin[a:b], src=g[h - 1], group=self.leaders)
                                  for a, b in chunks]
        pending = []
        tp = t.data_ptr()
        for i, (a, b) in enumerate(chunks):
            m = b - a
            srcs = []
            if not first:
                recvs[i].wait()
                srcs.append(pin.data_ptr() + a * aesz)
            if wide:  # fp16/bf16 widened exactly to fp32, then summed in fp32 as the flat path
                for j, p in enumerate(ins):
                    w = widened.data_ptr() + j * step * 4
                    self._kcheck(k.convert(acc, w, dt, p + a * esz, m), "widening")
                    srcs.append(w)
            else:
                srcs += [p + a * esz for p in ins]
            if last:
                if wide:
                    # Sum and divide in fp32, then round once to the dtype.
                    out = pin.data_ptr() + a * aesz
                    self._kcheck(k.reduce(acc, out, srcs, m, divisor), "the sum")
                    self._kcheck(k.convert(dt, tp + a * esz, acc, out, m), "rounding")
                else:
                    self._kcheck(k.reduce(dt, tp + a * esz, srcs, m, divisor), "the sum")
                if H > 1:
                    pending.append(dist.broadcast(t[a:b], src=g[-1], group=self.leaders,
                                                  async_op=True))
            else:
                if first and len(srcs) == 1 and not wide:
                    part = t[a:b]  # one rank and no widening: its input is the partial
                else:
                    self._kcheck(k.reduce(acc, pout.data_ptr() + a * aesz, srcs, m, 1),
                                 "the partial sum")
                    part = pout[a:b]
                pending.append(dist.isend(part, dst=g[h + 1], group=self.leaders))
        if not last:
            pending += [dist.broadcast(t[a:b], src=g[-1], group=self.leaders, async_op=True)
                        for a, b in chunks]
        for w in pending:
            w.wait()

    # -- the gather design: Adasum, and sums over hosts of non-consecutive ranks ------------

    def _drop_threads(self):
        comms, self._threads = self._threads, None
        if comms is not None:
            for r in range(self.size):
                lib.sumo_comm_destroy(comms[r])
        self._ops = {}
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _threads_comm(self):
        """The P ranks' threads communicator, made once (its scratch and Adasum ops stay)."""
        if self._threads is None:
            comms = (ctypes.c_void_p * self.size)()
            code = lib.sumo_comm_create_threads(self.size, comms)
            if code != SUMO_SUCCESS:
                raise _lib.error(code, None, "sumo_comm_create_threads on host %d's leader"
                                 % self.host)
            self._threads = comms
            for r in range(self.size):
                # The group transport's algorithms, so the bits are the flat path's.
                code = lib.sumo_comm_set_param(comms[r], SUMO_PARAM_ALGORITHM,
                                               SUMO_ALGORITHM_RANKED)
                if code != SUMO_SUCCESS:
                    self._drop_threads()
                    raise _lib.error(code, None, "sumo_comm_set_param")
            if self.size > 1:
                self._pool = ThreadPoolExecutor(max_workers=self.size - 1,
                                                thread_name_prefix="sumo-hier")
        return self._threads

    def _adasum_ops(self, comms, layout):
        key = None if layout is None else tuple(layout)
        ops = self._ops.get(key)
        if ops is None:
            if len(self._ops) >= _MAX_OPS:
                for old in self._ops.values():
                    for r in range(self.size):
                        if old[r] != SUMO_OP_ADASUM:
                            lib.sumo_op_destroy(comms[r], old[r])
                self._ops = {}
            ops = []
            for r in range(self.size):
                if layout is None:
                    ops.append(SUMO_OP_ADASUM)
                    continue
                counts = (ctypes.c_size_t * len(layout))(*layout)
                opts = sumo_adasum_options(ctypes.sizeof(sumo_adasum_options), counts,
                                           len(layout), 0, 0)
                op = ctypes.c_uint32()
                code = lib.sumo_op_create_adasum(comms[r], ctypes.byref(opts), ctypes.byref(op))
                if code != SUMO_SUCCESS:
                    raise _lib.error(code, None, "sumo_op_create_adasum on the threads ranks")
                ops.append(op.value)
            self._ops[key] = ops
        return ops

    def _combine(self, area, span, n, dt, kind, layout, what):
        """Every rank's input lies in area (host h's block at h * span, its ranks in order):
        the flat path's result, computed on P threads, in rank 0's slot."""
        P = self.size
        by_rank = [None] * P
        for h, ranks in enumerate(self.members):
            for k, r in enumerate(ranks):
                by_rank[r] = area[h * span + k * n:h * span + (k + 1) * n]
        ptrs = [s.data_ptr() for s in by_rank]
        comms = self._threads_comm()
        ops = self._adasum_ops(comms, layout) if kind == SUMO_OP_ADASUM else [kind] * P

        def rank(r):
            # ctypes releases the interpreter for the call: the P ranks run at once.
            return lib.sumo_allreduce(ctypes.c_void_p(ptrs[r]), ctypes.c_void_p(ptrs[r]), n, dt,
                                      ops[r], comms[r])

        futures = [self._pool.submit(rank, r) for r in range(1, P)]
        codes = [rank(0)] + [f.result() for f in futures]
        bad = [c for c in codes if c != SUMO_SUCCESS]
        if bad:
            self._drop_threads()  # a failed threads communicator is broken: make a new one
            raise _lib.error(bad[0], None, "%s: the combine of the %d ranks' inputs on host "
                             "%d's leader" % (what, P, self.host))
        return by_rank[0]


def supports(kind):
    return kind in (SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM)

"""DDP communication hooks on sumo: average, per-parameter Adasum and ACGA, and a gossip round.

Each hook returns at once: average and Adasum start sumo's asynchronous allreduce from the
backward pass, ACGA its asynchronous apply (sumo_aggregator_apply_start), and the persistent
worker thread waits for it (the wait releases the GIL) and completes the Future, so the
backward pass goes on computing the next buckets meanwhile. A bucket one rank cannot reduce
(another dtype, a tensor sumo refuses) fails every rank at once (sumo_comm_fail), rather than
leave the others waiting for it.

Where the result goes. With processes of one node (MPI) DDP's bucket is private to its
process, so a collective on it in place is staged through the node's shared areas in
cache-sized chunks: once for the average, twice for Adasum's and ACGA's Gram form (the Gram
partials, then the weighted sum). A mapped bucket buffer (sumo_mem_alloc: memory every process
of the node maps; one per bucket, kept) is the other choice: Adasum's allreduce reads the
bucket and writes that buffer, which sumo then uses as the staging area itself (the bucket is
streamed once, not twice, and nothing is copied out), ACGA's apply does the same
(sumo_aggregator_apply_into), and the hook hands the buffer to DDP as the result (DDP copies a
hook's result into the gradients either way). HookState(mapped_buffers=None), the default,
maps for Adasum and ACGA, not for the average, whose staged form is as fast
(docs/torch/hooks.md, "Mapped bucket buffers"); True or False decides for every hook.
Elsewhere (threads, several nodes) every hook works in place, zero copy.

DDP does not pre-divide the bucket when a hook is registered: the average hook divides
(SUMO_OP_AVERAGE), Adasum and ACGA take the raw gradients, as their definitions want.
"""
import ctypes
import time

import torch
import torch.distributed as dist

from .._abi import (SUMO_AGGREGATE_ACGA, SUMO_COLLECTIVE_ALLREDUCE, SUMO_FLOAT32,
                    SUMO_OP_AVERAGE, SUMO_OP_SUM, sumo_aggregator_options)
from .._lib import lib
from . import _calls, _cuda, _membership, _runtime as rt, _tensors


class HookState:
    """What the hooks keep between calls: Adasum ops per bucket layout, ACGA aggregators (and
    their momentum, checkpointable with state_dict) per bucket. Each bucket's communication
    (start, end, bytes) goes to sumo.torch's timeline (take_timeline) for measurements."""

    def __init__(self, acga_beta=0.0, acga_per_tensor=False, acga_rescale=False,
                 mapped_buffers=None):
        """mapped_buffers: whether the hooks reduce each bucket into a buffer every process of
        the node maps (see the module's note) rather than in place: True, False, or None for
        Adasum and ACGA only. Applies when every rank is an MPI process of one node."""
        self.comm = rt.require_init()
        if mapped_buffers not in (None, True, False):
            raise TypeError("sumo: mapped_buffers is None, True or False, not %r"
                            % (mapped_buffers,))
        self.mapped_buffers = mapped_buffers
        self.node_maps_memory = _tensors.node_maps_memory()
        self._mapped = {}        # bucket index -> its buffer in mapped memory
        self.acga_beta = float(acga_beta)
        self.acga_per_tensor = bool(acga_per_tensor)
        self.acga_rescale = bool(acga_rescale)
        self._ops = {}           # layout tuple -> sumo_op (Adasum per tensor)
        self._aggregators = {}   # (bucket index, layout) -> sumo_aggregator (ACGA)
        self._pending = {}       # ACGA state loaded before its bucket was seen
        _membership.bind(self)

    # sumo.torch.elastic replaced the communicator (bind). Everything here is made on
    # demand, so it is dropped with the old communicator and made again on the new one as the
    # buckets come; ACGA's momentum is kept (as state_dict would keep it) and applied when its
    # bucket comes again. (DDP itself cannot follow: its process group keeps the membership it
    # was made with.)
    def comm_closing(self):
        self._pending.update(self._aggregator_states())
        for agg in self._aggregators.values():
            lib.sumo_aggregator_destroy(agg)
        self._aggregators.clear()
        self._ops.clear()     # they die with the communicator
        self._mapped.clear()  # its memory, likewise

    def comm_opened(self):
        self.comm = rt.state.comm
        self.node_maps_memory = _tensors.node_maps_memory()

    # -- Adasum -------------------------------------------------------------------------------
    def adasum_op(self, layout, device=None):
        """The Adasum op of a bucket layout, made once per layout and kind of device (across
        hosts CUDA buckets take the hierarchical one: _tensors.adasum_op)."""
        key = (layout, device is not None and device.type == "cuda")
        op = self._ops.get(key)
        if op is None:
            op = self._ops[key] = _tensors.adasum_op(self.comm, layout, "a bucket of %d "
                                                     "tensors" % len(layout), device)
        return op

    # -- ACGA ---------------------------------------------------------------------------------
    def acga_aggregator(self, key, layout):
        agg = self._aggregators.get(key)
        if agg is None:
            opts = sumo_aggregator_options()
            rt.raise_for(lib.sumo_aggregator_options_default(SUMO_AGGREGATE_ACGA,
                                                             ctypes.byref(opts)))
            counts = (ctypes.c_size_t * len(layout))(*layout)
            opts.tensor_counts = counts
            opts.ntensors = len(layout)
            opts.acga.beta = self.acga_beta
            opts.acga.per_tensor = int(self.acga_per_tensor)
            opts.acga.rescale = int(self.acga_rescale)
            handle = ctypes.c_void_p()
            rt.raise_for(lib.sumo_aggregator_create(self.comm, ctypes.byref(opts), ctypes.byref(handle)),
                         "sumo_aggregator_create (ACGA)")
            agg = self._aggregators[key] = handle
            saved = self._pending.pop(_key_str(key), None)
            if saved is not None:
                self._load_aggregator(agg, saved, key)
        return agg

    def _load_aggregator(self, agg, blob, key):
        buf = ctypes.create_string_buffer(blob, len(blob))
        rt.raise_for(lib.sumo_aggregator_state_load(agg, buf, len(blob)),
                     "ACGA state of bucket %s" % _key_str(key))

    def _aggregator_states(self):
        states = {}
        for key, agg in self._aggregators.items():
            n = ctypes.c_size_t()
            rt.raise_for(lib.sumo_aggregator_state_size(agg, ctypes.byref(n)))
            buf = ctypes.create_string_buffer(n.value)
            rt.raise_for(lib.sumo_aggregator_state_save(agg, buf, n.value))
            states[_key_str(key)] = buf.raw
        return states

    def state_dict(self):
        """ACGA's momentum per bucket (bytes in sumo's format), for checkpoints."""
        rt.sync()
        acga = dict(self._pending)
        acga.update(self._aggregator_states())
        return {"acga": acga, "acga_beta": self.acga_beta}

    def load_state_dict(self, sd):
        # Buckets are keyed by index and layout; DDP builds its final buckets after the first
        # iteration, so a state is applied when its bucket first appears.
        rt.sync()
        self._pending = dict(sd.get("acga", {}))
        for key, agg in self._aggregators.items():
            blob = self._pending.pop(_key_str(key), None)
            if blob is not None:
                self._load_aggregator(agg, blob, key)

    def maps(self, gram_form):
        """Whether a hook (of the Gram form: Adasum, ACGA; or not: the average) reduces into
        mapped buffers."""
        if not self.node_maps_memory:
            return False
        return gram_form if self.mapped_buffers is None else self.mapped_buffers

    def mapped(self, index, buf, gram_form):
        """The buffer the bucket is reduced into: buf itself, or (maps(gram_form)) the
        bucket's buffer in memory every process of the node maps, reallocated when DDP
        rebuilds its buckets. Collective then: DDP calls the hooks in bucket order on every
        rank."""
        if not self.maps(gram_form):
            return buf
        t = self._mapped.get(index)
        if t is None or t.numel() != buf.numel() or t.dtype != buf.dtype:
            if t is not None:
                del self._mapped[index]
                _tensors.shared_free(t, "bucket %d's mapped buffer" % index)
            t = self._mapped[index] = _tensors.shared_empty(buf.numel(), buf.dtype,
                                                            "bucket %d's mapped buffer" % index)
        return t

    def close(self):
        """Releases the ops, aggregators and mapped buffers; collective under MPI when the
        hooks used mapped buffers (every rank closes its state). A result a hook returned in
        a mapped buffer is gone with it: copy what is still needed first (DDP has copied its
        results into the gradients by the end of each backward pass)."""
        rt.sync()
        for index in list(self._mapped):
            _tensors.shared_free(self._mapped.pop(index), "bucket %d's mapped buffer" % index)
        for agg in self._aggregators.values():
            lib.sumo_aggregator_destroy(agg)
        self._aggregators.clear()
        if rt.state.comm is not None:
            for op in self._ops.values():
                lib.sumo_op_destroy(rt.state.comm, op)
        self._ops.clear()


def _key_str(key):
    index, layout = key
    return "%d:%s" % (index, ",".join(map(str, layout)))


def _bucket_layout(bucket):
    buf = bucket.buffer()
    layout = tuple(int(g.numel()) for g in bucket.gradients())
    if sum(layout) != buf.numel():
        raise RuntimeError("sumo: bucket %d holds %d elements but its gradients %d; cannot cut "
                           "it per tensor" % (bucket.index(), buf.numel(), sum(layout)))
    return buf, layout


def _start(state, index, buf, op, what, gram_form):
    """Starts an allreduce of the bucket, in place or into its mapped buffer, and returns the
    Future the worker completes with the reduced buffer."""
    # A bad bucket is refused before anything is allocated, on every rank at once.
    send, n, dt = _tensors.checked_tensor(buf, what)
    if buf.device.type == "cuda":
        return _start_cuda(buf, send, n, dt, op, what)
    t0 = time.perf_counter()
    out = state.mapped(index, buf, gram_form)
    recv = _tensors.tensor_args(out, what)[0]
    req = ctypes.c_void_p()
    rt.raise_for(lib.sumo_allreduce_start(send, recv, n, dt, op, state.comm, ctypes.byref(req)),
                 what)

    def wait():
        rt.raise_for(lib.sumo_request_wait(req), what)
        rt.record(t0, time.perf_counter(), n * out.element_size())
        return out

    return rt.state.worker.submit(wait)


def _start_cuda(buf, ptr, n, dt, op, what):
    """A CUDA bucket, reduced in place on the device: the worker thread runs the collective
    (sumo_collective_run) with its kernels on the stream that was current when DDP called the
    hook, after the work queued there (_cuda.inputs_event, where the transport needs it)."""
    stream = _cuda.current_stream(buf)
    ready = _cuda.inputs_event(buf)

    def run():
        if ready is not None:
            ready.synchronize()
        t0 = time.perf_counter()
        rt.raise_for(_calls.collective(SUMO_COLLECTIVE_ALLREDUCE, ptr, ptr, n, dt, stream,
                                       op=op), what)
        rt.record(t0, time.perf_counter(), n * buf.element_size())
        return buf

    return rt.state.worker.submit(run, _cuda.future_devices(buf))


def average_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The average of the ranks' gradients (sum in rank order divided by the rank count)."""
    return _start(state, bucket.index(), bucket.buffer(), SUMO_OP_AVERAGE,
                  "bucket %d (average)" % bucket.index(), gram_form=False)


def sum_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    return _start(state, bucket.index(), bucket.buffer(), SUMO_OP_SUM,
                  "bucket %d (sum)" % bucket.index(), gram_form=False)


def adasum_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Adasum per parameter: each gradient in the bucket is combined with its own coefficients
    (an op created for the bucket's layout, once per distinct layout)."""
    buf, layout = _bucket_layout(bucket)
    op = state.adasum_op(layout, buf.device)
    return _start(state, bucket.index(), buf, op, "bucket %d (Adasum)" % bucket.index(),
                  gram_form=True)


def acga_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """ACGA on the bucket (one coefficient per rank for the bucket, or per tensor with
    acga_per_tensor); its coefficient momentum lives in the state."""
    buf, layout = _bucket_layout(bucket)
    what = "bucket %d (ACGA)" % bucket.index()
    if buf.device.type == "cuda":
        rt.fail_together(ValueError("sumo: %s is on %s; the ACGA hook combines CPU gradients "
                                    "only (average_hook, sum_hook and adasum_hook take CUDA "
                                    "buckets)" % (what, buf.device)))
    ptr, n, dt = _tensors.checked_tensor(buf, what)
    if dt != SUMO_FLOAT32:
        rt.fail_together(TypeError("sumo: ACGA combines float32 gradients only; %s is %s"
                                   % (what, buf.dtype)))
    agg = state.acga_aggregator((bucket.index(), layout), layout)
    t0 = time.perf_counter()
    out = state.mapped(bucket.index(), buf, gram_form=True)
    recv = _tensors.tensor_args(out, what)[0]
    # Queued on sumo's handle like the other hooks' allreduces (in bucket order), so the
    # backward pass never waits for it.
    req = ctypes.c_void_p()
    rt.raise_for(lib.sumo_aggregator_apply_start(agg, ptr, recv, n, dt, ctypes.byref(req)), what)

    def wait():
        rt.raise_for(lib.sumo_request_wait(req), what)
        rt.record(t0, time.perf_counter(), n * out.element_size())
        return out

    return rt.state.worker.submit(wait)


class GossipHookState:
    """The gossip hook's rounds: one sumo_gossip object (sumo_gossip.h, the built-in
    exponential graph, one peer a round) per bucket, made on the worker thread at the bucket's
    first round, in bucket order on every rank like the rounds themselves."""

    def __init__(self):
        self.comm = rt.require_init()
        self._gossip = {}  # (bucket index, count, dtype) -> sumo_gossip
        _membership.bind(self)

    def comm_closing(self):
        self.close()

    def comm_opened(self):
        self.comm = rt.state.comm

    def round(self, key, ptr, what):
        g = self._gossip.get(key)
        if g is None:
            g = ctypes.c_void_p()
            rt.raise_for(lib.sumo_gossip_create(self.comm, key[1], key[2], None,
                                                ctypes.byref(g)), what)
            self._gossip[key] = g
        rt.raise_for(lib.sumo_gossip_round(g, ptr), what)

    def close(self):
        for g in self._gossip.values():
            lib.sumo_gossip_destroy(g)
        self._gossip.clear()


def gossip_hook(state: GossipHookState,
                bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """One push-sum round on the bucket instead of the average (SGP's mixing of gradients):
    rank r keeps half its gradients and adds half of rank r - 2^k's, k cycling over the
    exponential graph's period; the weights stay 1, so no de-biasing is needed. CPU buckets
    of float32 or float64."""
    buf = bucket.buffer()
    what = "bucket %d (gossip)" % bucket.index()
    ptr, n, dt = _tensors.checked_tensor(buf, what)
    if buf.device.type != "cpu":
        rt.fail_together(ValueError("sumo: %s is on %s; the gossip hook mixes CPU gradients "
                                    "only" % (what, buf.device)))
    key = (bucket.index(), n, dt)

    def run():
        t0 = time.perf_counter()
        state.round(key, ptr, what)
        rt.record(t0, time.perf_counter(), n * buf.element_size())
        return buf

    return rt.state.worker.submit(run)

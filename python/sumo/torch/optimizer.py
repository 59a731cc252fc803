"""Horovod-style DistributedOptimizer over sumo.

op=Average or Sum: step() combines the gradients across ranks, then the wrapped optimizer
steps (the same step on every rank). Tensors of one dtype travel in one flat buffer (one
collective per dtype and step, packed with one copy each way). Gradients accumulate in .grad
over backward_passes_per_step backward passes and are combined once, at step().

op=Adasum: delta mode, as Horovod's _DistributedAdasumOptimizer: every rank steps locally on
its own gradient, the update delta = new - start is combined with per-parameter Adasum, and
start + combined becomes the parameters on every rank; the optimizer's state (momentum, Adam
moments) stays local.

With overlap (the default for Adasum) the combine runs during the backward pass, as
Horovod's does: a hook on each parameter's gradient accumulator fires once its gradient is
complete (after backward_passes_per_step passes), takes that parameter's local step right
there (the wrapped optimizer's own step with its parameter groups narrowed to that one
parameter, so it uses that parameter's own state exactly as a full step would), and writes
start and delta into the parameter's bucket (the delta in memory every process of the node
maps under MPI on one node; elsewhere a bucket of a single parameter keeps the delta in the
parameter itself until step(), as Horovod does). Buckets are fixed at construction: the
parameters in reverse registration order (roughly the order backward produces them), one
dtype per bucket, cut at bucket_cap_mb (0: one parameter per bucket). A bucket whose
parameters are all stepped starts sumo's asynchronous Adasum allreduce, but only after every
bucket before it has started, so every rank starts them in the same order whatever order its
gradients arrived in (sumo matches collectives by order). step() steps the parameters that
got no gradient (their .grad, if any, as a full step would), starts the rest of the buckets
in order, waits for each bucket in turn and sets start + combined delta.

What overlap changes for the caller: the local step happens inside backward(), so anything
done to .grad between backward() and step() (clipping, unscaling) does not reach it, and an
optimizer whose step couples parameters (LBFGS, a global norm) is stepped one parameter at a
time: pass overlap=False for those, which steps and combines everything at step(). A
parameter may receive a gradient at most backward_passes_per_step times per step(). A
collective of your own between backward() and step() is matched against the buckets
already started, which is only safe when every rank's parameters got gradients alike.
"""
import contextlib
import ctypes
import time
import warnings
import weakref

import torch

from .. import Sum, Average, Adasum
from .._lib import lib
from . import _calls, _cuda, _membership, _runtime as rt, _tensors
from .compression import Compression, check as check_compression
from ._wrapped import WrappedOptimizer


class _Group:
    """The parameters of one dtype, in order, with their names and the Adasum op."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.params = []
        self.names = []
        self.op = None

    def layout(self):
        return tuple(p.numel() for p in self.params)


class _Bucket:
    """Parameters combined by one overlapped collective: their indices, their offsets in the
    bucket's flat start and delta buffers (persistent, so the collective works in place)."""

    def __init__(self, index, dtype):
        self.index = index
        self.dtype = dtype
        self.slots = []      # indices into the optimizer's parameter list
        self.offsets = []
        self.numel = 0
        self.nbytes = 0
        self.missing = 0     # parameters not yet stepped locally in this step
        self.req = None      # the started collective, until step() waits for it
        self.t0 = 0.0

    def add(self, slot, p):
        self.slots.append(slot)
        self.offsets.append(self.numel)
        self.numel += p.numel()
        self.nbytes += p.numel() * p.element_size()


class DistributedOptimizer(WrappedOptimizer):
    """Horovod's DistributedOptimizer: the same arguments with the same meaning
    (docs/torch/horovod.md lists what differs), plus sumo's overlap and bucket_cap_mb for op=Adasum.

    compression: how gradients (Average, Sum) or deltas (Adasum) travel: Compression.none,
    .fp16 or .bf16 (accumulated in fp32), or any Horovod-style compressor for Average and
    Sum. gradient_predivide_factor f (Average only): gradients are divided by f before the
    sum and multiplied by f / size() after it. groups: how parameters are cut into
    collectives for Average and Sum (a count of nearly equal parts, or lists of parameters,
    each other parameter alone); the result is the same either way."""

    # Not calling Optimizer.__init__: param_groups, state and defaults are the wrapped
    # optimizer's own (properties below), so LR schedulers and checkpoints see one optimizer.
    def __init__(self, optimizer, named_parameters=None, compression=Compression.none,
                 backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                 num_groups=0, groups=None, sparse_as_dense=False, *, overlap=True,
                 bucket_cap_mb=1.0):
        comm = rt.require_init()
        if op not in (Sum, Average, Adasum) or isinstance(op, bool):
            raise ValueError("sumo.torch.DistributedOptimizer: op must be sumo.torch.Sum, "
                             "Average or Adasum, not %r" % (op,))
        self.compression = check_compression(compression, "DistributedOptimizer")
        if int(backward_passes_per_step) < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        if float(bucket_cap_mb) < 0:
            raise ValueError("bucket_cap_mb must be >= 0")
        if float(gradient_predivide_factor) != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average (as in "
                             "Horovod)")
        if not float(gradient_predivide_factor) > 0:
            raise ValueError("gradient_predivide_factor must be > 0")
        if num_groups:
            warnings.warn("num_groups is deprecated, as in Horovod; pass groups=",
                          DeprecationWarning, stacklevel=2)
            groups = num_groups if groups is None else groups
        self._opt = optimizer
        self.op = op
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        self._synchronized = False
        self._should_synchronize = True
        params = [p for g in optimizer.param_groups for p in g["params"]]
        names = _names_of(params, named_parameters)
        self._groups = {}
        self._names = []
        for i, p in enumerate(params):
            name = names.get(id(p), "param.%d" % i)
            g = self._groups.setdefault(p.dtype, _Group(p.dtype))
            g.params.append(p)
            g.names.append(name)
            self._names.append(name)
        # One device for every parameter (its buffers and collectives are that device's),
        # then each refused now if sumo cannot reduce it (int, non-contiguous, a CUDA tensor
        # this communicator does not take).
        _tensors.same_device(list(zip(self._names, params)),
                             "sumo.DistributedOptimizer's parameters")
        # Buffers are made like the first parameter: on its device.
        self._like = params[0].detach() if params else torch.empty(0)
        self._device = self._like.device
        for p, name in zip(params, self._names):
            _tensors.tensor_args(p.detach(), name)
        self._all_params = params
        self._sync_groups = _partition(params, groups)
        if op == Adasum:
            # The delta travels in the compressor's dtype, so the buffers are made in it.
            if self.compression not in (Compression.none, Compression.fp16, Compression.bf16):
                raise ValueError("sumo.torch.DistributedOptimizer: op=Adasum takes "
                                 "Compression.none, .fp16 or .bf16, not %r" % (compression,))
        # Average and Sum overlap where the wire dtype is known before the first gradient
        # (the buckets are made at construction): no compressor of the user's own.
        self.overlap = bool(overlap) and (op == Adasum or self.compression in (
            Compression.none, Compression.fp16, Compression.bf16))
        if self.overlap:
            self._build_buckets(params, float(bucket_cap_mb) * 1e6)
        self._made_on(comm)
        _membership.bind(self)

    def _made_on(self, comm):
        """What the optimizer keeps on the communicator: the buckets' buffers (memory every
        process maps, where it is) and the Adasum ops. Collective."""
        if self.overlap:
            self._bucket_buffers(comm)
        elif self.op == Adasum:
            # The tensor sizes are the Adasum layout.
            for g in self._groups.values():
                g.op = _tensors.adasum_op(comm, g.layout(), "the %d %s parameters"
                                          % (len(g.params), g.dtype), self._device)

    # sumo.torch.elastic replaced the communicator (bind): the collectives started on the
    # old one are waited for and the step they belonged to dropped (it is redone from the last
    # commit); the buffers and ops are made again on the new one.
    def comm_closing(self):
        if self.overlap:
            for b in self._buckets:
                if b.req is not None:
                    lib.sumo_request_wait(b.req)
                b.req = b.op = b.grad = b.start = b.delta = None
            self._pieces = None
            self._reset()
        for g in self._groups.values():
            g.op = None
        self._synchronized = False

    def comm_opened(self):
        self._made_on(rt.state.comm)

    def _wire(self, dtype):
        """What a delta of this dtype travels as (Adasum)."""
        return self.compression.dtype or dtype

    def __repr__(self):
        return "sumo.DistributedOptimizer(op=%s, %r)" % (
            {Sum: "Sum", Average: "Average", Adasum: "Adasum"}[self.op], self._opt)

    def add_param_group(self, param_group):
        raise NotImplementedError("sumo.DistributedOptimizer: add parameter groups to the "
                                  "optimizer before wrapping it")

    # The state is the wrapped optimizer's: the starting point of a delta is taken at each
    # step (the parameters every rank holds), so nothing else needs saving. (With overlap,
    # save between step() and the next backward(), when no step is half done.)
    def state_dict(self):
        return self._opt.state_dict()

    def load_state_dict(self, state_dict):
        self._synchronized = False
        self._opt.load_state_dict(state_dict)

    def set_backward_passes_per_step(self, passes):
        """As Horovod's; between step() and the next backward pass."""
        if int(passes) < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self.backward_passes_per_step = int(passes)
        if self.overlap:
            self._reset()

    # -- the overlapped delta optimizer --------------------------------------------------------
    def _build_buckets(self, params, cap_bytes):
        self._params = params
        self._group_of = [k for k, g in enumerate(self._opt.param_groups) for _ in g["params"]]
        self._where = [None] * len(params)
        self._buckets = []
        open_ = {}  # dtype -> the bucket being filled
        for i in reversed(range(len(params))):
            p = params[i]
            if self.op != Adasum and not p.requires_grad:
                continue  # left out, as _combine_grads leaves it
            b = open_.get(p.dtype)
            if b is None or (b.slots and b.nbytes + p.numel() * p.element_size() > cap_bytes):
                b = open_[p.dtype] = _Bucket(len(self._buckets), p.dtype)
                self._buckets.append(b)
            self._where[i] = (b, len(b.slots))
            b.add(i, p)
        # The hook on a parameter's gradient accumulator (Horovod's way: torch 1.13 has no
        # post-accumulate hook). The nodes are kept so the same one serves every graph; the
        # hooks hold the optimizer weakly, so a dropped optimizer's hooks do nothing.
        self._grad_accs = []
        ref = weakref.ref(self)
        with torch.enable_grad():
            for i, p in enumerate(params):
                if p.requires_grad:
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                    acc.register_hook(_grad_hook(ref, i))
                    self._grad_accs.append(acc)

    def _bucket_buffers(self, comm):
        """The buckets' buffers and ops on comm (collective: memory every process maps, the
        Adasum ops)."""
        params = self._params
        for b in self._buckets:
            if self.op != Adasum:
                # Gradients in the wire dtype, reduced in place. Host ones in memory every
                # process of the node maps (under MPI or shm on one node), so the ranks read
                # each other's buckets directly instead of through the staging areas; CUDA
                # ones on their device.
                b.what = "the %s gradient bucket %d of %d tensors (%s%s)" % (
                    "Sum" if self.op == Sum else "Average", b.index, len(b.slots),
                    ", ".join(self._names[i] for i in b.slots[:3]),
                    ", ..." if len(b.slots) > 3 else "")
                b.grad = (_tensors.shared_empty(b.numel, self._wire(b.dtype), b.what)
                          if self._like.device.type == "cpu"
                          else self._like.new_empty(b.numel, dtype=self._wire(b.dtype)))
                b.op = self.op
                continue
            b.start = self._like.new_empty(b.numel, dtype=b.dtype)
            b.what = "the Adasum delta bucket %d of %d tensors (%s%s)" % (
                b.index, len(b.slots), ", ".join(self._names[i] for i in b.slots[:3]),
                ", ..." if len(b.slots) > 3 else "")
            # The delta goes to memory every process of the node maps (under MPI on one node),
            # so that its Adasum reads the peers' deltas directly instead of streaming them
            # twice through the staging areas. Elsewhere a bucket of one parameter combines
            # the delta in the parameter's own storage, as Horovod does (no third buffer).
            wire = self._wire(b.dtype)
            single = len(b.slots) == 1 and not _tensors.node_maps_memory() and wire == b.dtype
            if single:
                b.delta = None
            elif self._device.type == "cuda":
                b.delta = self._like.new_empty(b.numel, dtype=wire)
            else:
                b.delta = _tensors.shared_empty(b.numel, wire, b.what)
            b.op = _tensors.adasum_op(comm, tuple(params[i].numel() for i in b.slots), b.what,
                                      self._device)
        if self.op != Adasum:
            # Each parameter's place in its bucket, as a view made once (not per backward).
            self._pieces = [None] * len(params)
            for b in self._buckets:
                for i, off in zip(b.slots, b.offsets):
                    self._pieces[i] = b.grad[off:off + params[i].numel()]
            self._prescale = 1.0 / self.gradient_predivide_factor if self.op == Average else 1.0
        self._reset()

    def _reset(self):
        self._delay = [self.backward_passes_per_step] * len(self._params)
        self._stepped = [False] * len(self._params)
        self._ctx = [None] * len(self._params)  # Average/Sum: (compression ctx, sparse)
        self._next = 0
        self._error = None
        for b in self._buckets:
            b.missing = len(b.slots)
            b.req = None

    def _on_grad(self, i):
        """A parameter's gradient is accumulated: on the last backward pass of the step, its
        local step; then start the buckets that are complete, in order. An error is kept
        for step() to raise after the started collectives are waited for."""
        if self._error is not None:
            return
        try:
            self._delay[i] -= 1
            if self._delay[i] > 0:
                return
            if self._delay[i] < 0:
                raise RuntimeError(
                    "sumo.DistributedOptimizer: %s got a gradient in more than "
                    "backward_passes_per_step=%d backward passes before step(); with "
                    "overlap its %s in the last of them (set backward_passes_per_step, or "
                    "pass overlap=False)"
                    % (self._names[i], self.backward_passes_per_step,
                       "local step is taken" if self.op == Adasum else "gradient is sent"))
            if self.op == Adasum:
                self._local_step(i)
            else:
                self._pack_grad(i)
            self._start_complete()
        except BaseException as e:  # raised by step(), on every rank's own terms
            self._error = e

    @torch.no_grad()
    def _local_step(self, i):
        """The wrapped optimizer's step on parameter i alone (its group narrowed to it, the
        other groups empty); start and delta go to the bucket's buffers."""
        p = self._params[i]
        b, k = self._where[i]
        off, n = b.offsets[k], p.numel()
        pv = p.detach().view(-1)
        start = b.start[off:off + n]
        start.copy_(pv)
        groups = self._opt.param_groups
        saved = [g["params"] for g in groups]
        try:
            for j, g in enumerate(groups):
                g["params"] = [p] if j == self._group_of[i] else []
            self._opt.step()
        finally:
            for g, ps in zip(groups, saved):
                g["params"] = ps
        if b.delta is None:
            _delta(pv, pv, start)  # the parameter holds its delta until step()
        else:
            _delta(b.delta[off:off + n], pv, start)
        self._stepped[i] = True
        b.missing -= 1

    @torch.no_grad()
    def _pack_grad(self, i):
        """Average/Sum: parameter i's gradient (zeros where it has none), compressed and
        prescaled, into its bucket, as _combine_grads packs it (so the same bits)."""
        p = self._params[i]
        b, k = self._where[i]
        g = p.grad
        if self.compression is Compression.none and g is not None and not g.is_sparse \
                and g.dtype == p.dtype:
            # The common case, kept short: this runs once per parameter in the backward pass.
            sent, ctx, sparse = g, None, False
        else:
            if g is None:
                g = p.grad = torch.zeros_like(p)
            sparse = g.is_sparse
            if sparse:
                if not self.sparse_as_dense:
                    raise ValueError("sumo.DistributedOptimizer: %s has a sparse gradient; "
                                     "pass sparse_as_dense=True" % self._names[i])
                g = g.to_dense()
            sent, ctx = self.compression.compress(g)
            _tensors.tensor_args(sent, self._names[i] + ".grad")
        piece = self._pieces[i]
        piece.copy_(sent.reshape(-1))
        if self._prescale != 1.0:
            piece.mul_(self._prescale)
        self._ctx[i] = (ctx, sparse)
        self._stepped[i] = True
        b.missing -= 1

    def _start_complete(self):
        while self._next < len(self._buckets) and self._buckets[self._next].missing == 0:
            b = self._buckets[self._next]
            if self.op != Adasum:
                flat = b.grad
            else:
                flat = self._params[b.slots[0]].detach() if b.delta is None else b.delta
            ptr, n, dt = _tensors.tensor_args(flat, b.what)
            req = ctypes.c_void_p()
            b.t0 = time.perf_counter()
            rt.raise_for(_calls.allreduce_call(flat, ptr, n, dt, b.op, req), b.what)
            b.req = req
            self._next += 1

    @torch.no_grad()
    def _finish_overlapped(self):
        err = self._error
        if err is None:
            try:
                for b in self._buckets[self._next:]:
                    for i in b.slots:
                        if not self._stepped[i]:  # no gradient this step (or fewer passes)
                            self._local_step(i)
                self._start_complete()
            except BaseException as e:
                err = e
        # Every started collective is waited for (sumo frees it there), in order; each
        # bucket is applied as it completes while the later ones still run.
        for b in self._buckets:
            if b.req is None:
                continue
            code = lib.sumo_request_wait(b.req)
            b.req = None
            rt.record(b.t0, time.perf_counter(), b.nbytes)
            if err is None:
                try:
                    rt.raise_for(code, "DistributedOptimizer.step: " + b.what)
                except Exception as e:
                    err = e
            if err is None:
                try:
                    if b.delta is None:
                        pv = self._params[b.slots[0]].detach().view(-1)
                        _apply_delta(pv, b.start, pv, b.what)
                    else:
                        for i, off in zip(b.slots, b.offsets):
                            n = self._params[i].numel()
                            _apply_delta(self._params[i].detach().view(-1), b.start[off:off + n],
                                         b.delta[off:off + n], b.what)
                except Exception as e:
                    err = e
        if err is not None:
            # A failed combine (a non-finite delta, a dead peer) leaves the parameters where
            # they started on every rank.
            for i, done in enumerate(self._stepped):
                if done:
                    b, k = self._where[i]
                    off, n = b.offsets[k], self._params[i].numel()
                    self._params[i].detach().view(-1).copy_(b.start[off:off + n])
            self._reset()
            raise err
        self._reset()

    @torch.no_grad()
    def _finish_grads(self):
        """Average/Sum with overlap: the parameters whose hook did not fire are packed as
        they stand, the rest of the buckets started in order, each waited for in turn and
        written back to .grad (postscaled, decompressed)."""
        err = self._error
        if err is None:
            try:
                for b in self._buckets[self._next:]:
                    for i in b.slots:
                        if not self._stepped[i]:
                            self._pack_grad(i)
                self._start_complete()
            except BaseException as e:
                err = e
        post = self.gradient_predivide_factor if self.op == Average else 1.0
        for b in self._buckets:
            if b.req is None:
                continue
            code = lib.sumo_request_wait(b.req)
            b.req = None
            rt.record(b.t0, time.perf_counter(), b.numel * b.grad.element_size())
            if err is not None:
                continue
            try:
                rt.raise_for(code, "DistributedOptimizer.step: " + b.what)
                for i in b.slots:
                    p = self._params[i]
                    piece = self._pieces[i]
                    if post != 1.0:
                        piece.mul_(post)
                    ctx, sparse = self._ctx[i]
                    got = self.compression.decompress(piece.view(p.shape), ctx)
                    if sparse:
                        p.grad = got.to_sparse()
                    else:
                        p.grad.copy_(got)
            except Exception as e:
                err = e
        self._reset()
        if err is not None:
            raise err

    # -- step ------------------------------------------------------------------------------------
    def _combine_once(self, combine):
        """Runs combine unless synchronize() already did. Horovod combines a second time
        here; combining an already combined Sum again would multiply it by size(), so sumo
        warns instead."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("sumo.DistributedOptimizer: step() after synchronize() "
                              "without skip_synchronize(); the gradients were combined "
                              "once and are not combined again", stacklevel=3)
            else:
                combine()
        self._synchronized = False

    def step(self, closure=None):
        if self.overlap and self.op != Adasum:
            with torch.no_grad():
                self._combine_once(self._finish_grads)
                return self._opt.step(closure)
        if self.overlap:
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()  # its backward pass takes the local steps
            self._finish_overlapped()
            return loss
        with torch.no_grad():
            if self.op == Adasum:
                return self._step_delta(closure)
            self._combine_once(self._combine_grads)
            return self._opt.step(closure)

    def synchronize(self):
        """Average and Sum: combine the gradients now, so that they can be read or changed
        (clipped, unscaled) before step() runs under skip_synchronize(). Adasum: nothing
        (it combines the update, at step())."""
        if self.op == Adasum:
            return
        with torch.no_grad():
            if self.overlap:
                self._finish_grads()
            else:
                self._combine_grads()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside it does not combine: for after synchronize()."""
        if self.op == Adasum:
            raise RuntimeError("sumo.DistributedOptimizer: skip_synchronize() is not supported "
                               "with op=Adasum (as in Horovod): its step() combines the update")
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _flat(self, group, tensors):
        return torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) > 1 else \
            tensors[0].reshape(-1).clone()

    def _allreduce(self, group, flat, op):
        ptr, n, dt = _tensors.tensor_args(flat, "the %s %s buffer of %d parameters (%s...)" % (
            str(group.dtype).replace("torch.", ""), "delta" if self.op == Adasum else "gradient",
            len(group.params), group.names[0]))
        rt.sync()
        t0 = time.perf_counter()
        rt.raise_for(_calls.allreduce_call(flat, ptr, n, dt, op),
                     "DistributedOptimizer.step (%d tensors: %s, ...)" % (
                         len(group.params), ", ".join(group.names[:3])))
        rt.record(t0, time.perf_counter(), n * flat.element_size())

    def _combine_grads(self):
        """Average / Sum of every trainable parameter's gradient (zeros where a rank has
        none), one collective per group and dtype as sent. Everything is checked before the
        first collective, so a bad gradient raises on its rank without leaving the others
        waiting in a collective it never joins."""
        prescale = postscale = 1.0
        if self.op == Average:
            prescale = 1.0 / self.gradient_predivide_factor
            postscale = self.gradient_predivide_factor
        batches = []  # (flat, [(param, numel, shape, ctx, sparse)], description)
        for idx in self._sync_groups:
            by_dtype = {}
            for i in idx:
                p, name = self._all_params[i], self._names[i]
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                g, sparse = p.grad, p.grad.is_sparse
                if sparse:
                    if not self.sparse_as_dense:
                        raise ValueError("sumo.DistributedOptimizer: %s has a sparse gradient; "
                                         "pass sparse_as_dense=True" % name)
                    g = g.to_dense()
                sent, ctx = self.compression.compress(g)
                _tensors.checked_tensor(sent, name + ".grad")
                by_dtype.setdefault(sent.dtype, []).append((p, sent, ctx, sparse, name))
            for dtype, entries in by_dtype.items():
                flat = torch.cat([e[1].reshape(-1) for e in entries])
                what = "DistributedOptimizer: the %s gradients of %d parameters (%s%s)" % (
                    str(dtype).replace("torch.", ""), len(entries),
                    ", ".join(e[4] for e in entries[:3]), ", ..." if len(entries) > 3 else "")
                batches.append((flat, entries, what))
        for flat, entries, what in batches:
            ptr, n, dt = _tensors.tensor_args(flat, what)
            if prescale != 1.0:
                flat.mul_(prescale)
            rt.sync()
            t0 = time.perf_counter()
            rt.raise_for(_calls.allreduce_call(flat, ptr, n, dt, self.op), what)
            rt.record(t0, time.perf_counter(), n * flat.element_size())
            if postscale != 1.0:
                flat.mul_(postscale)
            off = 0
            for p, sent, ctx, sparse, _ in entries:
                k = sent.numel()
                got = self.compression.decompress(flat[off:off + k].view_as(sent), ctx)
                off += k
                if sparse:
                    p.grad = got.to_sparse()
                else:
                    p.grad.copy_(got)

    def _step_delta(self, closure):
        # start: the parameters before the local step, identical on every rank (a user who
        # broadcasts or loads parameters between steps is therefore covered).
        starts = {id(p): p.detach().clone() for g in self._groups.values() for p in g.params}
        loss = self._opt.step(closure)
        for g in self._groups.values():
            starts_g = [starts[id(p)] for p in g.params]
            delta = self._like.new_empty(sum(p.numel() for p in g.params), dtype=g.dtype)
            off = 0
            for p, s in zip(g.params, starts_g):
                n = p.numel()
                _delta(delta[off:off + n], p.detach().reshape(-1), s.reshape(-1))
                off += n
            delta = delta.to(self._wire(delta.dtype))
            try:
                self._allreduce(g, delta, g.op)
                off = 0
                for p, s in zip(g.params, starts_g):
                    n = p.numel()
                    _apply_delta(p.detach().view(-1), s.view(-1), delta[off:off + n],
                                 "DistributedOptimizer.step")
                    off += n
            except Exception:
                # A failed combine (a non-finite delta, a dead peer) leaves the parameters
                # where they started on every rank.
                for q in self._opt.param_groups:
                    for p in q["params"]:
                        if id(p) in starts:
                            p.copy_(starts[id(p)])
                raise
        return loss


def _delta(out, params, start):
    """out = params - start: sumo's delta step (the C optimizer's own), or, where the wire
    type differs from the parameters' (a compressor), torch's subtraction and cast."""
    if out.dtype == params.dtype == start.dtype and out.dtype in _tensors._DTYPES:
        _cuda.legacy_ready(out)  # the C step runs on the legacy stream
        rt.raise_for(lib.sumo_delta_compute(
            rt.state.comm, _tensors.tensor_args(out, "delta")[0],
            _tensors.tensor_args(params, "parameter")[0], _tensors.tensor_args(start, "start")[0],
            out.numel(), _tensors._DTYPES[out.dtype]), "the delta step")
    else:
        torch.sub(params, start, out=out)


def _apply_delta(params, start, delta, what):
    """params = start + combined delta (sumo's, which puts params back at start and raises
    SUMO_ERR_NONFINITE when a result is not finite), or torch's add of a compressed delta."""
    if params.dtype == start.dtype == delta.dtype and params.dtype in _tensors._DTYPES:
        _cuda.legacy_ready(params)  # the C step runs on the legacy stream
        rt.raise_for(lib.sumo_delta_apply(
            rt.state.comm, _tensors.tensor_args(params, "parameter")[0],
            _tensors.tensor_args(start, "start")[0], _tensors.tensor_args(delta, "delta")[0],
            params.numel(), _tensors._DTYPES[params.dtype]), what)
    else:
        torch.add(start, delta, out=params)


def _grad_hook(ref, i):
    def hook(*_):
        opt = ref()
        if opt is not None:
            opt._on_grad(i)
    return hook


def _names_of(params, named_parameters):
    """id(param) -> name, checked as Horovod checks it: (name, tensor) pairs, unique names,
    and every parameter of the optimizer named when names are given."""
    if named_parameters is None:
        return {}
    named = list(named_parameters)
    if any(not isinstance(t, tuple) or len(t) != 2 for t in named):
        raise ValueError("named_parameters must be (name, tensor) pairs, as "
                         "model.named_parameters() gives")
    seen, dups = set(), set()
    for n, _ in named:
        (dups if n in seen else seen).add(n)
    if dups:
        raise ValueError("named_parameters: names must be unique; found %s more than once"
                         % ", ".join(sorted(map(str, dups))))
    names = {id(p): n for n, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in names]
    if unnamed:
        raise ValueError("named_parameters was given, but %d of the optimizer's parameters "
                         "are not in it (positions %s in its parameter groups)"
                         % (len(unnamed), ", ".join(map(str, unnamed[:10]))))
    return names


def _partition(params, groups):
    """Indices of the trainable parameters, cut into the collectives of Average and Sum:
    one part (groups=None), `groups` nearly equal consecutive parts, or the given lists of
    parameters with every other parameter alone, as Horovod's groups."""
    trainable = [i for i, p in enumerate(params) if p.requires_grad]
    if groups is None:
        return [trainable] if trainable else []
    if isinstance(groups, list):
        where = {id(params[i]): i for i in trainable}
        seen, parts = set(), []
        for group in groups:
            part = []
            for t in group:
                if not isinstance(t, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor")
                if id(t) in seen:
                    raise ValueError("a parameter can only appear once in groups")
                seen.add(id(t))
                if id(t) in where:
                    part.append(where[id(t)])
            if part:
                parts.append(part)
        parts += [[i] for i in trainable if id(params[i]) not in seen]
        return parts
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ValueError("groups should be a positive integer or a list of lists of "
                         "torch.Tensor, not %r" % (groups,))
    k, extra = divmod(len(trainable), groups)
    parts = [trainable[i * k + min(i, extra):(i + 1) * k + min(i + 1, extra)]
             for i in range(groups)]
    return [part for part in parts if part]

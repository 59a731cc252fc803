"""Horovod-style DistributedOptimizer over sumo.

op=Average or Sum: step() combines the gradients across ranks, then the wrapped optimizer
steps (the same step on every rank). op=Adasum: delta mode, as Horovod's
_DistributedAdasumOptimizer: every rank steps locally on its own gradient, the update
delta = new - start is combined with per-parameter Adasum, and start + combined becomes the
parameters on every rank; the optimizer's state (momentum, Adam moments) stays local.

Tensors of one dtype travel in one flat buffer (one collective per dtype and step, packed
with one copy each way), cut per parameter by the Adasum op's layout. Gradients accumulate
in .grad over backward_passes_per_step backward passes and are combined once, at step().
"""
import ctypes
import time

import torch

from .. import Sum, Average, Adasum
from .._lib import lib
from . import _runtime as rt
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


class DistributedOptimizer(WrappedOptimizer):
    # Not calling Optimizer.__init__: param_groups, state and defaults are the wrapped
    # optimizer's own (properties below), so LR schedulers and checkpoints see one optimizer.
    def __init__(self, optimizer, named_parameters=None, op=Average, backward_passes_per_step=1):
        comm = rt.require_init()
        if op not in (Sum, Average, Adasum):
            raise ValueError("sumo.torch.DistributedOptimizer: op must be sumo.Sum, "
                             "sumo.Average or sumo.Adasum")
        if int(backward_passes_per_step) < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._opt = optimizer
        self.op = op
        self.backward_passes_per_step = int(backward_passes_per_step)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        names = {}
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(t, tuple) or len(t) != 2 for t in named):
                raise ValueError("named_parameters must be (name, tensor) pairs, as "
                                 "model.named_parameters() gives")
            names = {id(p): n for n, p in named}
        self._groups = {}
        for i, p in enumerate(params):
            name = names.get(id(p), "param.%d" % i)
            rt.tensor_args(p.detach(), name)  # refuse int, non-contiguous, CUDA tensors now
            g = self._groups.setdefault(p.dtype, _Group(p.dtype))
            g.params.append(p)
            g.names.append(name)
        if op == Adasum:
            # The tensor sizes are the Adasum layout.
            for g in self._groups.values():
                g.op = _adasum_op(comm, g.layout())


    def __repr__(self):
        return "sumo.DistributedOptimizer(op=%s, %r)" % (
            {Sum: "Sum", Average: "Average", Adasum: "Adasum"}[self.op], self._opt)

    def add_param_group(self, param_group):
        raise NotImplementedError("sumo.DistributedOptimizer: add parameter groups to the "
                                  "optimizer before wrapping it")

    # The state is the wrapped optimizer's: the starting point of a delta is taken at each
    # step (the parameters every rank holds), so nothing else needs saving.
    def state_dict(self):
        return self._opt.state_dict()

    def load_state_dict(self, state_dict):
        self._opt.load_state_dict(state_dict)

    def _flat(self, group, tensors):
        return torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) > 1 else \
            tensors[0].reshape(-1).clone()

    def _allreduce(self, group, flat, op):
        ptr, n, dt = rt.tensor_args(flat, "the %s %s buffer of %d parameters (%s...)" % (
            str(group.dtype).replace("torch.", ""), "delta" if self.op == Adasum else "gradient",
            len(group.params), group.names[0]))
        rt.sync()
        t0 = time.perf_counter()
        rt.raise_for(lib.sumo_allreduce(ptr, ptr, n, dt, op, rt.state.comm),
                     "DistributedOptimizer.step (%d tensors: %s, ...)" % (
                         len(group.params), ", ".join(group.names[:3])))
        rt.record(t0, time.perf_counter(), n * flat.element_size())

    @torch.no_grad()
    def step(self, closure=None):
        if self.op == Adasum:
            return self._step_delta(closure)
        for g in self._groups.values():
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in g.params]
            for t, name in zip(grads, g.names):
                rt.tensor_args(t, name + ".grad")
            flat = self._flat(g, grads)
            self._allreduce(g, flat, self.op)
            off = 0
            for p in g.params:
                n = p.numel()
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(flat[off:off + n].view_as(p))
                off += n
        return self._opt.step(closure)

    def _step_delta(self, closure):
        # start: the parameters before the local step, identical on every rank (a user who
        # broadcasts or loads parameters between steps is therefore covered).
        starts = {id(p): p.detach().clone() for g in self._groups.values() for p in g.params}
        loss = self._opt.step(closure)
        for g in self._groups.values():
            starts_g = [starts[id(p)] for p in g.params]
            delta = self._flat(g, [p.detach() - s for p, s in zip(g.params, starts_g)])
            try:
                self._allreduce(g, delta, g.op)
            except Exception:
                # A failed combine (a non-finite delta, a dead peer) leaves the parameters
                # where they started on every rank.
                for q in self._opt.param_groups:
                    for p in q["params"]:
                        if id(p) in starts:
                            p.copy_(starts[id(p)])
                raise
            off = 0
            for p, s in zip(g.params, starts_g):
                n = p.numel()
                p.copy_(s.add_(delta[off:off + n].view_as(s)))
                off += n
        return loss


def _adasum_op(comm, layout):
    from .. import _lib
    counts = (ctypes.c_size_t * len(layout))(*layout)
    opts = _lib.AdasumOptions(ctypes.sizeof(_lib.AdasumOptions), counts, len(layout), 0, 0)
    out = ctypes.c_uint32()
    rt.raise_for(lib.sumo_op_create_adasum(comm, ctypes.byref(opts), ctypes.byref(out)),
                 "sumo_op_create_adasum (%d tensors)" % len(layout))
    return out.value

"""SlowMo (Wang et al., ICLR 2020) as an optimizer wrapper, with fairscale's option names.

Each rank steps locally with the wrapped optimizer; every localsgd_frequency steps the ranks
average their parameters (inner averaging, 0: never); every slowmo_frequency steps they
average exactly and take the slow momentum step, per parameter group with its lr:
    u = slowmo_momentum * u + (anchor - x_avg) / lr
    anchor = anchor - slowmo_lr * lr * u;   x = anchor
slowmo_momentum 0 and slowmo_lr 1 is Local SGD (x = x_avg). Unlike fairscale's wrapper this
needs no DDP and no CUDA, and state_dict holds the slow buffers.

A step whose gradients hold inf or NaN on any rank (a GradScaler-style skip) is skipped by
every rank: the ranks agree with one small allreduce per step, so replicas never drift apart
(PyTorch issue 76282).
"""

import torch

from .. import Average
from . import _runtime as rt
from ._wrapped import WrappedOptimizer

_POLICIES = ("keep", "reset", "average")


class SlowMo(WrappedOptimizer):
    def __init__(self, optimizer, slowmo_frequency=48, slowmo_lr=1.0, slowmo_momentum=0.5,
                 localsgd_frequency=3, slowmo_memory_efficient=True, buffers="keep",
                 skip_nonfinite=True):
        rt.require_init()
        if int(slowmo_frequency) < 1:
            raise ValueError("slowmo_frequency must be >= 1")
        if int(localsgd_frequency) < 0:
            raise ValueError("localsgd_frequency must be >= 0 (0: no inner averaging)")
        if not slowmo_lr > 0:
            raise ValueError("slowmo_lr must be > 0")
        if not 0 <= slowmo_momentum < 1:
            raise ValueError("slowmo_momentum must be in [0, 1)")
        if buffers not in _POLICIES:
            raise ValueError("buffers must be one of %s" % (_POLICIES,))
        self._opt = optimizer
        self.slowmo_frequency = int(slowmo_frequency)
        self.slowmo_lr = float(slowmo_lr)
        self.slowmo_momentum = float(slowmo_momentum)
        self.localsgd_frequency = int(localsgd_frequency)
        self.slowmo_memory_efficient = bool(slowmo_memory_efficient)
        self.buffers = buffers
        self.skip_nonfinite = bool(skip_nonfinite)
        self.steps = 0          # local steps taken (skipped ones not counted)
        self.skipped = 0
        for gi, g in enumerate(optimizer.param_groups):
            for pi, p in enumerate(g["params"]):
                rt.tensor_args(p.detach(), "param_groups[%d].params[%d]" % (gi, pi))
                if p.dtype not in (torch.float32, torch.float64):
                    raise TypeError("sumo.SlowMo: parameter groups must be float32 or float64 "
                                    "(param_groups[%d].params[%d] is %s)" % (gi, pi, p.dtype))
        # Slow buffer u and anchor per group, over the whole flat group or, memory efficient,
        # over this rank's shard only. Created lazily at the first outer step from the
        # averaged parameters (the anchor is where the ranks started the outer iteration).
        self._slow = [None] * len(optimizer.param_groups)
        self._anchor_ready = False


    # -- helpers -----------------------------------------------------------------------------
    def _group_flat(self, g):
        return torch.cat([p.detach().reshape(-1) for p in g["params"]])

    def _set_group(self, g, flat):
        off = 0
        for p in g["params"]:
            n = p.numel()
            p.detach().copy_(flat[off:off + n].view_as(p))
            off += n

    def _shard(self, n):
        size, rank = rt.state.size, rt.state.rank
        per = -(-n // size)
        lo = min(rank * per, n)
        return per, lo, min(lo + per, n)

    def _average_params(self):
        for gi, g in enumerate(self._opt.param_groups):
            flat = self._group_flat(g)
            rt.allreduce_tensor(flat, Average, "param_groups[%d] (parameter average)" % gi)
            self._set_group(g, flat)
        return

    def _init_anchor(self):
        # The anchor is x at the start of the outer iteration: identical on all ranks since
        # the parameters are (broadcast them before training).
        for gi, g in enumerate(self._opt.param_groups):
            flat = self._group_flat(g)
            if self.slowmo_memory_efficient:
                per, lo, hi = self._shard(flat.numel())
                flat = flat[lo:hi].clone()
            self._slow[gi] = {"anchor": flat.clone(), "u": torch.zeros_like(flat)}
        self._anchor_ready = True

    def _outer_step(self):
        for gi, g in enumerate(self._opt.param_groups):
            lr = float(g["lr"])
            if not lr > 0:
                raise ValueError("sumo.SlowMo: an outer step at lr %r; it divides by the rate" % lr)
            flat = self._group_flat(g)
            rt.allreduce_tensor(flat, Average, "param_groups[%d] (parameter average)" % gi)
            s = self._slow[gi]
            if self.slowmo_memory_efficient:
                # Each rank updates its shard; an allgather rebuilds the whole vector.
                per, lo, hi = self._shard(flat.numel())
                mine = flat[lo:hi]
                s["u"].mul_(self.slowmo_momentum).add_((s["anchor"] - mine) / lr)
                s["anchor"].add_(s["u"], alpha=-self.slowmo_lr * lr)
                padded = torch.zeros(per, dtype=flat.dtype)
                padded[:hi - lo] = s["anchor"]
                gathered = torch.zeros(per * rt.state.size, dtype=flat.dtype)
                _allgather(padded, gathered, "param_groups[%d] (SlowMo shards)" % gi)
                new = gathered[:flat.numel()]
            else:
                s["u"].mul_(self.slowmo_momentum).add_((s["anchor"] - flat) / lr)
                s["anchor"].add_(s["u"], alpha=-self.slowmo_lr * lr)
                new = s["anchor"]
            self._set_group(g, new)
        self._apply_buffer_policy()

    def _apply_buffer_policy(self):
        if self.buffers == "reset":
            self._opt.state.clear()
        elif self.buffers == "average":
            for p, st in self._opt.state.items():
                for k, v in st.items():
                    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0:
                        rt.allreduce_tensor(v, Average, "optimizer state %s" % k)

    def _all_finite(self):
        bad = torch.zeros(1, dtype=torch.float64)
        for g in self._opt.param_groups:
            for p in g["params"]:
                if p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                    bad[0] = 1
        rt.allreduce_tensor(bad, 0, "the non-finite gradient flag")
        return bad[0] == 0

    # -- the step ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One local step, then inner averaging and the outer step when due. Returns the
        closure's loss; a step skipped for non-finite gradients sets self.last_skipped."""
        if not self._anchor_ready:
            self._init_anchor()
        self.last_skipped = False
        if self.skip_nonfinite and not self._all_finite():
            self.skipped += 1
            self.last_skipped = True
            return None
        loss = self._opt.step(closure)
        self.steps += 1
        if self.steps % self.slowmo_frequency == 0:
            self._outer_step()
        elif self.localsgd_frequency and self.steps % self.localsgd_frequency == 0:
            self._average_params()
        return loss

    def state_dict(self):
        return {"optimizer": self._opt.state_dict(),
                "slowmo": {"steps": self.steps, "skipped": self.skipped,
                           "anchor_ready": self._anchor_ready,
                           "slow": [None if s is None else {k: v.clone() for k, v in s.items()}
                                    for s in self._slow]}}

    def load_state_dict(self, state_dict):
        self._opt.load_state_dict(state_dict["optimizer"])
        s = state_dict["slowmo"]
        self.steps, self.skipped = int(s["steps"]), int(s["skipped"])
        self._anchor_ready = bool(s["anchor_ready"])
        self._slow = [None if v is None else {k: t.clone() for k, t in v.items()} for v in s["slow"]]


def _allgather(send, recv, name):
    import ctypes
    from .._lib import lib
    sp, n, dt = rt.tensor_args(send, name)
    rp, _, _ = rt.tensor_args(recv, name)
    rt.sync()
    rt.raise_for(lib.sumo_allgather(sp, rp, n, dt, rt.state.comm), "allgather of %s" % name)


def LocalSGD(optimizer, period=12, **kw):
    """Local SGD: average the parameters every `period` local steps."""
    return SlowMo(optimizer, slowmo_frequency=period, slowmo_lr=1.0, slowmo_momentum=0.0,
                  localsgd_frequency=0, **kw)


def BMUF(optimizer, period=12, block_momentum=0.5, block_lr=1.0, **kw):
    """Blockwise model-update filtering (Chen & Huo 2016): slow momentum on the block
    update every `period` steps, no inner averaging."""
    return SlowMo(optimizer, slowmo_frequency=period, slowmo_lr=block_lr,
                  slowmo_momentum=block_momentum, localsgd_frequency=0, **kw)

"""SlowMo (Wang et al., ICLR 2020) as an optimizer wrapper, with fairscale's option names.

Each rank steps locally with the wrapped optimizer; every localsgd_frequency steps the ranks
average their parameters (inner averaging, 0: never); every slowmo_frequency steps they
average exactly and take the slow momentum step, per parameter group with its lr:
    u = slowmo_momentum * u + (anchor - x_avg) / lr
    anchor = anchor - slowmo_lr * lr * u;   x = anchor
slowmo_momentum 0 and slowmo_lr 1 is Local SGD (x = x_avg). Unlike fairscale's wrapper this
needs no DDP and no CUDA, and state_dict holds the slow buffers.

The outer loop is sumo's own (sumo_slowmo in C, the object the C training driver runs), one
per parameter group: the schedule, the averages, the slow update and the memory-efficient
sharding are that code's, so both give the same bits. Between synchronisations nothing is
communicated: a step whose gradients hold inf or NaN on this rank (skip_nonfinite) is skipped
here alone and still counted, so every rank stays on the schedule; if the non-finite values
reach the outer average, every rank raises alike.
"""
import ctypes

import torch

from .._abi import (SUMO_BUFFERS_AVERAGE, SUMO_BUFFERS_KEEP, SUMO_BUFFERS_RESET,
                    SUMO_OP_AVERAGE, SUMO_SLOWMO_LOCAL, SUMO_SLOWMO_OUTER, sumo_slowmo_options)
from .._lib import lib
from . import _runtime as rt
from ._wrapped import WrappedOptimizer

_POLICIES = ("keep", "reset", "average")

_BUFFERS = {"keep": SUMO_BUFFERS_KEEP, "reset": SUMO_BUFFERS_RESET,
            "average": SUMO_BUFFERS_AVERAGE}


class _Group:
    """One parameter group's sumo_slowmo and the flat buffer its parameters are gathered
    into when sumo reads them."""

    def __init__(self, index, params, options):
        self.index = index
        self.params = params
        self.dtype = params[0].dtype
        self.numel = sum(p.numel() for p in params)
        self.what = "param_groups[%d]" % index
        if any(p.dtype != self.dtype for p in params):
            raise TypeError("sumo.SlowMo: %s mixes dtypes; give each dtype its own group"
                            % self.what)
        self.flat = torch.empty(self.numel, dtype=self.dtype)
        self.handle = ctypes.c_void_p()
        dt = rt.tensor_args(self.flat, self.what)[2]
        rt.raise_for(lib.sumo_slowmo_create(rt.state.comm, self.numel, dt, ctypes.byref(options),
                                            ctypes.byref(self.handle)),
                     "sumo_slowmo_create for " + self.what)

    def gather(self):
        off = 0
        for p in self.params:
            n = p.numel()
            self.flat[off:off + n].copy_(p.detach().reshape(-1))
            off += n

    def scatter(self):
        off = 0
        for p in self.params:
            n = p.numel()
            p.detach().copy_(self.flat[off:off + n].view_as(p))
            off += n

    def ptr(self):
        return ctypes.c_void_p(self.flat.data_ptr())

    def close(self):
        if self.handle:
            lib.sumo_slowmo_destroy(self.handle)
            self.handle = ctypes.c_void_p()


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
        inner = self.localsgd_frequency
        if inner and self.slowmo_frequency % inner:
            # fairscale's rule, and sumo's (the outer average falls on an inner boundary).
            raise ValueError("slowmo_frequency must be a multiple of localsgd_frequency")
        options = sumo_slowmo_options(ctypes.sizeof(sumo_slowmo_options), self.slowmo_frequency,
                                      inner, self.slowmo_lr, self.slowmo_momentum,
                                      _BUFFERS[buffers], int(self.slowmo_memory_efficient))
        self._groups = []
        for gi, g in enumerate(optimizer.param_groups):
            for pi, p in enumerate(g["params"]):
                rt.tensor_args(p.detach(), "param_groups[%d].params[%d]" % (gi, pi))
                if p.dtype not in (torch.float32, torch.float64):
                    raise TypeError("sumo.SlowMo: parameter groups must be float32 or float64 "
                                    "(param_groups[%d].params[%d] is %s)" % (gi, pi, p.dtype))
            self._groups.append(_Group(gi, list(g["params"]), options))
        self._anchored = False

    def __del__(self):
        for g in getattr(self, "_groups", ()):
            g.close()

    # -- the step ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One local step, then inner averaging or the outer step when due. Returns the
        closure's loss; a step skipped for non-finite gradients sets self.last_skipped."""
        due = ctypes.c_int()
        rt.raise_for(lib.sumo_slowmo_due(self._groups[0].handle, ctypes.byref(due)))
        for g, pg in zip(self._groups, self._opt.param_groups):
            if due.value == SUMO_SLOWMO_OUTER and not float(pg["lr"]) > 0:
                raise ValueError("sumo.SlowMo: an outer step at lr %r; it divides by the rate"
                                 % pg["lr"])
        if not self._anchored:
            for g in self._groups:
                g.gather()
                rt.raise_for(lib.sumo_slowmo_begin(g.handle, g.ptr()), "SlowMo anchor of " + g.what)
            self._anchored = True
        loss = self._local_step(closure)
        rt.sync()
        for g, pg in zip(self._groups, self._opt.param_groups):
            if due.value != SUMO_SLOWMO_LOCAL:
                g.gather()
            rt.raise_for(lib.sumo_slowmo_end(g.handle, g.ptr(), ctypes.c_double(float(pg["lr"])),
                                             None),
                         "SlowMo %s step of %s" % ("outer" if due.value == SUMO_SLOWMO_OUTER
                                                   else "inner" if due.value != SUMO_SLOWMO_LOCAL
                                                   else "local", g.what))
            if due.value != SUMO_SLOWMO_LOCAL:
                g.scatter()
        if due.value == SUMO_SLOWMO_OUTER:
            self._apply_buffer_policy()
        return loss

    def _apply_buffer_policy(self):
        if self.buffers == "reset":
            self._opt.state.clear()
        elif self.buffers == "average":
            for p, st in self._opt.state.items():
                for k, v in st.items():
                    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0:
                        rt.allreduce_tensor(v, SUMO_OP_AVERAGE, "optimizer state %s" % k)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self):
        blobs = []
        for g in self._groups:
            n = ctypes.c_size_t()
            rt.raise_for(lib.sumo_slowmo_state_size(g.handle, ctypes.byref(n)))
            buf = ctypes.create_string_buffer(n.value)
            rt.raise_for(lib.sumo_slowmo_state_save(g.handle, buf, n.value),
                         "SlowMo state of " + g.what)
            blobs.append(buf.raw)
        return {"optimizer": self._opt.state_dict(),
                "slowmo": {"steps": self.steps, "skipped": self.skipped,
                           "anchored": self._anchored, "groups": blobs}}

    def load_state_dict(self, state_dict):
        s = state_dict["slowmo"]
        if "groups" not in s or len(s["groups"]) != len(self._groups):
            raise ValueError("sumo.SlowMo: the state has %s parameter groups, this optimizer %d "
                             "(or it was saved by an older sumo)"
                             % (len(s.get("groups", ())) or "no", len(self._groups)))
        self._opt.load_state_dict(state_dict["optimizer"])
        for g, blob in zip(self._groups, s["groups"]):
            buf = ctypes.create_string_buffer(blob, len(blob))
            rt.raise_for(lib.sumo_slowmo_state_load(g.handle, buf, len(blob)),
                         "SlowMo state of %s (saved with other options, ranks or parameters?)"
                         % g.what)
        self.steps, self.skipped = int(s["steps"]), int(s["skipped"])
        self._anchored = bool(s["anchored"])


def LocalSGD(optimizer, period=12, **kw):
    """Local SGD: average the parameters every `period` local steps."""
    return SlowMo(optimizer, slowmo_frequency=period, slowmo_lr=1.0, slowmo_momentum=0.0,
                  localsgd_frequency=0, **kw)


def BMUF(optimizer, period=12, block_momentum=0.5, block_lr=1.0, **kw):
    """Blockwise model-update filtering (Chen & Huo 2016): slow momentum on the block
    update every `period` steps, no inner averaging."""
    return SlowMo(optimizer, slowmo_frequency=period, slowmo_lr=block_lr,
                  slowmo_momentum=block_momentum, localsgd_frequency=0, **kw)

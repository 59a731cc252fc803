"""SlowMo (Wang et al., ICLR 2020) as an optimizer wrapper, with fairscale's option names.

Each rank steps locally with the wrapped optimizer; every localsgd_frequency steps the ranks
average their parameters (inner averaging, 0: never); every slowmo_frequency steps they
average exactly and take the slow momentum step, with the inner optimizer's lr:
    u = slowmo_momentum * u + (anchor - x_avg) / lr
    anchor = anchor - slowmo_lr * lr * u;   x = anchor
slowmo_momentum 0 and slowmo_lr 1 is Local SGD (x = x_avg). Unlike fairscale's wrapper this
needs no DDP and no CUDA, and state_dict holds the slow buffers.

SlowMo is a preset of sumo's one outer loop (DiLoCo here, sumo_diloco in C, the object the C
training driver runs): the heavy-ball outer step, one fragment, no delay, inner averaging and
the memory-efficient sharding are that loop's options, so both give the same bits. What is
SlowMo's own is what it does to the inner optimizer's buffers after an outer step (buffers).
The outer step takes one lr: parameter groups must agree on it at that step.
In a sumo.torch.elastic job (diloco.py) make it with slowmo_memory_efficient=False: the
sharded state is cut for one number of ranks and cannot follow a membership change.
"""
import torch

from .._abi import SUMO_DILOCO_APPLY, SUMO_OP_AVERAGE
from . import _calls
from .diloco import DiLoCo

_POLICIES = ("keep", "reset", "average")


class SlowMo(DiLoCo):
    def __init__(self, optimizer, slowmo_frequency=48, slowmo_lr=1.0, slowmo_momentum=0.5,
                 localsgd_frequency=3, slowmo_memory_efficient=True, buffers="keep",
                 skip_nonfinite=True, preset="slowmo"):
        if buffers not in _POLICIES:
            raise ValueError("buffers must be one of %s" % (_POLICIES,))
        # fairscale's names; the loop checks the values (and that slowmo_frequency is a
        # multiple of localsgd_frequency, as fairscale does) on every rank alike.
        self.slowmo_frequency = int(slowmo_frequency)
        self.slowmo_lr = float(slowmo_lr)
        self.slowmo_momentum = float(slowmo_momentum)
        self.localsgd_frequency = int(localsgd_frequency)
        self.slowmo_memory_efficient = bool(slowmo_memory_efficient)
        self.buffers = buffers
        super().__init__(optimizer, self.slowmo_frequency, outer="heavy_ball",
                         outer_lr=self.slowmo_lr, outer_momentum=self.slowmo_momentum,
                         inner_period=self.localsgd_frequency,
                         memory_efficient=self.slowmo_memory_efficient,
                         skip_nonfinite=skip_nonfinite, preset=preset)

    def step(self, closure=None):
        """One local step, then inner averaging or the outer step when due. Returns the
        closure's loss; a step skipped for non-finite gradients sets self.last_skipped."""
        loss = super().step(closure)
        if self.last_due & SUMO_DILOCO_APPLY:  # the outer step ran
            self._apply_buffer_policy()
        return loss

    def _apply_buffer_policy(self):
        if self.buffers == "reset":
            self._opt.state.clear()
        elif self.buffers == "average":
            for p, st in self._opt.state.items():
                for k, v in st.items():
                    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0:
                        _calls.allreduce_tensor(v, SUMO_OP_AVERAGE, "optimizer state %s" % k)


def LocalSGD(optimizer, period=12, **kw):
    """Local SGD: average the parameters every `period` local steps."""
    return SlowMo(optimizer, slowmo_frequency=period, slowmo_lr=1.0, slowmo_momentum=0.0,
                  localsgd_frequency=0, preset="localsgd", **kw)


def BMUF(optimizer, period=12, block_momentum=0.5, block_lr=1.0, **kw):
    """Blockwise model-update filtering (Chen & Huo 2016): slow momentum on the block
    update every `period` steps, no inner averaging."""
    return SlowMo(optimizer, slowmo_frequency=period, slowmo_lr=block_lr,
                  slowmo_momentum=block_momentum, localsgd_frequency=0, preset="bmuf", **kw)

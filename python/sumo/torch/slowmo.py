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

slowmo_base_algorithm picks the base of the local steps: "localsgd" (above), or a gossip round
after every local step, "sgp", "osgp" (the round overlapped with the next step) or "dpsgd"
(docs/design/gossip.md), over the dynamic directed exponential graph (gossip_peers out-peers a
round). A gossip base has no inner averaging (localsgd_frequency is not used) and no sharded
state (slowmo_memory_efficient is not used). nprocs_per_node > 1 (SGP or OSGP, on a two-level
communicator of that many ranks per node) makes the nodes gossip, each round after the node's
average: for an SGD inner optimizer the same as averaging the node's gradients first.

SlowMoDistributedDataParallel is fairscale's wrapper of that name over the same C objects:
wrap the module, step the optimizer, then call model.perform_slowmo(optimizer).
"""
import torch

from .._abi import SUMO_DILOCO_APPLY, SUMO_OP_AVERAGE
from . import _calls, _runtime as rt
from .diloco import DiLoCo

_POLICIES = ("keep", "reset", "average")


class SlowMoBaseAlgorithm:
    """fairscale's names for the base algorithm (its enum's members, or these strings)."""
    LOCALSGD = "localsgd"
    SGP = "sgp"
    OSGP = "osgp"
    DPSGD = "dpsgd"


def _base_name(algorithm):
    name = getattr(algorithm, "name", algorithm)  # fairscale's enum member, or a string
    name = str(name).lower()
    if name not in ("localsgd", "sgp", "osgp", "dpsgd"):
        raise ValueError("sumo.SlowMo: slowmo_base_algorithm must be LOCALSGD, SGP, OSGP or "
                         "DPSGD, not %r" % (algorithm,))
    return name


class SlowMo(DiLoCo):
    def __init__(self, optimizer, slowmo_frequency=48, slowmo_lr=1.0, slowmo_momentum=0.5,
                 localsgd_frequency=3, slowmo_memory_efficient=True, buffers="keep",
                 skip_nonfinite=True, preset="slowmo", slowmo_base_algorithm="localsgd",
                 nprocs_per_node=1, gossip_peers=1, gossip_staleness=1):
        if buffers not in _POLICIES:
            raise ValueError("buffers must be one of %s" % (_POLICIES,))
        self.slowmo_base_algorithm = _base_name(slowmo_base_algorithm)
        self.nprocs_per_node = int(nprocs_per_node)
        gossip = self.slowmo_base_algorithm != "localsgd"
        if self.nprocs_per_node < 1:
            raise ValueError("sumo.SlowMo: nprocs_per_node must be >= 1")
        if self.nprocs_per_node > 1 and not gossip:
            raise ValueError("sumo.SlowMo: nprocs_per_node > 1 needs a gossip base (SGP, OSGP "
                             "or DPSGD): the nodes gossip, each after its own average")
        if self.nprocs_per_node > 1 and rt.state.local_size != self.nprocs_per_node:
            raise ValueError("sumo.SlowMo: nprocs_per_node %d, but sumo.torch's communicator "
                             "has %d ranks per node" % (self.nprocs_per_node, rt.state.local_size))
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
                         inner_period=0 if gossip else self.localsgd_frequency,
                         memory_efficient=False if gossip else self.slowmo_memory_efficient,
                         skip_nonfinite=skip_nonfinite, preset=preset,
                         base=self.slowmo_base_algorithm, gossip_peers=gossip_peers,
                         gossip_staleness=gossip_staleness,
                         gossip_per_node=self.nprocs_per_node > 1)

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


class SlowMoDistributedDataParallel(torch.nn.Module):
    """fairscale's SlowMoDistributedDataParallel on sumo, on CPU and CUDA: wraps `module`
    (forward goes to it unchanged); after each optimizer.step(), model.perform_slowmo(optimizer)
    runs the base's round and, every slowmo_frequency steps, the exact average and the slow
    momentum step (SlowMo above, on the C outer loop). fairscale's defaults: LOCALSGD base,
    localsgd_frequency 3, slowmo_frequency 48, slowmo_lr 1, slowmo_momentum 0.5. The anchor
    is the parameters when the wrapper is made (fairscale takes them after the first step).
    overlap=True with SGP is OSGP (fairscale's flag), synch_freq its staleness bound."""

    def __init__(self, module, nprocs_per_node=1, *,
                 slowmo_base_algorithm=SlowMoBaseAlgorithm.LOCALSGD, localsgd_frequency=3,
                 slowmo_frequency=48, slowmo_lr=1.0, slowmo_momentum=0.5,
                 slowmo_memory_efficient=True, overlap=False, synch_freq=1, gossip_peers=1,
                 buffers="keep"):
        super().__init__()
        self.module = module
        base = _base_name(slowmo_base_algorithm)
        if overlap and base == "sgp":
            base = "osgp"
        elif overlap and base != "osgp":
            raise ValueError("sumo.SlowMoDistributedDataParallel: overlap needs the SGP base")
        self._options = dict(slowmo_frequency=slowmo_frequency, slowmo_lr=slowmo_lr,
                             slowmo_momentum=slowmo_momentum,
                             localsgd_frequency=localsgd_frequency,
                             slowmo_memory_efficient=slowmo_memory_efficient, buffers=buffers,
                             skip_nonfinite=False, slowmo_base_algorithm=base,
                             nprocs_per_node=nprocs_per_node, gossip_peers=gossip_peers,
                             gossip_staleness=synch_freq)
        self.slowmo_base_algorithm = base
        self.nprocs_per_node = int(nprocs_per_node)
        self.localsgd_frequency, self.slowmo_frequency = localsgd_frequency, slowmo_frequency
        self.slowmo_lr, self.slowmo_momentum = slowmo_lr, slowmo_momentum
        self._start = [p.detach().clone() for p in module.parameters()]
        self._slowmo = None

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def perform_slowmo(self, optimizer):
        """After optimizer.step(): the end of the local step (collective when communicating)."""
        if self._slowmo is None:
            self._slowmo = SlowMo(optimizer, **self._options)
        elif self._slowmo._opt is not optimizer:
            raise ValueError("sumo.SlowMoDistributedDataParallel: perform_slowmo got another "
                             "optimizer than the first call's")
        s = self._slowmo
        if not s._anchored:
            # The anchors are the parameters before the first step: the wrapper's copy.
            now = [p.detach().clone() for p in s._params]
            for p, p0 in zip(s._params, self._start):
                p.copy_(p0)
            plan = s._before_step()
            for p, p1 in zip(s._params, now):
                p.copy_(p1)
            self._start = None
        else:
            plan = s._before_step()
        s.steps += 1
        s._after_step(plan)
        if s.last_due & SUMO_DILOCO_APPLY:
            s._apply_buffer_policy()

    def stats(self):
        return self._slowmo.stats() if self._slowmo else {"rounds": 0, "bytes": 0}

    def slowmo_state_dict(self):
        """The outer loop's state and the inner optimizer's (SlowMo.state_dict)."""
        return self._slowmo.state_dict() if self._slowmo else {}

    def close(self):
        if self._slowmo:
            self._slowmo.close()

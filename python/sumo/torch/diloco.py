"""DiLoCo (Douillard et al., arXiv 2311.08105) and Streaming DiLoCo (arXiv 2501.18512) as an
optimizer wrapper around any torch optimizer, which takes the inner (local) steps.

Every rank steps locally on its own data. The parameters are cut into F fragments (whole
tensors, or with split="ranges" F equal ranges of the flat parameter vector, cutting tensors);
fragment f is exchanged every sync_every (H) local steps, at the ends of steps
floor((f + 1) H / F) + j H, and its outer step is applied `delay` steps later:
    Delta = mean over ranks of (anchor - theta_r)     (or their Adasum, or ACGA)
    Nesterov:   v = mu v + Delta;  anchor = anchor - outer_lr (Delta + mu v)
    heavy ball: u = mu u + Delta / lr;  anchor = anchor - outer_lr lr u   (SlowMo's, lr inner)
    theta = merge_alpha theta + (1 - merge_alpha) anchor
F = 1, delay 0, merge 0 is DiLoCo; the outer gradients may travel as bf16, fp8 (e4m3) or
4-bit (e3m0) with a power-of-two scale per block. The same loop is SlowMo's (slowmo.py: the
heavy-ball step, inner averaging every inner_period steps, the sharded state).

All of it is the C library's sumo_diloco (the object `sumo train` runs): the schedule, the
default fragment split, the exchange, the outer step and its checkpoint. This wrapper only
moves parameters between the model's tensors and the flat buffer that object reads, and calls
it around each local step. The exchange runs on sumo's progress thread while the next
`delay` local steps run here. Between exchanges nothing is communicated; a step whose
gradients hold inf or NaN on this rank (skip_nonfinite) is skipped here alone and still
counted, so every rank stays on the schedule.

Under sumo.torch.elastic (the wrapper kept in a TorchState) the replicas are those present:
one lost during local steps is left out of the next outer step, which averages over the
survivors from the last commit they all hold (the anchors, momenta and the position in the
schedule are restored, each survivor's own parameters and inner state with them); one that
joins is healed from rank 0 (its parameters, inner state and outer state). The C object is
made again on each new communicator from the state it held. Not with memory_efficient: its
state is cut in slices for one number of ranks.
"""
import atexit
import ctypes
import weakref

import torch

from .._abi import (
    SUMO_BASE_DPSGD, SUMO_BASE_LOCAL, SUMO_BASE_OSGP, SUMO_BASE_SGP,
    SUMO_COMBINE_ACGA, SUMO_COMBINE_ADASUM, SUMO_COMBINE_AVERAGE, SUMO_COMPRESS_BF16,
    SUMO_COMPRESS_E3M0, SUMO_COMPRESS_FP8_E4M3, SUMO_COMPRESS_NONE, SUMO_DILOCO_APPLY,
    SUMO_DILOCO_AVERAGE, SUMO_DILOCO_PRESET_BMUF, SUMO_DILOCO_PRESET_DILOCO,
    SUMO_DILOCO_PRESET_DPSGD, SUMO_DILOCO_PRESET_LOCALSGD, SUMO_DILOCO_PRESET_OSGP,
    SUMO_DILOCO_PRESET_SGP, SUMO_DILOCO_PRESET_SLOWMO, SUMO_DILOCO_PRESET_SLOWMO_SGP,
    SUMO_DILOCO_PRESET_STREAMING,
    SUMO_DILOCO_START, SUMO_ERR_INVALID_ARGUMENT, SUMO_OUTER_HEAVY_BALL, SUMO_OUTER_NESTEROV,
    SUMO_SPLIT_RANGES, SUMO_SPLIT_TENSORS, sumo_comm_stats, sumo_diloco_options)
from .._lib import lib
from . import _cuda, _membership, _runtime as rt, _tensors
from ._wrapped import WrappedOptimizer

_PRESETS = {"diloco": SUMO_DILOCO_PRESET_DILOCO, "streaming": SUMO_DILOCO_PRESET_STREAMING,
            "localsgd": SUMO_DILOCO_PRESET_LOCALSGD, "slowmo": SUMO_DILOCO_PRESET_SLOWMO,
            "bmuf": SUMO_DILOCO_PRESET_BMUF, "sgp": SUMO_DILOCO_PRESET_SGP,
            "osgp": SUMO_DILOCO_PRESET_OSGP, "dpsgd": SUMO_DILOCO_PRESET_DPSGD,
            "slowmo_sgp": SUMO_DILOCO_PRESET_SLOWMO_SGP}
# The base of the local steps (sumo_diloco_base): plain local steps or a gossip round after each.
_BASES = {"local": SUMO_BASE_LOCAL, "localsgd": SUMO_BASE_LOCAL, "sgp": SUMO_BASE_SGP,
          "osgp": SUMO_BASE_OSGP, "dpsgd": SUMO_BASE_DPSGD}
_OUTER = {"nesterov": SUMO_OUTER_NESTEROV, "heavy_ball": SUMO_OUTER_HEAVY_BALL}
_SPLIT = {"tensors": SUMO_SPLIT_TENSORS, "ranges": SUMO_SPLIT_RANGES}
_COMBINE = {"average": SUMO_COMBINE_AVERAGE, "adasum": SUMO_COMBINE_ADASUM,
            "acga": SUMO_COMBINE_ACGA}
_QUANTIZE = {"none": SUMO_COMPRESS_NONE, "fp32": SUMO_COMPRESS_NONE, "bf16": SUMO_COMPRESS_BF16,
             "fp8": SUMO_COMPRESS_FP8_E4M3, "e4m3": SUMO_COMPRESS_FP8_E4M3,
             "fp8_e4m3": SUMO_COMPRESS_FP8_E4M3, "e3m0": SUMO_COMPRESS_E3M0,
             "fp4": SUMO_COMPRESS_E3M0}

# Objects whose exchange may still be in flight when the process ends: they are destroyed
# (which waits for it) before sumo.torch's own exit handler destroys the communicator under
# them (atexit runs the handler registered last first, and this one registers after init()).
_live = weakref.WeakSet()
_exit_hook = [False]


def _close_all():
    for d in list(_live):
        d.close()


def _choice(table, value, what):
    key = "none" if value is False else str(value).lower()
    if key not in table:
        raise ValueError("sumo.DiLoCo: %s must be one of %s, not %r"
                         % (what, ", ".join(sorted(table)), value))
    return table[key]


class DiLoCo(WrappedOptimizer):
    """DiLoCo around `optimizer` (the inner optimizer, any torch optimizer). Options left None
    take the preset's value (the C library's sumo_diloco_options_default): "diloco" (H 500,
    Nesterov outer_lr 0.7, momentum 0.9), "streaming" (that with 4 fragments, delay 1,
    merge_alpha 0.5 and e3m0 in blocks of 128), "localsgd", "slowmo", "bmuf".

    fragments: an int F (contiguous runs of whole tensors in the optimizer's parameter order,
    which is the model's for model.parameters()), or a list of F groups, each an nn.Module, a
    parameter or a list of parameters, covering every parameter once (the paper's strided
    split: [layers[i::F] ...]). split: "tensors" (the above) or "ranges" (F equal ranges of
    the flat parameter vector: a fragment may cut a tensor, and the peak in flight is 1/F of
    the model whatever its largest tensor). quantize: "none", "bf16", "e4m3" (fp8) or "e3m0"
    (4-bit). combine: "average", "adasum" (per tensor) or "acga" (over the fragment, rescaled
    to the mean change's norm). inner_period: average every parameter every inner_period
    steps between synchronisations (SlowMo's Local SGD base; one fragment, no delay).
    memory_efficient: shard the anchors and momenta over the ranks (one fragment, no delay,
    no merge, the uncompressed average). base: "local" (plain local steps), or a gossip round
    after each local step, "sgp", "osgp" or "dpsgd" (one fragment, no delay, merge,
    compression, inner averaging or sharding; sync_every 0: no exact average at all), with
    gossip_peers out-peers a round, gossip_staleness (OSGP) and gossip_per_node (the nodes of
    a two-level communicator gossip, each round after the node's average)."""

    def __init__(self, optimizer, sync_every=None, *, fragments=None, delay=None,
                 merge_alpha=None, outer=None, outer_lr=None, outer_momentum=None, combine=None,
                 quantize=None, block_size=None, split=None, inner_period=None,
                 memory_efficient=None, skip_nonfinite=True, preset="diloco", base=None,
                 gossip_peers=None, gossip_staleness=None, gossip_per_node=None):
        rt.require_init()
        self._opt = optimizer
        self._handle = ctypes.c_void_p()
        try:
            o, self._params, fragment_of = self._options(
                preset, sync_every, fragments, delay, merge_alpha, outer, outer_lr,
                outer_momentum, combine, quantize, block_size, split, inner_period,
                memory_efficient, (base, gossip_peers, gossip_staleness, gossip_per_node))
        except (TypeError, ValueError) as e:
            rt.fail_together(e)  # the peers are heading into create: they fail now too
        self.skip_nonfinite = bool(skip_nonfinite)
        self.sync_every, self.fragments, self.delay = o.sync_every, o.fragments, o.delay
        self.merge_alpha, self.outer_lr, self.outer_momentum = o.merge_alpha, o.lr, o.momentum
        self.outer = [k for k, v in _OUTER.items() if v == o.outer][0]
        self.steps = 0    # local steps taken (skipped ones not counted)
        self.skipped = 0
        self.dtype = self._params[0].dtype
        counts = [p.numel() for p in self._params]
        self._offsets = [0]
        for c in counts:
            self._offsets.append(self._offsets[-1] + c)
        n = self._offsets[-1]
        # The flat copy sumo reads and writes lives with the parameters (CUDA memory for CUDA
        # parameters: the outer loop's state moves there at the first step).
        self._flat = self._params[0].detach().new_zeros(n, dtype=self.dtype)
        dt = _tensors.tensor_args(self._flat, "the parameters")[2]
        if self._flat.is_cuda:
            # Across hosts the C loop's exchanges of device memory take the NCCL level of the
            # two-level communicator (made now, on every rank alike: the object is collective).
            _cuda.across_ready()
        self.memory_efficient = bool(o.memory_efficient)
        # Kept for comm_opened, which makes the C object again on a new communicator.
        self._layout = (ctypes.c_size_t * len(counts))(*counts)
        self._dt = dt
        if fragment_of is not None:
            self._fragment_of = (ctypes.c_int * len(fragment_of))(*fragment_of)
            o.fragment_of = ctypes.cast(self._fragment_of, ctypes.POINTER(ctypes.c_int))
        self._o = o
        self._create()
        self._frag_tensors = [self._tensors_of(f) for f in range(self.fragments)]
        self._all = list(range(len(self._params)))
        self.last_due = 0
        self._carried = None
        self._replaced = False
        _membership.bind(self)
        if not _exit_hook[0]:
            atexit.register(_close_all)
            _exit_hook[0] = True

    def _create(self):
        """The C outer loop on the current communicator (collective), with no state yet."""
        rt.sync()
        handle = ctypes.c_void_p()
        code = lib.sumo_diloco_create(rt.state.comm, self._layout, len(self._layout),
                                      self._flat.numel(), self._dt, ctypes.byref(self._o),
                                      ctypes.byref(handle))
        if code == SUMO_ERR_INVALID_ARGUMENT:
            # The library checks the options (every rank fails alike); its reason says which.
            why = ctypes.c_char_p()
            lib.sumo_comm_error_message(rt.state.comm, ctypes.byref(why))
            raise ValueError("sumo.DiLoCo: %s" % (why.value.decode(errors="replace")
                                                  if why.value else "invalid options"))
        rt.raise_for(code, "sumo_diloco_create (every rank needs the same model and options)")
        self._handle = handle
        self._anchored = False
        _live.add(self)

    def _options(self, preset, sync_every, fragments, delay, merge_alpha, outer, outer_lr,
                 outer_momentum, combine, quantize, block_size, split, inner_period,
                 memory_efficient, gossip=(None, None, None, None)):
        o = sumo_diloco_options()
        rt.raise_for(lib.sumo_diloco_options_default(_choice(_PRESETS, preset, "preset"),
                                                    ctypes.byref(o)))
        params, names = [], []
        for gi, g in enumerate(self._opt.param_groups):
            for pi, p in enumerate(g["params"]):
                name = "param_groups[%d].params[%d]" % (gi, pi)
                if not isinstance(p, torch.Tensor):
                    raise TypeError("sumo.DiLoCo: %s is not a tensor" % name)
                if p.device.type not in ("cpu", "cuda"):
                    raise ValueError("sumo.DiLoCo: %s is on %s; sumo works on CPU and CUDA "
                                     "tensors" % (name, p.device))
                if params and p.device != params[0].device:
                    raise ValueError("sumo.DiLoCo: the parameters mix devices: %s is on %s and "
                                     "%s on %s; the outer loop runs on one device"
                                     % (names[0], params[0].device, name, p.device))
                names.append(name)
                if p.dtype not in (torch.float32, torch.float64):
                    raise TypeError("sumo.DiLoCo: parameters must be float32 or float64 (%s is "
                                    "%s)" % (name, p.dtype))
                if params and p.dtype != params[0].dtype:
                    raise TypeError("sumo.DiLoCo: the parameters mix %s and %s (%s); the outer "
                                    "loop runs on one dtype" % (params[0].dtype, p.dtype, name))
                params.append(p)
        if not params:
            raise ValueError("sumo.DiLoCo: the optimizer has no parameters")
        fragment_of = None
        if fragments is not None and not isinstance(fragments, int):
            fragment_of = self._split(params, fragments)
            o.fragments = max(fragment_of) + 1
        elif fragments is not None:
            o.fragments = fragments
        if sync_every is not None:
            o.sync_every = int(sync_every)
        if delay is not None:
            o.delay = int(delay)
        if merge_alpha is not None:
            o.merge_alpha = float(merge_alpha)
        if outer is not None:
            o.outer = _choice(_OUTER, outer, "outer")
        if outer_lr is not None:
            o.lr = float(outer_lr)
        if outer_momentum is not None:
            o.momentum = float(outer_momentum)
        if combine is not None:
            o.combine = _choice(_COMBINE, combine, "combine")
        if quantize is not None:
            o.compression = _choice(_QUANTIZE, quantize, "quantize")
        if block_size is not None:
            o.block_size = int(block_size)
        if split is not None:
            o.split = _choice(_SPLIT, split, "split")
        if inner_period is not None:
            o.inner_period = int(inner_period)
        if memory_efficient is not None:
            o.memory_efficient = int(bool(memory_efficient))
        base, peers, staleness, per_node = gossip
        if base is not None:
            o.base = _choice(_BASES, base, "base")
        if peers is not None:
            o.gossip_peers = int(peers)
        if staleness is not None:
            o.gossip_staleness = int(staleness)
        if per_node is not None:
            o.gossip_per_node = int(bool(per_node))
        return o, params, fragment_of

    @staticmethod
    def _split(params, groups):
        """fragment_of per tensor from the caller's groups."""
        index = {id(p): i for i, p in enumerate(params)}
        fragment_of = [-1] * len(params)
        groups = list(groups)
        for f, g in enumerate(groups):
            members = []
            for m in ([g] if isinstance(g, (torch.nn.Module, torch.Tensor)) else g):
                if isinstance(m, torch.nn.Module):
                    members.extend(m.parameters())
                elif isinstance(m, torch.Tensor):
                    members.append(m)
                else:
                    raise TypeError("sumo.DiLoCo: fragment %d holds a %s; a fragment is a "
                                    "module, a parameter or a list of them"
                                    % (f, type(m).__name__))
            if not members:
                raise ValueError("sumo.DiLoCo: fragment %d has no parameters" % f)
            for p in members:
                i = index.get(id(p))
                if i is None:
                    raise ValueError("sumo.DiLoCo: fragment %d holds a parameter the optimizer "
                                     "does not" % f)
                if fragment_of[i] >= 0:
                    raise ValueError("sumo.DiLoCo: parameter %d is in fragments %d and %d"
                                     % (i, fragment_of[i], f))
                fragment_of[i] = f
        missing = [i for i, f in enumerate(fragment_of) if f < 0]
        if missing:
            raise ValueError("sumo.DiLoCo: parameters %s of the optimizer are in no fragment"
                             % missing[:8])
        return fragment_of

    def _tensors_of(self, f):
        """The tensors fragment f touches, from the library's runs (it chose the split); with
        ranges a tensor may be touched by two fragments, and moves whole for either."""
        count, nruns = ctypes.c_size_t(), ctypes.c_size_t()
        rt.raise_for(lib.sumo_diloco_fragment(self._handle, f, ctypes.byref(count),
                                              ctypes.byref(nruns)))
        offs = (ctypes.c_size_t * nruns.value)()
        lens = (ctypes.c_size_t * nruns.value)()
        rt.raise_for(lib.sumo_diloco_fragment_runs(self._handle, f, offs, lens, nruns.value))
        out = []
        for off, length in zip(offs, lens):
            out.extend(t for t in range(len(self._params))
                       if self._offsets[t] < off + length and self._offsets[t + 1] > off
                       and t not in out)
        return out

    def close(self):
        """Frees the C object (waiting for an exchange in flight); the wrapper is then unusable."""
        if self._handle:
            lib.sumo_diloco_destroy(self._handle)
            self._handle = ctypes.c_void_p()
        _live.discard(self)

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()

    # sumo.torch.elastic replaced the communicator (bind). The C object keeps the old one
    # (its exchanges run on it), so it goes with it and is made again on the new one, holding
    # the outer state it held: the averages then divide by the new number of replicas. After a
    # join the members are at a commit and that state is theirs to go on with; after a loss
    # elastic restores the agreed commit over it (load_state_dict), so a state that cannot be
    # saved (its exchange failed with the lost peer) is not carried. A sharded state
    # (memory_efficient) is not carried at all: each rank holds a slice cut for the old
    # number of ranks, and a lost rank took its slice of the momenta with it.
    def comm_closing(self):
        self._carried = None
        if self._handle and not self.memory_efficient:
            try:
                self._carried = self._save()
            except rt.SumoError:
                pass
        self.close()

    def comm_opened(self):
        if self.memory_efficient:
            self._replaced = True
            return
        self._create()
        carried, self._carried = self._carried, None
        if carried is not None:
            self._load(carried)

    # -- moving parameters ---------------------------------------------------------------------
    def _gather(self, tensors):
        for t in tensors:
            a, b = self._offsets[t], self._offsets[t + 1]
            self._flat[a:b].copy_(self._params[t].detach().reshape(-1))

    def _scatter(self, tensors):
        for t in tensors:
            a, b = self._offsets[t], self._offsets[t + 1]
            p = self._params[t]
            p.detach().copy_(self._flat[a:b].view_as(p))

    def _ptr(self):
        return ctypes.c_void_p(self._flat.data_ptr())

    # -- the step ------------------------------------------------------------------------------
    def _due(self):
        what, applied, started = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        rt.raise_for(lib.sumo_diloco_due(self._handle, ctypes.byref(what), ctypes.byref(applied),
                                         ctypes.byref(started)))
        return what.value, applied.value, started.value

    def _inner_rate(self, started):
        """The rate handed to the library: the heavy-ball outer step divides by it where an
        exchange starts, so the groups must agree on one there; Nesterov does not read it."""
        rates = {float(g["lr"]) for g in self._opt.param_groups}
        if self.outer != "heavy_ball":
            return 0.0
        if started >= 0:
            if len(rates) != 1:
                rt.fail_together(ValueError(
                    "sumo.DiLoCo: the heavy-ball outer step takes one inner lr, the parameter "
                    "groups have %s" % sorted(rates)))
            lr = rates.pop()
            if not lr > 0:
                rt.fail_together(ValueError(
                    "sumo.DiLoCo: an exchange starts at lr %r; the heavy-ball outer step "
                    "divides by the rate" % lr))
            return lr
        return max(0.0, min(rates))

    @torch.no_grad()
    def step(self, closure=None):
        """One local step, then the exchange or outer step due at its end. Returns the
        closure's loss; a step skipped for non-finite gradients sets self.last_skipped."""
        if not self._handle:
            if self._replaced:
                raise RuntimeError("sumo.DiLoCo: the communicator it was made on was replaced "
                                   "(sumo.torch.elastic: a process was lost or joined), and "
                                   "memory_efficient's outer state is cut in slices for the "
                                   "old number of ranks: use memory_efficient=False "
                                   "(slowmo_memory_efficient=False) in an elastic job")
            raise RuntimeError("sumo.DiLoCo: step() after close()")
        plan = self._before_step()
        loss = self._local_step(closure)
        self._after_step(plan)
        return loss

    def _before_step(self):
        """What the end of the coming step does; the anchors (the parameters now) on the first."""
        what, applied, started = self._due()
        lr = self._inner_rate(started)
        if not self._anchored:
            self._gather(range(len(self._params)))
            _cuda.legacy_ready(self._flat)  # the C loop runs its kernels on the legacy stream
            rt.raise_for(lib.sumo_diloco_begin(self._handle, self._ptr()), "DiLoCo anchors")
            self._anchored = True
        return what, applied, started, lr

    def _after_step(self, plan):
        """The end of a local step: the exchange, outer step or gossip round due at it."""
        what, applied, started, lr = plan
        moved = sorted(set((self._frag_tensors[applied] if what & SUMO_DILOCO_APPLY else []) +
                           (self._frag_tensors[started] if what & SUMO_DILOCO_START else []) +
                           (self._all if what & SUMO_DILOCO_AVERAGE else [])))
        if what:
            self._gather(moved)
            rt.sync()  # the exchange is ordered after collectives already queued
        _cuda.legacy_ready(self._flat)
        rt.raise_for(lib.sumo_diloco_end(self._handle, self._ptr(), ctypes.c_double(lr), None),
                     "DiLoCo step %d%s%s" % (
                         self.steps + self.skipped,
                         ", outer step of fragment %d" % applied
                         if what & SUMO_DILOCO_APPLY else "",
                         ", exchange of fragment %d" % started if what & SUMO_DILOCO_START else ""))
        if what & (SUMO_DILOCO_APPLY | SUMO_DILOCO_AVERAGE):
            # An inner average writes every parameter; in place (one fragment, no delay, no
            # merge) the exchange that starts writes the average too, applied at once.
            self._scatter(moved)
        self.last_due = what

    # -- what it cost, and whether the replicas agree ------------------------------------------
    def stats(self):
        """Exchanges so far: {"rounds": ..., "bytes": ...} (payload bytes this rank sent)."""
        s = sumo_comm_stats()
        rt.raise_for(lib.sumo_diloco_stats(self._handle, ctypes.byref(s)))
        return {"rounds": s.rounds, "bytes": s.bytes}

    def extra_memory(self):
        """Bytes the outer loop keeps beyond the parameters (anchors, momenta, the exchange
        buffer), plus this wrapper's flat copy of the parameters."""
        b = ctypes.c_size_t()
        rt.raise_for(lib.sumo_diloco_extra_memory(self._handle, ctypes.byref(b)))
        return b.value + self._flat.numel() * self._flat.element_size()

    @property
    def synchronized(self):
        """Whether every rank holds the same parameters after the last step."""
        s = ctypes.c_int()
        rt.raise_for(lib.sumo_diloco_synchronized(self._handle, ctypes.byref(s)))
        return bool(s.value)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self):
        """The inner optimizer's state and the outer loop's (anchors, momenta, the position in
        the fragment schedule, an exchange in flight: saving waits for it and keeps its
        result, which the resumed run applies at the same step; one that failed raises its
        error)."""
        return {"optimizer": self._opt.state_dict(),
                "diloco": {"state": self._save(), "steps": self.steps, "skipped": self.skipped}}

    def load_state_dict(self, state_dict):
        s = state_dict.get("diloco")
        if not isinstance(s, dict) or "state" not in s:
            raise ValueError("sumo.DiLoCo: not a DiLoCo state_dict (no 'diloco' entry)")
        self._load(s["state"])
        self._opt.load_state_dict(state_dict["optimizer"])
        self.steps, self.skipped = int(s["steps"]), int(s["skipped"])

    def _save(self):
        if not self._handle:
            raise RuntimeError("sumo.DiLoCo: state_dict() after close()")
        n = ctypes.c_size_t()
        rt.raise_for(lib.sumo_diloco_state_size(self._handle, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(n.value)
        rt.raise_for(lib.sumo_diloco_state_save(self._handle, buf, n.value), "DiLoCo state")
        return buf.raw

    def _load(self, blob):
        if not self._handle:
            raise RuntimeError("sumo.DiLoCo: load_state_dict() after close()")
        buf = ctypes.create_string_buffer(blob, len(blob))
        rt.raise_for(lib.sumo_diloco_state_load(self._handle, buf, len(blob)),
                     "DiLoCo state (saved with another model, fragments, sync_every, delay, "
                     "combine, quantize or dtype?)")
        # begin() takes the anchors unless the state holds them: one gather decides nothing.
        self._anchored = False


class StreamingDiLoCo(DiLoCo):
    """Streaming DiLoCo: DiLoCo with the "streaming" preset (4 fragments, delay 1, merge_alpha
    0.5, e3m0 outer gradients in blocks of 128), each option overridable as in DiLoCo."""

    def __init__(self, optimizer, sync_every=None, **kw):
        kw.setdefault("preset", "streaming")
        super().__init__(optimizer, sync_every, **kw)

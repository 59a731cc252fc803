"""Horovod's elastic API on sumo: training that goes on when a process is lost, with the
processes left, from the last state all of them committed; and processes that join a running
job. A Horovod elastic script runs with its import changed (import sumo.torch as hvd):

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...                                   # steps; state.commit() now and then

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])   # e.g. re-shard the data for hvd.size()
    train(state)

The processes must be started each on its own, meeting through a store none of them holds
(init(store=..., rank=..., size=...), or `python -m sumo.launch`): a launcher that ends every
process when one fails (torchrun, mpirun) takes the survivors down with it.

A lost process. Every collective on the communicator then fails (SUMO_ERR_PEER_FAILURE; a
process that stops answering: SUMO_ERR_TIMEOUT), raised as HorovodInternalError (a SumoError
too). run() catches it and the processes still there shrink the communicator
(libsumo's sumo_elastic_shrink): they agree on who is left and on the smallest commit count any of them
brought. A collective that completed on some survivors and failed on others can leave those
one commit ahead, so every state keeps its last two commits and each process restores the
agreed one: the same state everywhere, nothing committed lost. What was made on the old
communicator is made again on the new one (the optimizer's buffers and Adasum ops, the hooks'
caches, DiLoCo's outer loop), rank() and size() give the new membership, the reset callbacks
run, the state is synced from rank 0 and the function is called again: the steps since the
commit are redone.

DiLoCo, StreamingDiLoCo and SlowMo (kept in the TorchState as its optimizer) go on with the
replicas there are: one lost during local steps is left out of the next outer step, which
averages over the survivors' changes from the commit they restored; between outer steps each
survivor keeps its own parameters and inner optimizer state through the sync (not rank 0's),
and a joiner takes rank 0's replica. memory_efficient is refused (its state is sliced for
one number of ranks).
An ElasticSampler in the state cuts what is left of the epoch again for the new membership.

A joining process (init(store=..., join=True), `python -m sumo.launch --join`) takes a
ticket in the store and waits. Each commit() asks rank 0 whether tickets were taken
(check_host_updates: one small collective, as Horovod's); if so every member raises
HostsUpdatedInterrupt, run() makes the communicator again with the joiners ranked after the
members, and the sync hands them the state. The joiner's script makes the same objects the
members keep (model, DistributedOptimizer: their buffers are made on the new communicator
collectively, in the order they were made) before it calls the run() function.

Each process's membership is libsumo's sumo_elastic object (_membership.py), the one `sumo
train --store` runs on. Processes of one host go over sumo's shared memory (its shrink sees a
process end); across hosts (init(..., transport="tcp")) over sumo's TCP connections met
through the store (transport="group": a gloo group made from it, at the object's request),
one communicator per membership, the survivors agreeing through the store with heartbeats
(sumo_store_agree). The
MPI transport and torch.distributed groups made by a launcher cannot shrink, and a failure
there ends the job as before (docs/torch/elastic.md).
"""
import copy
import functools
import math
import random

import torch
import torch.utils.data

from .._abi import SUMO_ERR_MISMATCH
from .._lib import SumoError
from . import _membership, _runtime as rt
from . import collectives
from ._init import init
from ._runtime import HorovodInternalError, HostsUpdatedInterrupt
from ._shutdown import shutdown
from .diloco import DiLoCo

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "HorovodInternalError",
           "HostsUpdatedInterrupt", "init", "shutdown"]


def _rank():
    rt.require_init()
    return rt.state.rank


def _broadcast_count(n, what):
    """rank 0's whole number n (below 2^53) on every rank."""
    t = torch.tensor([float(n)], dtype=torch.float64)
    collectives.broadcast_(t, 0, name=what)
    return int(t.item())


class _Kept:
    """A state as of each of the last two commits: a process whose last collective completed
    where its peers' failed may be one commit ahead of them, and goes back to theirs."""

    def __init__(self):
        self.by_commit = {}

    def put(self, commit, value):
        self.by_commit[commit] = value
        for k in [k for k in self.by_commit if k < commit - 1]:
            del self.by_commit[k]

    def get(self, commit):
        return self.by_commit.get(commit)


class State:
    """Horovod's State: what run() keeps across a change of membership. Subclass it with
    save(), restore() and sync() (a subclass of one's own keeps one commit; ObjectState and
    TorchState keep two, see _Kept), or use ObjectState or TorchState. bcast_object and
    get_rank default to sumo.torch's broadcast_object and rank."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or collectives.broadcast_object
        self._rank = get_rank or _rank
        self._reset_callbacks = []
        self._commits = getattr(self, "_commits", 0)

    def register_reset_callbacks(self, callbacks):
        """Functions run after every change of membership, before the state is synced (e.g. to
        scale the learning rate or re-shard the data for the new size())."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Keeps the state as it is now (what a failure rolls back to), then checks for
        processes asking to join (check_host_updates). Every rank commits at the same points;
        a commit copies the state, so commit every few steps rather than every one: a failure
        costs the steps since the last commit."""
        self._commits += 1
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when processes took join tickets since
        the last membership, and HorovodInternalError on every rank when any saw a member's
        heartbeat stand still. Collective in a store job (libsumo's commit point,
        sumo_elastic_commit: rank 0 counts the tickets, every member learns what any saw);
        elsewhere nobody can join, and nothing is exchanged."""
        joiners = _membership.commit_point()
        if joiners:
            e = HostsUpdatedInterrupt(False)
            e.joiners = joiners
            raise e

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        """Objects and variables to reset after a change of membership, before the sync."""

    def _rollback(self, commit):
        """Makes commit (this rank's last, or the one before) what restore() restores; False
        when this state does not keep it."""
        return commit == self._commits


class ObjectState(State):
    """Horovod's ObjectState: each keyword argument an attribute, saved by commit(), restored
    after a loss and broadcast from rank 0 by sync() (pickled)."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._commits = 0
        self._kept_objects = _Kept()
        self._kept_objects.put(0, dict(kwargs))
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}
        self._kept_objects.put(self._commits, self._saved_state)

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _rollback(self, commit):
        saved = self._kept_objects.get(commit)
        if saved is None:
            return False
        self._saved_state = saved
        return True

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


class _Handler:
    """How TorchState keeps one kind of object: a copy per kept commit, loaded back by
    restore(), the object broadcast from rank 0 by sync()."""

    def __init__(self, value):
        self.value = value
        self.kept = _Kept()
        self.save(0)

    def save(self, commit):
        self.saved = self.copy()
        self.kept.put(commit, self.saved)

    def rollback(self, commit):
        saved = self.kept.get(commit)
        if saved is None:
            return False
        self.saved = saved
        return True

    def set_value(self, value, commit):
        self.value = value
        self.save(commit)

    def copy(self):
        return copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self.saved)


class _ModelHandler(_Handler):
    def sync(self):
        collectives.broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self):
        collectives.broadcast_optimizer_state(self.value, root_rank=0)


class _DiLoCoHandler(_Handler):
    """DiLoCo, StreamingDiLoCo and SlowMo (diloco.py). Their replicas differ between outer
    steps: each has parameters and an inner optimizer state of its own, and all of them the
    same outer state. So at a sync a process that already holds a replica keeps its own (the
    model's broadcast from rank 0 is undone on its parameters), and only one that does not yet
    (every process at the start, a joiner) takes rank 0's: parameters, inner state and outer
    state, a replica healed from a peer. TorchState.sync calls own_parameters() on every
    process before any handler's sync, then this sync after the others'."""

    def __init__(self, value):
        if value.memory_efficient:
            raise ValueError("sumo.torch.elastic: a DiLoCo or SlowMo with memory_efficient "
                             "(slowmo_memory_efficient) holds its outer state in slices cut for "
                             "one number of ranks, and a lost rank takes its slice with it: "
                             "make it with memory_efficient=False to keep it in a TorchState")
        super().__init__(value)
        self.held = False

    def own_parameters(self):
        if not self.held:
            return None
        return [p.detach().clone() for p in self.value._params]

    def sync(self, own=None):
        newcomers = sum(collectives.allgather_object(
            not self.held, name="sumo.torch.elastic: the replicas without DiLoCo state"))
        if newcomers:
            sd = collectives.broadcast_object(
                self.value.state_dict() if _rank() == 0 else None, root_rank=0,
                name="the DiLoCo replica of rank 0")
            if not self.held and _rank() != 0:
                self.value.load_state_dict(sd)
        if own is not None:
            with torch.no_grad():
                for p, mine in zip(self.value._params, own):
                    p.copy_(mine)
        self.held = True


class _SchedulerHandler(_Handler):
    def sync(self):
        sd = collectives.broadcast_object(self.value.state_dict(), root_rank=0,
                                          name="the learning rate scheduler")
        self.value.load_state_dict(sd)


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: the epoch's indices (shuffled with seed + epoch, the same on
    every process) that are not processed yet, cut among the processes there are: process r
    of P takes every P-th from the r-th, the last ones repeated so that each gets as many.
    record_batch(batch_idx, batch_size) after each batch counts batch_size samples for every
    process; set_epoch(e), at the end of an epoch, starts the next. Kept in a TorchState,
    what is left of the epoch is cut again for the new membership after a change."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Cuts what is left of the epoch for the current membership."""
        rt.require_init()
        self.num_replicas, self.rank = rt.state.size, rt.state.rank
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        left = self.remaining_indices
        padded = (left * (1 + self.total_size // max(len(left), 1)))[:self.total_size]
        return iter(padded[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples


class _SamplerHandler(_Handler):
    def sync(self):
        sd = collectives.broadcast_object(self.value.state_dict(), root_rank=0,
                                          name="the elastic sampler")
        self.value.load_state_dict(sd)  # cut again for the membership there is now


_SCHEDULER = getattr(torch.optim.lr_scheduler, "LRScheduler",
                     torch.optim.lr_scheduler._LRScheduler)
_HANDLERS = [(DiLoCo, _DiLoCoHandler),  # before Optimizer: DiLoCo is one
             (torch.nn.Module, _ModelHandler), (torch.optim.Optimizer, _OptimizerHandler),
             (_SCHEDULER, _SchedulerHandler), (ElasticSampler, _SamplerHandler)]


def _handler_of(value):
    for kind, handler in _HANDLERS:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """Horovod's TorchState: model, optimizer (a DistributedOptimizer, a DiLoCo or SlowMo,
    or any torch optimizer) and any further keyword arguments; modules, optimizers, learning
    rate schedulers and ElasticSamplers are kept as copies of their state_dict (assigning
    one, state.model = m, saves it), the rest as ObjectState keeps it. A DiLoCo's replicas
    keep their own parameters and inner state at a sync (_DiLoCoHandler)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        handlers, rest = {}, {}
        for name, value in kwargs.items():
            h = _handler_of(value)
            if h is None:
                rest[name] = value
            else:
                handlers[name] = h
        self._handlers = handlers
        for name, h in handlers.items():
            setattr(self, name, h.value)
        super().__init__(bcast_object=collectives.broadcast_object, get_rank=_rank, **rest)

    def save(self):
        for h in self._handlers.values():
            h.save(self._commits)
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        replicas = {name: h.own_parameters() for name, h in self._handlers.items()
                    if isinstance(h, _DiLoCoHandler)}
        for name, h in self._handlers.items():
            if name not in replicas:
                h.sync()
        for name, own in replicas.items():
            self._handlers[name].sync(own)
        super().sync()

    def _rollback(self, commit):
        return all([h.rollback(commit) for h in self._handlers.values()]) and \
            super()._rollback(commit)

    def __setattr__(self, name, value):
        if hasattr(self, name) and name in self.__dict__.get("_handlers", {}):
            self._handlers[name].set_value(value, self._commits)
        super().__setattr__(name, value)


# What a joiner that has not had the state yet brings to the agreement: the most a commit count
# can be, so that the smallest is a member's.
_NO_STATE = (1 << 64) - 1


def _recover(state, lost, synced):
    """After a lost process: the smaller communicator, and the state of the commit every
    survivor has. synced: this process has had the job's state (a joiner has not until its
    first sync, which the one after the shrink then is)."""
    mine = getattr(state, "_commits", None)
    has_state = synced or not rt.state.joined
    agreed, _ = _membership.shrink((mine or 0) if has_state else _NO_STATE)
    if agreed == _NO_STATE:
        raise RuntimeError("sumo.torch.elastic: every process that held the job's state was "
                           "lost; the ones left joined and never had it") from lost
    if not has_state:
        return
    if mine is not None:
        if not state._rollback(agreed):
            raise RuntimeError("sumo.torch.elastic: the survivors agreed on commit %d; this "
                               "rank is at commit %d and keeps no earlier one" % (agreed, mine)) \
                from lost
        state._commits = agreed
    state.restore()


def _sync(state):
    """state.sync(), and the commit count with it: a joiner starts from the members'. The
    synced state is what a failure before the next commit goes back to."""
    state.sync()
    if isinstance(state, State):
        state._commits = _broadcast_count(state._commits, "sumo.torch.elastic: the commit count")
    if isinstance(state, ObjectState):
        state.save()


class _Refused(Exception):
    """A joiner's state did not match the members': they drop it like a lost process."""


def _sync_or_refuse(state, grew, synced):
    """_sync(state), where a mismatch after processes joined refuses the joiners: a mismatch
    there is a joiner's state of another shape (the members' states matched before), and the
    agreement fails it on every process alike, the communicator still usable. Every joiner of
    that grow leaves (none can tell which one differs), and the members shrink back."""
    try:
        _sync(state)
    except SumoError as e:
        joiner = not synced and rt.state.joined
        if e.code != SUMO_ERR_MISMATCH or not (grew or joiner):
            raise
        if joiner:
            raise RuntimeError("sumo.torch.elastic: this process's state does not match the "
                               "job's, so the job goes on without it: %s" % e) from None
        raise _Refused(e) from None


def run(func):
    """Horovod's decorator: runs func(state, ...) until it returns. On a lost process
    (HorovodInternalError) the survivors shrink the communicator, restore the commit they all
    have, run the reset callbacks, sync the state from rank 0 and call func again; when
    processes asked to join (HostsUpdatedInterrupt, at a commit) the communicator grows with
    them and the state is synced to them. A process the others went on without (it came
    after the deadline) ends with a SumoError. A joiner whose state does not match the job's
    (its model of another shape: the state sync fails with SUMO_ERR_MISMATCH on every process)
    is refused: it ends with a RuntimeError naming the mismatch, and the members drop it as
    they drop a lost process and go on."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        rt.require_init()
        skip_sync = synced = False
        lost = joined = None
        while True:
            try:
                grew = joined is not None
                if lost is not None:
                    _recover(state, lost, synced)
                    state.on_reset()
                elif grew:
                    _membership.grow(joined.joiners)
                    state.on_reset()
                lost = joined = None
                if not skip_sync:
                    _sync_or_refuse(state, grew, synced)
                    synced = True
                return func(state, *args, **kwargs)
            except _Refused as e:
                lost, joined, skip_sync = e, None, False
            except HorovodInternalError as e:
                lost, joined, skip_sync = e, None, False
            except HostsUpdatedInterrupt as e:
                if not hasattr(e, "joiners"):  # raised by the caller's own code
                    e.joiners = 0
                lost, joined, skip_sync = None, e, e.skip_sync
    return wrapper

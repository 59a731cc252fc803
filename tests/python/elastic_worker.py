"""One process of tests/python/test_elastic.py's jobs: a small model trained with
sumo.torch.elastic, the processes started each on its own and meeting through a FileStore, on
the shared-memory transport or (--transport group) on gloo groups made from the store, as
processes on several hosts would.

    python3 elastic_worker.py STORE OUT (--rank R --size N | --join) [options]

STORE: a directory (sumo's directory store) or a FileStore's file.
Every process computes the same thing from (step, rank) alone, so the test can compute what
the survivors must end with (elastic_reference) without sumo. --kill-rank R --kill-step S
--kill-where between|collective: the process that started as rank R kills itself (SIGKILL)
at step S of the first membership, between steps or inside the step's gradient allreduce.
--fail-shrink-rank R (over group): the process that started as rank R fails its first
shrink's meeting after its peers have met it (it makes the communicator, drops it and raises
PeerLost), as a member that dies at the end of a meeting leaves it on some ranks only.
--wait-joiners K: rank 0 waits, at the first commit, until K join tickets were taken (so the
test knows at which commit they come in). --diloco: the optimizer is sumo.torch.DiLoCo
around make_optimizer's (DILOCO's options, DILOCO_STEPS steps, test_elastic_diloco.py), and
each replica trains on its own data, batch(step, the rank it started as), wherever it is
ranked later. What each process saw goes to OUT/<pid>.pt.
"""
import argparse
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import sumo.torch as hvd  # noqa: E402
from sumo.torch import _membership, _runtime  # noqa: E402

STEPS = 8
COMMIT_EVERY = 2
# One fragment, outer steps at steps 4, 8 and 12: commits fall inside rounds and at their ends.
DILOCO_STEPS = 12
DILOCO = dict(sync_every=4, outer_lr=0.7, outer_momentum=0.9)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def loss_of(model, step, rank):
    x, y = batch(step, rank)
    return torch.nn.functional.mse_loss(model(x), y)


def average_step(model, opt, size, loss_of_rank):
    """One step of the tests' references: each rank's gradient in turn, summed in rank order
    and divided by the size (what sumo's average does), then the optimizer's step."""
    grads = []
    for r in range(size):
        model.zero_grad()
        loss_of_rank(r).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for i, p in enumerate(model.parameters()):
        total = grads[0][i].clone()
        for g in grads[1:]:
            total += g[i]
        p.grad = total / size
    opt.step()


def reference(memberships, steps=STEPS):
    """The model after `steps` steps of this training, computed without sumo: memberships is
    [(first step, number of processes), ...]; at each step every process r of that number
    takes the gradient of batch(step, r), the gradients are averaged in rank order (summed
    left to right, divided once: what sumo's average does) and the SGD step is taken."""
    torch.set_num_threads(1)
    model = make_model()
    opt = make_optimizer(model.parameters())
    for step in range(steps):
        size = [n for first, n in memberships if first <= step][-1]
        average_step(model, opt, size, lambda r: loss_of(model, step, r))
    return model.state_dict()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("out")
    p.add_argument("--rank", type=int)
    p.add_argument("--size", type=int)
    p.add_argument("--join", action="store_true")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-step", type=int, default=-1)
    p.add_argument("--kill-where", default="between")
    p.add_argument("--wait-joiners", type=int, default=0)
    p.add_argument("--transport", default="shm")
    p.add_argument("--diloco", action="store_true")
    p.add_argument("--fail-shrink-rank", type=int, default=-1)
    p.add_argument("--bad-model", action="store_true", help="a model of another shape")
    a = p.parse_args()
    if a.rank is not None and a.rank == a.fail_shrink_rank:
        real, failed = _membership.make_group, []

        def make_group(adapter, prefix, *args, **kw):
            comm, transport = real(adapter, prefix, *args, **kw)
            if not prefix.endswith("/a0/comm/") and not failed:  # the first shrink's
                failed.append(prefix)
                _runtime.lib.sumo_comm_destroy(comm)
                print("fail-shrink: the meeting under %s fails here only" % prefix, flush=True)
                raise _runtime.PeerLost(5, "SUMO_ERR_PEER_FAILURE", "injected")
            return comm, transport

        _membership.make_group = make_group
    torch.set_num_threads(1)
    # A directory: sumo's directory store; else a FileStore's file.
    store = a.store if os.path.isdir(a.store) else dist.FileStore(a.store, -1)
    if a.join:
        hvd.init(store=store, join=True, transport=a.transport)
    else:
        hvd.init(store=store, rank=a.rank, size=a.size, transport=a.transport)
    first = (hvd.rank(), hvd.size())  # a joiner's: its place when it came in
    events = []

    model = make_model()
    if a.bad_model:
        model = torch.nn.Sequential(torch.nn.Linear(16, 9), torch.nn.Tanh(), torch.nn.Linear(9, 4))
    if a.diloco:
        opt = hvd.DiLoCo(make_optimizer(model.parameters()), **DILOCO)
    else:
        opt = hvd.DistributedOptimizer(make_optimizer(model.parameters()),
                                       named_parameters=model.named_parameters())
    steps = DILOCO_STEPS if a.diloco else STEPS
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    state.register_reset_callbacks([lambda: events.append(
        ("reset", time.monotonic(), hvd.rank(), hvd.size(), state.step, state._commits))])

    @hvd.elastic.run
    def train(state):
        events.append(("call", time.monotonic(), hvd.rank(), hvd.size(), state.step))
        while state.step < steps:
            s = state.step
            victim = (not a.join and a.rank == a.kill_rank and s == a.kill_step
                      and _runtime.state.memberships <= 1 and hvd.size() > 1)
            if victim and a.kill_where == "between":
                os.kill(os.getpid(), signal.SIGKILL)
            if victim:
                # Inside the collective: this process is waiting in the step's allreduce
                # (started in the backward pass) when it dies; the others come later.
                threading.Timer(0.15, os.kill, (os.getpid(), signal.SIGKILL)).start()
            elif a.kill_where == "collective" and s == a.kill_step and \
                    _runtime.state.memberships <= 1 and hvd.size() > 1:
                time.sleep(0.4)
            opt.zero_grad()
            try:
                loss_of(model, s, first[0] if a.diloco else hvd.rank()).backward()
                opt.step()
            except hvd.elastic.HorovodInternalError:
                events.append(("failed", time.monotonic(), hvd.rank(), hvd.size(), s))
                raise
            state.step += 1
            if state.step % COMMIT_EVERY == 0:
                if a.wait_joiners and hvd.rank() == 0 and _runtime.state.memberships == 0:
                    while _membership.tickets_taken() < a.wait_joiners:
                        time.sleep(0.05)
                try:
                    state.commit()
                except hvd.elastic.HostsUpdatedInterrupt:
                    events.append(("joining", time.monotonic(), hvd.rank(), hvd.size(),
                                   state.step))
                    raise

    try:
        train(state)
    except RuntimeError as e:
        if not a.bad_model:
            raise
        print("refused: %s" % e, flush=True)
        sys.exit(3)
    torch.save({"first": first, "rank": hvd.rank(), "size": hvd.size(), "step": state.step,
                "commits": state._commits, "events": events,
                "params": {k: v.clone() for k, v in model.state_dict().items()}},
               os.path.join(a.out, "%d.pt" % os.getpid()))


if __name__ == "__main__":
    main()

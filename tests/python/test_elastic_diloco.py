"""sumo.torch.DiLoCo under sumo.torch.elastic, against DiLoCo computed here without sumo.

One job of three processes started each on its own (elastic_worker.py --diloco, a FileStore):
two replicas, a third that joins at the first commit (inside the first round: rank 0 heals
it), and the replica started as rank 1 SIGKILLed during the local steps of the second round,
after a commit inside that round. The survivors must finish and end, bit for bit, on the
DiLoCo training written below in which that replica leaves at its last commit: each survivor
goes on from its own parameters and inner momenta of that commit (not rank 0's), and the
outer step averages over the two replicas left. Under a launcher the test is skipped.

In the pytest process itself (one rank): the outer loop made again on a new communicator from
the commit restored, and a sharded one refused."""
import copy
import time

import pytest
import torch

import sumo.torch as hvd
from sumo.torch import _runtime

import elastic_worker as worker
from test_elastic import LAUNCHED, _check_survivors, _run_job, _shm_entries


def reference(join_at, leave):
    """The parameters after worker.DILOCO_STEPS steps, without sumo. Replicas 0 and 1 start
    from worker.make_model(); replica 2 comes in before step join_at as a copy of replica 0
    (parameters and inner momenta); replica `leave[0]` is gone from step leave[1] on (its
    last commit: the steps it took since are lost with it). At each step every replica there
    takes an SGD step on its own worker.batch(step, replica); at the end of every sync_every-th
    step the replicas there, in rank order, make the outer step from the anchor:
        mean = (x_0 + x_1 + ...) / n        in float32, summed left to right, divided once
        Delta = anchor - mean;  v = mu v + Delta;  anchor = anchor - lr (Delta + mu v)
    in float64 from the stored float32 values, v and the anchor stored as float32 (DiLoCo's
    Nesterov step as sumo states it, include/sumo_diloco.h), and every replica takes the
    anchor."""
    torch.set_num_threads(1)
    h, lr, mu = worker.DILOCO["sync_every"], worker.DILOCO["outer_lr"], \
        worker.DILOCO["outer_momentum"]
    flat = torch.nn.utils.parameters_to_vector
    replicas = {}
    for r in (0, 1):
        model = worker.make_model()
        replicas[r] = (model, worker.make_optimizer(model.parameters()))
    anchor = flat(replicas[0][0].parameters()).detach().clone()
    v = torch.zeros_like(anchor)
    for step in range(worker.DILOCO_STEPS):
        if step == join_at:
            replicas[2] = copy.deepcopy(replicas[0])
        if step == leave[1]:
            del replicas[leave[0]]
        for r, (model, opt) in sorted(replicas.items()):
            opt.zero_grad()
            worker.loss_of(model, step, r).backward()
            opt.step()
        if (step + 1) % h == 0:
            xs = [flat(m.parameters()).detach() for _, (m, _) in sorted(replicas.items())]
            total = xs[0].clone()
            for x in xs[1:]:
                total += x
            mean = total / len(xs)
            a64 = anchor.double()
            delta = a64 - mean.double()
            v64 = v.double() * mu + delta
            anchor = (a64 - (delta + v64 * mu) * lr).float()
            v = v64.float()
            for model, _ in replicas.values():
                with torch.no_grad():
                    at = 0
                    for p in model.parameters():
                        p.copy_(anchor[at:at + p.numel()].view_as(p))
                        at += p.numel()
    return replicas[0][0].state_dict()


@pytest.mark.skipif(LAUNCHED, reason="starts processes of its own; runs without a launcher")
def test_diloco_replica_joined_then_killed_survivors_equal_reference(tmp_path):
    # Outer steps at 4, 8 and 12, commits every 2 steps. The joiner comes in at the commit of
    # step 2 (3 replicas from there); process 1 dies before its step 7, the last commit was at
    # step 6, so the two left (old ranks 0 and 2) redo steps 6 and 7 from their own state of
    # step 6 and make the outer steps of 8 and 12 alone.
    before = _shm_entries()
    t0 = time.monotonic()
    codes, results, logs = _run_job(tmp_path, tmp_path / "store", 2, (1, 7, "between"),
                                    joiners=1, extra=["--diloco"])
    took = time.monotonic() - t0
    _check_survivors(codes, results, logs, 1, reference(2, (1, 6)), steps=worker.DILOCO_STEPS)
    joiner = [r for r in results if r["first"] == (2, 3)]
    assert len(joiner) == 1, logs
    for res in results:
        resets = [(e[3], e[4]) for e in res["events"] if e[0] == "reset"]
        assert resets == ([(2, 6)] if res is joiner[0] else [(3, 2), (2, 6)]), res["events"]
    assert _shm_entries() <= before
    print("DiLoCo: 2 replicas, one joined, one killed, the two left done in %.1f s" % took)


def test_diloco_outer_loop_made_again_on_a_new_communicator():
    # One rank: a failure raised inside the loop replaces the communicator (a shrink to
    # itself); the outer loop is made again there and the commit of step 6 restored into it
    # (anchor, momentum, position in the round), so the run ends as one without the failure.
    # A sharded outer state cannot follow a membership change: TorchState refuses it.
    if hvd.size() != 1 or hvd.transport() != "threads":
        pytest.skip("replaces the communicator: the one-rank session's alone")

    def run(fail_at):
        failed = []
        model = worker.make_model()
        opt = hvd.DiLoCo(worker.make_optimizer(model.parameters()), **worker.DILOCO)
        state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

        @hvd.elastic.run
        def train(state):
            while state.step < worker.DILOCO_STEPS:
                opt.zero_grad()
                worker.loss_of(model, state.step, 0).backward()
                opt.step()
                state.step += 1
                if state.step % 2 == 0:
                    state.commit()
                if state.step == fail_at and not failed:
                    failed.append(state.step)
                    raise _runtime.PeerLost(5, "SUMO_ERR_PEER_FAILURE", "a peer, lost (test)")
        train(state)
        opt.close()
        return model.state_dict()

    with pytest.raises(ValueError, match="memory_efficient"):
        hvd.elastic.TorchState(optimizer=hvd.SlowMo(torch.optim.SGD(
            worker.make_model().parameters(), lr=0.1), slowmo_frequency=2, localsgd_frequency=1))
    expect, got = run(None), run(7)
    for k, v in expect.items():
        assert torch.equal(got[k], v), k

"""One task of an srun step (tests/slurm/run.sh): sumo.torch.init() must join the step as
srun numbered it, and its collectives and the DDP hook must give the closed forms. Exits 0, or
1 with the reason on stderr."""
import os
import sys

import torch
import torch.distributed as dist

import sumo.torch as st
from sumo.torch import hooks


def fail(why):
    print("task %s: %s" % (os.environ.get("SLURM_PROCID"), why), file=sys.stderr)
    sys.exit(1)


def main():
    st.init()
    rank, size = st.rank(), st.size()
    if (rank, size) != (int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])):
        fail("rank %d of %d, but srun made it %s of %s" % (rank, size, os.environ["SLURM_PROCID"],
                                                           os.environ["SLURM_NTASKS"]))
    if st.local_rank() != int(os.environ["SLURM_LOCALID"]):
        fail("local rank %d, SLURM_LOCALID %s" % (st.local_rank(), os.environ["SLURM_LOCALID"]))
    if not dist.is_initialized() or dist.get_world_size() != size:
        fail("no process group of the step's size")

    # Sum of 1..size in every element; the average is its mean.
    t = torch.full((1000,), float(rank + 1))
    want = size * (size + 1) / 2
    got = st.allreduce(t, op=st.Sum)
    if not torch.equal(got, torch.full_like(t, want)):
        fail("sum: %r, want %r" % (got[:3].tolist(), want))
    got = st.allreduce(t, op=st.Average)
    if not torch.allclose(got, torch.full_like(t, want / size), rtol=0, atol=1e-6):
        fail("average: %r" % got[:3].tolist())
    # Adasum of equal vectors is that vector, at every level of the tree.
    g = torch.linspace(-1, 1, 513)
    got = st.allreduce(g.clone(), op=st.Adasum)
    if not torch.allclose(got, g, rtol=1e-6, atol=1e-7):
        fail("adasum of equal inputs moved by %g" % (got - g).abs().max().item())
    # Adasum of orthogonal vectors is their sum: rank r owns element r.
    e = torch.zeros(size)
    e[rank] = rank + 1.0
    got = st.allreduce(e, op=st.Adasum)
    if not torch.allclose(got, torch.arange(1.0, size + 1), rtol=1e-6, atol=0):
        fail("adasum of orthogonal inputs: %r" % got.tolist())

    # DDP with sumo's average hook on the group init() made: one SGD step equals the step on the
    # gradient of the whole batch, computed here alone by autograd.
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    start = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(4 * size, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randn(4 * size, 3, generator=torch.Generator().manual_seed(2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(hooks.HookState(), hooks.average_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    mine = slice(4 * rank, 4 * rank + 4)
    torch.nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
    opt.step()
    ref = torch.nn.Linear(8, 3)
    with torch.no_grad():
        for p, s in zip(ref.parameters(), start):
            p.copy_(s)
    torch.nn.functional.mse_loss(ref(x), y).backward()
    for p, r, s in zip(model.parameters(), ref.parameters(), start):
        if not torch.allclose(p, s - 0.1 * r.grad, rtol=1e-5, atol=1e-6):
            fail("DDP step differs from the whole batch's by %g" % (p - (s - 0.1 * r.grad)).abs().max().item())
    st.shutdown()
    print("task %d of %d: ok" % (rank, size))


if __name__ == "__main__":
    main()

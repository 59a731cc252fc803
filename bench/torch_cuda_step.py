#!/usr/bin/env python3
"""A training step of a CNN on CUDA tensors at one rank: DDP with its own allreduce (NCCL)
against DDP with sumo's Adasum hook, in one run.

    python3 bench/torch_cuda_step.py [--csv step.csv] [--steps 50] [--warmup 10] [--batch 256]

The model is bench/torch_ddp.py's conv net (about 3.3 M parameters) on random MNIST-shaped
batches; each step is forward, backward (DDP's buckets reduced through the hook) and an SGD
step, timed from the host around torch.cuda.synchronize(); the median over steps is reported.
Methods:
  ddp nccl                DistributedDataParallel's built-in reducer on a one-rank NCCL group
  sumo average, threads   the same DDP with sumo.torch.average_hook, sumo on its threads
                          transport (one rank: the kernels on the device, nothing moves)
  sumo adasum, threads    the same with sumo.torch.adasum_hook
  sumo average, nccl      sumo.torch.init(transport="nccl"): sumo's NCCL transport at one rank
  sumo adasum, nccl
At one rank no bytes cross a link: this times what each path costs around the reduction on
the GPU (the hook's worker thread, the synchronisations, the kernels), not communication.

Where a method cannot run, its row says why (the reason sumo gave) and the script still
succeeds.
"""
import argparse
import csv
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def convnet():
    # bench/torch_ddp.py's: 1x28x28 -> 32x28x28 -> 64x14x14 -> 256 -> 10, about 3.3 M parameters
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 14 * 14, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10))


def run(method, args):
    torch.manual_seed(0)
    model = convnet().cuda()
    ddp = DDP(model, device_ids=[0])
    if method.startswith("sumo"):
        import sumo.torch as st
        hook, transport = method[len("sumo "):].split(", ")
        st.shutdown()  # the previous row's communicator
        st.init(process_group=False, transport=transport)
        ddp.register_comm_hook(st.HookState(), getattr(st, hook + "_hook"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(args.batch, 1, 28, 28, device="cuda", generator=gen)
    y = torch.randint(0, 10, (args.batch,), device="cuda", generator=gen)
    times = []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv")
    ap.add_argument("--table", help="markdown file to append the table to")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_cuda_step: skipped: no CUDA device for torch")
        return 0
    store = tempfile.NamedTemporaryFile(prefix="sumo-step-", delete=False)
    dist.init_process_group("nccl", init_method="file://" + store.name, rank=0, world_size=1)
    rows = []
    for method in ("ddp nccl", "sumo average, threads", "sumo adasum, threads",
                   "sumo average, nccl", "sumo adasum, nccl"):
        try:
            s = run(method, args)
            rows.append((method, "%.3f" % (s * 1e3), "%.0f" % (args.batch / s), "ok"))
        except Exception as e:  # the binding's refusal, reported as the row's status
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            rows.append((method, "-", "-", "not run: " + reason))
    dist.destroy_process_group()
    os.unlink(store.name)
    device = torch.cuda.get_device_name(0)
    print("%-22s %10s %10s  %s" % ("method", "step ms", "samples/s", "status"))
    for r in rows:
        print("%-22s %10s %10s  %s" % r)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["method", "step_ms", "samples_per_s", "status"])
            w.writerows(rows)
    if args.table:
        with open(args.table, "a") as f:
            f.write("## A training step on CUDA tensors, one rank (%s)\n\n" % device)
            f.write("bench/torch_ddp.py's conv net, batch %d, median of %d steps after %d; DDP's "
                    "own NCCL allreduce against sumo.torch's average and Adasum hooks on CUDA "
                    "buckets (threads and NCCL transports, one rank).\n\n"
                    % (args.batch, args.steps, args.warmup))
            f.write("| method | step ms | samples/s | status |\n|---|---|---|---|\n")
            for r in rows:
                f.write("| %s | %s | %s | %s |\n" % r)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

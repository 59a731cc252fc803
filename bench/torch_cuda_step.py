#!/usr/bin/env python3
"""A training step of a CNN on CUDA tensors: DDP with its own allreduce against DDP with
sumo's average and Adasum hooks, in one run.

    python3 bench/torch_cuda_step.py [--csv step.csv] [--steps 50] [--warmup 10] [--batch 256]
    torchrun --standalone --nproc_per_node N bench/torch_cuda_step.py [same options]

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

Under torchrun (N ranks, each on cuda:LOCAL_RANK % the devices there are, so N ranks may
share one GPU) the methods are:
  ddp gloo                DDP's reducer on the gloo group torchrun's environment makes (the
                          only DDP backend that runs with several ranks on one GPU: NCCL
                          refuses two ranks on one device)
  sumo average, shm       sumo.torch.init() on that group: sumo's shared-memory transport,
  sumo adasum, shm        whose kernels read the peers' CUDA buckets through CUDA IPC
Each rank times its own steps; rank 0 reports the slowest rank's median per method (a step
ends when the last rank's does) and writes the table.

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


def run(method, args, device):
    torch.manual_seed(0)
    model = convnet().to(device)
    ddp = DDP(model, device_ids=[device.index])
    if method.startswith("sumo"):
        import sumo.torch as st
        hook, transport = method[len("sumo "):].split(", ")
        st.shutdown()  # the previous row's communicator
        if transport == "shm":
            st.init()  # the default group's ranks, over sumo's shared memory
        else:
            st.init(process_group=False, transport=transport)
        ddp.register_comm_hook(st.HookState(), getattr(st, hook + "_hook"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(args.batch, 1, 28, 28, device=device, generator=gen)
    y = torch.randint(0, 10, (args.batch,), device=device, generator=gen)
    times = []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize(device)
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
    world = int(os.environ.get("WORLD_SIZE", "1"))
    store = None
    if world > 1:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("gloo")
        methods = ("ddp gloo", "sumo average, shm", "sumo adasum, shm")
    else:
        device = torch.device("cuda", 0)
        store = tempfile.NamedTemporaryFile(prefix="sumo-step-", delete=False)
        dist.init_process_group("nccl", init_method="file://" + store.name, rank=0, world_size=1)
        methods = ("ddp nccl", "sumo average, threads", "sumo adasum, threads",
                   "sumo average, nccl", "sumo adasum, nccl")
    rows = []
    for method in methods:
        try:
            s = run(method, args, device)
            status = "ok"
        except Exception as e:  # the binding's refusal, reported as the row's status
            s = float("nan")
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            status = "not run: " + reason
        if world > 1:
            # A step of the job is its slowest rank's; a row runs only where every rank ran it.
            t = torch.tensor([s, 0.0 if status == "ok" else 1.0], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            s = t[0].item()
            if t[1].item() and status == "ok":
                status = "not run: another rank failed it"
        if status == "ok":
            rows.append((method, "%.3f" % (s * 1e3), "%.0f" % (world * args.batch / s), status))
        else:
            rows.append((method, "-", "-", status))
    rank = dist.get_rank()
    dist.destroy_process_group()
    if store is not None:
        os.unlink(store.name)
    if rank != 0:
        return 0
    base = rows[0][1]
    ratio = ["%.2f" % (float(r[1]) / float(base)) if r[1] != "-" and base != "-" else "-" for r in rows]
    device_name = torch.cuda.get_device_name(device)
    print("%-22s %10s %10s %8s  %s" % ("method", "step ms", "samples/s", "ratio", "status"))
    for r, q in zip(rows, ratio):
        print("%-22s %10s %10s %8s  %s" % (r[0], r[1], r[2], q, r[3]))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["ranks", "method", "step_ms", "samples_per_s", "ratio", "status"])
            w.writerows((world,) + r[:3] + (q, r[3]) for r, q in zip(rows, ratio))
    if args.table:
        with open(args.table, "a") as f:
            if world > 1:
                f.write("## A training step on CUDA tensors, %d ranks on %s (%s)\n\n"
                        % (world, "one GPU" if torch.cuda.device_count() == 1 else
                           "%d GPUs" % torch.cuda.device_count(), device_name))
                f.write("bench/torch_ddp.py's conv net, batch %d a rank, median of %d steps after "
                        "%d, the slowest rank's; DDP with gloo on the CUDA model against "
                        "sumo.torch's average and Adasum hooks over sumo's shared memory and CUDA "
                        "IPC; ratio: to DDP gloo's step.\n\n" % (args.batch, args.steps, args.warmup))
            else:
                f.write("## A training step on CUDA tensors, one rank (%s)\n\n" % device_name)
                f.write("bench/torch_ddp.py's conv net, batch %d, median of %d steps after %d; "
                        "DDP's own NCCL allreduce against sumo.torch's average and Adasum hooks "
                        "on CUDA buckets (threads and NCCL transports, one rank); ratio: to DDP "
                        "NCCL's step.\n\n" % (args.batch, args.steps, args.warmup))
            f.write("| method | step ms | samples/s | ratio | status |\n|---|---|---|---|---|\n")
            for r, q in zip(rows, ratio):
                f.write("| %s | %s | %s | %s | %s |\n" % (r[0], r[1], r[2], q, r[3]))
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Fashion-MNIST in PyTorch with sumo: the MLP of `sumo train` (784-128-10, ReLU), the same IDX
files, the same table columns.

    mpirun -np 2 --oversubscribe /usr/bin/python3 examples/torch_fashion_mnist.py --reduce avg,adasum
    /usr/bin/python3 examples/torch_fashion_mnist.py            # one process

Methods (--reduce, comma-separated to compare): avg, adasum, acga (DDP communication hooks),
adasum-delta (sumo.torch.DistributedOptimizer, Horovod's Adasum mode), slowmo, localsgd, bmuf
(the SlowMo wrapper). Each rank trains on its own slice of every global batch.
"""
import argparse
import gzip
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import sumo  # noqa: E402
import sumo.torch as st  # noqa: E402

# Debian's dataset-fashion-mnist, as `sumo train --data` defaults to.
DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file, gzipped or not (the format: magic with the dtype and rank, then sizes)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError("%s: not an unsigned-byte IDX file" % path)
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    t = torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8)
    return t.view(*dims)


def find(folder, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError("%s: no %s[.gz] (apt-get install dataset-fashion-mnist, or --data)"
                            % (folder, stem))


def load(folder, split, limit):
    x = read_idx(find(folder, "%s-images-idx3-ubyte" % split)).float().div_(255.0).flatten(1)
    y = read_idx(find(folder, "%s-labels-idx1-ubyte" % split)).long()
    if limit:
        x, y = x[:limit], y[:limit]
    return x, y


def mlp(hidden):
    return torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def build(method, model, args):
    """(module to call, optimizer, hook state or None) for a method."""
    base = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if method in ("avg", "adasum", "acga"):
        ddp = DDP(model)
        state = st.HookState(acga_beta=args.acga_beta)
        hook = {"avg": st.average_hook, "adasum": st.adasum_hook, "acga": st.acga_hook}[method]
        ddp.register_comm_hook(state, hook)
        return ddp, base, state
    if method == "adasum-delta":
        return model, st.DistributedOptimizer(base, model.named_parameters(), op=sumo.Adasum), None
    if method == "slowmo":
        return model, st.SlowMo(base, slowmo_frequency=args.tau, slowmo_momentum=0.5,
                                localsgd_frequency=args.inner), None
    if method == "localsgd":
        return model, st.LocalSGD(base, period=args.tau), None
    if method == "bmuf":
        return model, st.BMUF(base, period=args.tau), None
    raise SystemExit("unknown method %r (avg, adasum, adasum-delta, acga, slowmo, localsgd, bmuf)"
                     % method)


def train(method, data, args):
    xtr, ytr, xte, yte = data
    P, r, B = st.size(), st.rank(), args.batch
    torch.manual_seed(args.seed)
    model = mlp(args.hidden)
    st.broadcast_parameters(model.state_dict(), root_rank=0)
    module, opt, state = build(method, model, args)
    steps_per_epoch = xtr.shape[0] // (P * B)
    g = torch.Generator().manual_seed(args.seed)
    st.take_timeline()
    step, best, final, to_target, comm_s, comm_bytes, rounds = 0, 0.0, 0.0, None, 0.0, 0, 0
    t_start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(xtr.shape[0], generator=g)  # the same on every rank
        for k in range(steps_per_epoch):
            idx = order[(k * P + r) * B:(k * P + r + 1) * B]
            opt.zero_grad()
            F.cross_entropy(module(xtr[idx]), ytr[idx]).backward()
            opt.step()
            step += 1
            tl = st.take_timeline()
            comm_s += st.union_seconds(tl)
            comm_bytes += sum(b for _, _, b in tl)
            rounds += len(tl)
        final = accuracy(model, xte, yte)
        best = max(best, final)
        if to_target is None and final >= args.target:
            to_target = epoch + 1
    wall = time.perf_counter() - t_start
    if state is not None:
        state.close()
    return dict(method=method, lr=args.lr, final=final, best=best, to_target=to_target,
                steps=step, mib=comm_bytes / 2.0 ** 20, rounds=rounds, share=comm_s / wall,
                wall=wall)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reduce", default="avg")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64, help="per-rank batch")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--tau", type=int, default=12, help="SlowMo / Local SGD / BMUF period")
    ap.add_argument("--inner", type=int, default=3, help="SlowMo inner averaging period")
    ap.add_argument("--acga-beta", type=float, default=0.0)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--test-limit", type=int, default=0)
    args = ap.parse_args()
    st.init()
    torch.set_num_threads(1)  # one core per rank: the ranks share the machine
    xtr, ytr = load(args.data, "train", args.train_limit)
    xte, yte = load(args.data, "t10k", args.test_limit)
    rows = [train(m, (xtr, ytr, xte, yte), args) for m in args.reduce.split(",")]
    if st.rank() != 0:
        return
    P = st.size()
    print("\nFashion-MNIST (PyTorch + sumo.torch), mlp, %d workers x batch %d = total batch %d, "
          "%d epoch(s), sgd, seed %d" % (P, args.batch, P * args.batch, args.epochs, args.seed))
    print("target: %.2f%% test accuracy (--target)" % (100 * args.target))
    print("%-18s %8s %9s %9s %9s %7s %9s %8s %10s %8s" % ("method", "peak lr", "final acc",
          "best acc", "to target", "steps", "comm MiB", "rounds", "agg share", "wall s"))
    for s in rows:
        target = "%.2f ep" % s["to_target"] if s["to_target"] else "-"
        print("%-18s %8.4f %8.2f%% %8.2f%% %9s %7d %9.1f %8d %9.1f%% %8.1f" % (
            s["method"], s["lr"], 100 * s["final"], 100 * s["best"], target, s["steps"],
            s["mib"], s["rounds"], 100 * s["share"], s["wall"]))
    print("columns: as `sumo train`; agg share here is the time inside sumo's collectives "
          "(overlapping buckets counted once) / wall time")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A Horovod elastic PyTorch script on sumo: written as a Horovod user writes one (state,
commit, reset callbacks, @hvd.elastic.run), with `import horovod.torch as hvd` replaced by
`import sumo.torch as hvd` and nothing else changed. A classifier on synthetic data; each
step takes one global batch, cut among the processes there are, so the data position is the
same whatever the membership.

    make
    export PYTHONPATH=$PWD/python
    /usr/bin/python3 -m sumo.launch --nproc 3 examples/horovod_elastic.py \
        --kill-rank 1 --kill-batch 5

The launcher starts the three processes each on its own, meeting through a store in a file;
process 1 kills itself (SIGKILL) at batch 5 of the first epoch, and the other two go back to
their last commit, go on as two and finish. Without --kill-rank nothing is lost; `kill -9` one
of the processes by hand does the same. With the store named (--store FILE given to the
launch), a process started later with
`/usr/bin/python3 -m sumo.launch --store FILE --join examples/horovod_elastic.py`
joins at the next commit.
"""
import argparse
import hashlib
import os
import signal

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import sumo.torch as hvd

parser = argparse.ArgumentParser(description="Horovod elastic, synthetic data")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batches-per-epoch", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=96, help="the global batch")
parser.add_argument("--batches-per-commit", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--kill-rank", type=int, default=-1,
                    help="for demonstration: the process of this rank kills itself")
parser.add_argument("--kill-batch", type=int, default=5,
                    help="at this batch of the first epoch")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def global_batch(epoch, batch, size):
    """The epoch's batch of the synthetic data set: the same on every process."""
    g = torch.Generator().manual_seed(1000003 * epoch + batch)
    x = torch.randn(size, 32, generator=g)
    y = (x[:, :10].argmax(dim=1) + (x[:, 10] > 1).long()) % 10
    return x, y


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(bytes(p.detach().contiguous().view(-1).view(torch.uint8).tolist()))
    return h.hexdigest()[:16]


def main():
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    started_as = (hvd.rank(), hvd.size())

    def on_state_reset():
        if hvd.rank() == 0:
            print("reset: now %d processes, going on from epoch %d batch %d"
                  % (hvd.size(), state.epoch, state.batch), flush=True)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, args.epochs):
            model.train()
            for state.batch in range(state.batch, args.batches_per_epoch):
                if started_as[0] == args.kill_rank and hvd.size() == started_as[1] and \
                        state.epoch == 0 and state.batch == args.kill_batch:
                    os.kill(os.getpid(), signal.SIGKILL)
                x, y = global_batch(state.epoch, state.batch, args.batch_size)
                mine = slice(hvd.rank(), None, hvd.size())  # this process's part of the batch
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x[mine]), y[mine])
                loss.backward()
                optimizer.step()
                if (state.batch + 1) % args.batches_per_commit == 0:
                    state.batch += 1
                    state.commit()
            loss = hvd.allreduce(loss.detach(), name="loss")
            if hvd.rank() == 0:
                print("epoch %d: loss %.4f on %d processes" % (state.epoch, loss.item(),
                                                               hvd.size()), flush=True)
            state.batch = 0
            state.commit()

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)
    # Every process ends with the same parameters, bit for bit: their digest, to compare.
    print("process %d (started as rank %d of %d): done as rank %d of %d, parameters %s"
          % (os.getpid(), started_as[0], started_as[1], hvd.rank(), hvd.size(),
             digest(model)), flush=True)


if __name__ == "__main__":
    main()

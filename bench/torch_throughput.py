#!/usr/bin/python3
"""PyTorch's training throughput on the models of src/train/model.h, one thread.

Samples per second of forward + backward + a plain SGD update on Fashion-MNIST, for the MLP
(784-128-10) and the CNN (conv 8@5x5, pool, conv 16@5x5, pool, 256-64-10) at batch 64 and
1024: the peer that bench/model_throughput.c is compared with. Same data (the Debian files,
pixels / 255), same loop shape (consecutive slices, best of three timed runs).

Run: /usr/bin/python3 bench/torch_throughput.py [seconds per row] [data dir]
(Debian's python3-torch; it is importable only under /usr/bin/python3.)
"""
import os

# One thread everywhere: intra-op, OpenMP and the BLAS torch was linked with.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import gzip  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndims = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims])
    t = torch.frombuffer(bytearray(data[4 + 4 * ndims:]), dtype=torch.uint8)
    return t.reshape(dims)


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 8, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 10))


def run(model, opt, x, y, batch, steps, pos):
    n = x.shape[0]
    t0 = time.perf_counter()
    loss = None
    for _ in range(steps):
        if pos + batch > n:
            pos = 0
        xb, yb = x[pos:pos + batch], y[pos:pos + batch]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        pos += batch
    return time.perf_counter() - t0, pos, float(loss)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    d = sys.argv[2] if len(sys.argv) > 2 else "/usr/share/datasets/fashion-mnist"
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x = load_idx(os.path.join(d, "train-images-idx3-ubyte.gz")).float().div(255).unsqueeze(1)
    y = load_idx(os.path.join(d, "train-labels-idx1-ubyte.gz")).long()
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"mkldnn {torch.backends.mkldnn.is_available()}")
    print(f"{'model':<6} {'batch':>6} {'samples/s':>12} {'ms/step':>10}")
    for name, make in (("mlp", mlp), ("cnn", cnn)):
        for batch in (64, 1024):
            model = make()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            dt, pos, _ = run(model, opt, x, y, batch, 3, 0)
            steps = int(seconds / (dt / 3)) + 1
            best = min(run(model, opt, x, y, batch, steps, pos)[0] for _ in range(3))
            print(f"{name:<6} {batch:>6} {steps * batch / best:>12.0f} {1e3 * best / steps:>10.3f}",
                  flush=True)


if __name__ == "__main__":
    main()

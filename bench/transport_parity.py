#!/usr/bin/env python3
"""Do sumo's paths into PyTorch give the same bits? Each rank reduces the same deterministic
inputs through sumo.torch and writes what it got; `--compare` reads every run's files and
says, per operation and rank count, whether two paths agree bit for bit and, where not, by
how much (how many elements differ, and the largest difference relative to the largest
magnitude: 6e-8 is one rounding of fp32).

    scripts/transport-parity.sh           # runs P = 1..5 over mpi, shm and group, compares

One run (the script above launches these):
    mpirun -np P python bench/transport_parity.py --transport mpi --out DIR
    python -m torch.distributed.run --standalone --nproc_per_node P \\
        bench/transport_parity.py --transport shm --out DIR
    ... --transport group ...
    python bench/transport_parity.py --compare DIR

Operations: the sum and the average of 3,000,000 fp32 elements (chunks of the staging areas
and of the wire both cross it), Adasum per tensor over a layout of 9 tensors (3,000,000 in
all), and ACGA (the hook: one coefficient per rank).
"""
import argparse
import ctypes
import glob
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402

LAYOUT = [1, 17, 4096, 65536, 131071, 300000, 1000000, 999000, 500311]
N = sum(LAYOUT)
OPS = ("sum", "average", "adasum", "acga")


def data(rank):
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randn(N, generator=g) * (1 + 0.1 * rank)


def run(transport, out):
    import sumo
    import sumo.torch as st
    from sumo.torch import hooks
    st.init(transport=transport)
    assert st.transport() == transport, (st.transport(), transport)
    P, r = st.size(), st.rank()

    class Bucket:
        def __init__(self, buf):
            self._b = buf

        def buffer(self):
            return self._b

        def gradients(self):
            return list(torch.split(self._b, LAYOUT))

        def index(self):
            return 0

    results = {}
    for op in OPS:
        x = data(r)
        if op == "sum":
            st.allreduce_(x, op=sumo.Sum)
        elif op == "average":
            st.allreduce_(x, op=sumo.Average)
        else:
            state = st.HookState()
            hook = hooks.adasum_hook if op == "adasum" else hooks.acga_hook
            x = hook(state, Bucket(x)).wait().clone()
            state.close()
        results[op] = x
    os.makedirs(out, exist_ok=True)
    for op, x in results.items():
        path = os.path.join(out, "%s.%d.%s.%d" % (transport, P, op, r))
        with open(path + ".tmp", "wb") as f:
            f.write(_raw(x))
        os.replace(path + ".tmp", path)


def _raw(x):
    x = x.contiguous()
    return ctypes.string_at(x.data_ptr(), x.numel() * x.element_size())


def _load(path):
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.float32)


def compare(folder):
    runs = {}
    for path in glob.glob(os.path.join(folder, "*.*.*.*")):
        transport, P, op, rank = os.path.basename(path).split(".")
        runs.setdefault((int(P), op), {}).setdefault(transport, {})[int(rank)] = _load(path)
    print("| P | op | ranks agree | shm vs mpi | group vs mpi | group vs shm |")
    print("|---|---|---|---|---|---|")
    for (P, op) in sorted(runs):
        by = runs[(P, op)]
        agree = all(all(torch.equal(t[0], t[k]) for k in t) for t in by.values())

        def diff(a, b):
            if a not in by or b not in by:
                return "-"
            x, y = by[a][0], by[b][0]
            if torch.equal(x, y):
                return "same bits"
            rel = float((x - y).abs().max() / x.abs().max())
            n = int((x != y).sum())
            return "%d of %d differ, by <= %.1e of the largest" % (n, x.numel(), rel)

        print("| %d | %s | %s | %s | %s | %s |" % (P, op, "yes" if agree else "NO",
                                                   diff("shm", "mpi"), diff("group", "mpi"),
                                                   diff("group", "shm")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", choices=("mpi", "shm", "group", "threads"))
    ap.add_argument("--out")
    ap.add_argument("--compare")
    a = ap.parse_args()
    if a.compare:
        compare(a.compare)
    else:
        run(a.transport, a.out)


if __name__ == "__main__":
    main()

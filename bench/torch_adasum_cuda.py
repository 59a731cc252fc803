#!/usr/bin/env python3
"""The Adasum combine of P CUDA tensors as a torch user would compose it, timed on the GPU that
cuda_adasum (bench/cuda_adasum.cu) measured in the same run; joins both into one table.

    python3 bench/torch_adasum_cuda.py --csv torch.csv [--fused cuda_adasum.csv --table out.md]
                                       [--sizes 1,4,16,64,256,1024] [--ranks 2,4,8] [--quick]

Inputs: P fp32 tensors of `size` MiB each, a shared direction plus each rank's noise (as in
cuda_adasum). Compositions (the Adasum tree of sumo.h; dot products in fp32, as torch.dot
computes them, where sumo accumulates in fp64):
  tree    what Horovod's Adasum and a hand-written version do: the tree pairwise, each
          combine torch.dot(a, b), torch.dot(a, a), torch.dot(b, b), then ca * a + cb * b
          (the dots, norms and axpy of the issue);
  dots    the Gram matrix from torch.dot of every pair, the tree's weights from it on the host
          (as sumo does), then out = w0 x0, out.add_(xk, alpha=wk);
  matmul  X = torch.stack(inputs), G = X @ X.T, the weights on the host, out = w @ X.
Each is timed with CUDA events, median of repetitions after warm-up. The table divides
sumo's fused time (cuda_adasum's `fused` rows, host-synchronous) by each composition's, and
reports sumo's GB/s against the device-to-device copy cuda_adasum measured.
"""
import argparse
import csv
import os
import statistics
import sys

import torch


def adasum_weights(G, P):
    """The tree's coefficients of each input (sumo.h): pairs first when P is not a power of
    two, then the balanced tree, lower rank left; a coefficient is 1 below 2^-511."""
    def dot(u, v):
        return sum(u[a] * G[a][b] * v[b] for a in range(P) for b in range(P))

    def combine(u, v):
        d, nu, nv = dot(u, v), dot(u, u), dot(v, v)
        cu = 1.0 if nu < 2.0 ** -511 else 1.0 - d / (2 * nu)
        cv = 1.0 if nv < 2.0 ** -511 else 1.0 - d / (2 * nv)
        return [cu * u[k] + cv * v[k] for k in range(P)]

    c = [[1.0 if k == i else 0.0 for k in range(P)] for i in range(P)]
    g2 = 1
    while g2 * 2 <= P:
        g2 *= 2
    rem = P - g2
    t = [combine(c[2 * i], c[2 * i + 1]) if i < rem else c[i + rem] for i in range(g2)]
    step = 1
    while step < g2:
        for i in range(0, g2 - step, 2 * step):
            t[i] = combine(t[i], t[i + step])
        step *= 2
    return t[0]


def combine_pair(a, b):
    d, na, nb = torch.dot(a, b), torch.dot(a, a), torch.dot(b, b)
    return a * (1 - d / (2 * na)) + b * (1 - d / (2 * nb))


def tree(xs):
    P = len(xs)
    g2 = 1
    while g2 * 2 <= P:
        g2 *= 2
    rem = P - g2
    t = [combine_pair(xs[2 * i], xs[2 * i + 1]) if i < rem else xs[i + rem] for i in range(g2)]
    step = 1
    while step < g2:
        for i in range(0, g2 - step, 2 * step):
            t[i] = combine_pair(t[i], t[i + step])
        step *= 2
    return t[0]


def dots(xs):
    P = len(xs)
    g = [[None] * P for _ in range(P)]
    for a in range(P):
        for b in range(a, P):
            g[a][b] = g[b][a] = torch.dot(xs[a], xs[b])
    G = torch.stack([torch.stack(row) for row in g]).double().cpu().tolist()
    w = adasum_weights(G, P)
    out = xs[0] * w[0]
    for k in range(1, P):
        out.add_(xs[k], alpha=w[k])
    return out


def matmul(xs):
    X = torch.stack(xs)
    G = (X @ X.T).double().cpu().tolist()
    w = adasum_weights(G, len(xs))
    return torch.tensor(w, dtype=X.dtype, device=X.device) @ X


VARIANTS = {"tree": tree, "dots": dots, "matmul": matmul}


def time_it(fn, xs, budget_s):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):
        fn(xs)
    torch.cuda.synchronize()
    times, spent = [], 0.0
    while len(times) < 5 or (spent < budget_s and len(times) < 50):
        start.record()
        fn(xs)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        times.append(ms)
        spent += ms * 1e-3
    return statistics.median(times), len(times)


def inputs(P, n):
    gen = torch.Generator(device="cuda").manual_seed(12345)
    common = torch.rand(n, device="cuda", generator=gen) * 2 - 1
    xs = []
    for r in range(P):
        g = torch.Generator(device="cuda").manual_seed(1000 + r)
        xs.append(common + 0.5 * (torch.rand(n, device="cuda", generator=g) * 2 - 1))
    del common
    return xs


def read_fused(path):
    rows, meta = {}, {}
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        if line.startswith("#"):
            for kv in line[1:].split():
                k, _, v = kv.partition("=")
                meta[k] = v
    for row in csv.DictReader(l for l in lines if not l.startswith("#")):
        rows[(row["kind"], int(row["P"]), int(row["size_mib"]))] = row
    return rows, meta


def write_table(path, fused, meta, torch_rows, device):
    out = []
    out.append("## Fused Adasum combine vs torch compositions (%s)\n" % device)
    out.append("Device-to-device copy, measured in the same run: %s GB/s (bytes read + written). "
               "sumo: the CUDA table's gram_partials + host weights + weighted_sum, each entry "
               "waited for; bytes = (2P + 1) x size. torch: CUDA events. Speed-up = torch time / "
               "sumo time. Goal (issue 24): >= 2.2x the composition at 64 MiB and above, >= 85%% "
               "of the copy bandwidth.\n" % meta.get("copy_GBps", "?"))
    out.append("| P | MiB/input | sumo ms | sumo GB/s | % copy BW | torch tree ms | dots ms | "
               "matmul ms | x tree | x best torch | goal |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for (kind, P, mib), row in sorted(fused.items()):
        if kind != "fused":
            continue
        t = {v: torch_rows.get((v, P, mib)) for v in VARIANTS}
        sumo_ms = float(row["median_ms"])
        best = min((x for x in t.values() if x), default=None)
        x_tree = t["tree"] / sumo_ms if t["tree"] else float("nan")
        x_best = best / sumo_ms if best else float("nan")
        pct = float(row["pct_copy_bw"])
        goal = "" if mib < 64 else ("met" if x_tree >= 2.2 and pct >= 85 else "missed")
        fmt = lambda v: "%.3f" % v if v else "-"
        out.append("| %d | %d | %.3f | %s | %.1f | %s | %s | %s | %.2f | %.2f | %s |" % (
            P, mib, sumo_ms, row["GBps"], pct, fmt(t["tree"]), fmt(t["dots"]), fmt(t["matmul"]),
            x_tree, x_best, goal))
    threads = [(P, mib, row) for (kind, P, mib), row in sorted(fused.items()) if kind == "threads"]
    if threads:
        out.append("\nsumo_cuda_allreduce(SUMO_OP_ADASUM) on the threads transport, P ranks sharing "
                   "the GPU, a stream each (bytes: P inputs read twice, P outputs written):\n")
        out.append("| P | MiB/rank | ms | GB/s | % copy BW |")
        out.append("|---|---|---|---|---|")
        for P, mib, row in threads:
            out.append("| %d | %d | %s | %s | %s |" % (P, mib, row["median_ms"], row["GBps"],
                                                      row["pct_copy_bw"]))
    with open(path, "a") as f:
        f.write("\n".join(out) + "\n\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--fused")
    ap.add_argument("--table")
    ap.add_argument("--sizes", default="1,4,16,64,256,1024")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_adasum_cuda: skipped: no CUDA device for torch")
        return 0
    sizes = [1, 16, 64] if args.quick else [int(s) for s in args.sizes.split(",")]
    ranks = [2, 4] if args.quick else [int(s) for s in args.ranks.split(",")]
    device = torch.cuda.get_device_name(0)
    rows = {}
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["variant", "P", "size_mib", "median_ms", "reps"])
        print("%-7s %3s %8s %10s" % ("variant", "P", "MiB", "median ms"))
        for P in ranks:
            for mib in sizes:
                n = mib << 18
                xs = inputs(P, n)
                ref = tree(xs)
                for name, fn in VARIANTS.items():
                    # stack + matmul holds a second copy of every input
                    need = (2 * P + 2) * n * 4 if name == "matmul" else (P + 3) * n * 4
                    free, _ = torch.cuda.mem_get_info()
                    if need > free * 0.9:
                        print("%-7s %3d %8d %10s (needs %.1f GiB)" % (name, P, mib, "-", need / 2**30))
                        continue
                    got = fn(xs)
                    err = (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()
                    if not err < 1e-3:
                        print("torch_adasum_cuda: %s disagrees with tree at P %d %d MiB: %.3g"
                              % (name, P, mib, err), file=sys.stderr)
                        return 1
                    del got
                    ms, reps = time_it(fn, xs, 0.3 if args.quick else 1.0)
                    rows[(name, P, mib)] = ms
                    w.writerow([name, P, mib, "%.4f" % ms, reps])
                    print("%-7s %3d %8d %10.3f" % (name, P, mib, ms))
                del xs, ref
                torch.cuda.empty_cache()
    if args.fused and args.table:
        if not os.path.exists(args.fused):
            print("torch_adasum_cuda: no %s (cuda_adasum did not run): no table" % args.fused,
                  file=sys.stderr)
            return 1
        fused, meta = read_fused(args.fused)
        write_table(args.table, fused, meta, rows, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())

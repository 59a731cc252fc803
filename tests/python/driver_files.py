"""What the parity tests against the binding's C drivers (the *_driver.c files here) share: the
inputs they hand a driver are raw float32 files, as driver_io.h reads them."""
import ctypes
import os
import subprocess

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def floats_to_file(t, path):
    t = t.detach().contiguous().to(torch.float32)
    with open(path, "wb") as f:
        f.write(ctypes.string_at(t.data_ptr(), t.numel() * 4))


def run_outer_driver(folder, sizes, fragment_of, options, steps, start, deltas):
    """Runs build/tests/diloco_driver (the C outer loop) over len(deltas) ranks on the same
    start and per-rank deltas, and returns its output: every rank's final parameters, rank
    after rank, as raw float32 bytes. fragment_of: a list per tensor, or None for the library's
    split; options: the driver's 14 numbers (diloco_driver.c says which)."""
    floats_to_file(start, os.path.join(folder, "start"))
    for r, d in enumerate(deltas):
        floats_to_file(d, os.path.join(folder, "d.%d" % r))
    out = os.path.join(folder, "c.out")
    subprocess.run([os.path.join(ROOT, "build", "tests", "diloco_driver"), out,
                    ",".join(map(str, sizes)),
                    "-" if fragment_of is None else ",".join(map(str, fragment_of)),
                    ",".join(map(repr, options)), str(steps), os.path.join(folder, "start")] +
                   [os.path.join(folder, "d.%d" % r) for r in range(len(deltas))], check=True)
    with open(out, "rb") as f:
        return f.read()

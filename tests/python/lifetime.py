"""Exits that must not hang or kill, run by tests/python/run.sh under a launcher:

  lifetime.py linger SECONDS FILE   rank 0 keeps working (a checkpoint being written) for
                                    SECONDS after the last collective, longer than the
                                    deadline; the others exit first. Both must end cleanly and
                                    rank 0's work must finish (nobody takes it for dead).
  lifetime.py ddp-mismatch          the ranks' models differ in size: DDP's constructor
                                    refuses them; every rank must end with an error, soon.
"""
import sys
import time

import torch

import sumo
import sumo.torch as st


def linger(seconds, path):
    st.init()
    x = torch.ones(8)
    st.allreduce_(x, op=sumo.Sum)
    assert x[0].item() == st.size()
    if st.rank() == 0:
        time.sleep(seconds)
        with open(path, "w") as f:
            f.write("saved after %.0f s\n" % seconds)
    print("rank %d done" % st.rank(), flush=True)


def ddp_mismatch():
    st.init()
    model = torch.nn.Linear(4 + st.rank(), 2)
    start = time.monotonic()
    previous = sys.excepthook

    def report(kind, value, tb):
        # What a user sees; the exception itself goes on to sumo's hook and Python's.
        print("rank %d raised %s after %.1f s: %s" % (st.rank(), kind.__name__,
                                                       time.monotonic() - start, str(value)[:120]),
              flush=True)
        previous(kind, value, tb)

    sys.excepthook = report
    # Uncaught, as in a training script: the process must still end, and so must its peers.
    torch.nn.parallel.DistributedDataParallel(model)
    print("rank %d built DDP over mismatched models" % st.rank(), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "linger":
        linger(float(sys.argv[2]), sys.argv[3])
    else:
        ddp_mismatch()

"""A rank killed mid-training: the others must raise (not hang) within the deadline.

    mpirun -np 3 python3 kill_rank.py hook|optimizer
The last rank SIGKILLs itself at step 3; every other rank prints one line
'rank R raised SUMO_ERR_... after S s' and ends the job (sumo aborts it: MPI_Finalize would
wait for the dead process)."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import sumo  # noqa: E402
import sumo.torch as st  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else "hook"
st.init()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
if mode == "hook":
    ddp = DDP(model)
    ddp.register_comm_hook(st.HookState(), st.average_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
else:
    ddp = model
    opt = st.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                  model.named_parameters(), op=sumo.Adasum)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
for step in range(1000):
    if step == 3 and st.rank() == st.size() - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    except Exception as e:  # SumoError directly, or wrapped by DDP's reducer
        name = getattr(e, "name", None) or next(
            (w for w in str(e).split() if w.startswith("SUMO_ERR_")), type(e).__name__)
        print("rank %d raised %s after %.1f s at step %d" % (st.rank(), name.rstrip(":"),
                                                            time.monotonic() - t0, step), flush=True)
        sys.exit(1)
print("rank %d: no error after 1000 steps" % st.rank(), flush=True)

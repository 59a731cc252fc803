"""pytest set-up for sumo.torch: one communicator per process for the whole session (MPI
under mpirun, the process group under torchrun, else one rank; SUMO_TEST_TRANSPORT=group or
shm under mpirun joins a group made from MPI's environment instead; SUMO_TEST_TRANSPORT=nccl
under torchrun: sumo's NCCL transport, one GPU per rank, LOCAL_RANK's), a short deadline so
a broken test fails instead of hanging, and a clean skip when PyTorch is not installed."""
import os
import sys

import pytest

# The checkout's binding, unless SUMO_TEST_INSTALLED=1 (tests/python/wheel.sh): then the
# package installed from the wheel, and the checkout's must not be what is imported.
_CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
if os.environ.get("SUMO_TEST_INSTALLED", "0") in ("", "0"):
    sys.path.insert(0, os.path.join(_CHECKOUT, "python"))
os.environ.setdefault("SUMO_TIMEOUT", "60")

try:
    import torch  # noqa: F401
except ImportError:
    torch = None

collect_ignore_glob = []
if torch is None:
    # Every test module imports torch; say why they do not run instead of erroring.
    collect_ignore_glob = ["test_*.py"]

    def pytest_sessionstart(session):
        print("sumo.torch tests: skipped (PyTorch is not installed: apt-get install python3-torch)")


@pytest.fixture(scope="session", autouse=True)
def sumo_comm():
    if torch is None:
        yield None
        return
    import sumo.torch as st
    if os.environ.get("SUMO_TEST_INSTALLED", "0") not in ("", "0"):
        here = os.path.realpath(st.__file__)
        if here.startswith(os.path.join(_CHECKOUT, "python") + os.sep):
            pytest.exit("SUMO_TEST_INSTALLED: sumo.torch came from the checkout (%s)" % here, 2)
    transport = os.environ.get("SUMO_TEST_TRANSPORT") or None
    if transport in ("group", "shm") and "OMPI_COMM_WORLD_RANK" in os.environ:
        # The process-group path under mpirun (Debian's torch 1.13 ships a torchrun that
        # cannot start): the default group from MPI's environment, as a user's script would
        # make it, then sumo joins it.
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % os.environ["SUMO_TEST_PORT"],
                                rank=int(os.environ["OMPI_COMM_WORLD_RANK"]),
                                world_size=int(os.environ["OMPI_COMM_WORLD_SIZE"]))
    if transport == "nccl":
        # One GPU per rank (torchrun's LOCAL_RANK), as a user's script picks it.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    elif transport in ("shm", "hierarchical") and "LOCAL_RANK" in os.environ and \
            torch.cuda.is_available():
        # Processes of one node over CUDA IPC (hierarchical: inside each host, NCCL between
        # them): several ranks may share a GPU.
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    st.init(transport=transport)
    torch.set_num_threads(1)
    yield st

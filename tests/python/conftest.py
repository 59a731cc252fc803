"""pytest set-up for sumo.torch: one communicator per process for the whole session (MPI
under mpirun, else one rank), a short deadline so a broken test fails instead of hanging,
and a clean skip when PyTorch is not installed."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
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
    st.init()
    torch.set_num_threads(1)
    yield st

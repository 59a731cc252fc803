"""sumo under srun without Slurm: the hostlist syntax and the step's variables as libsumo reads
them for the binding (sumo_bootstrap_detect through sumo._lib.bootstrap), the launcher
sumo.torch.init() sees, and a two-task step on this host made of the variables srun would set,
which must meet and reduce (shared memory, the group made from them). The expected hosts and
ports are written out by hand (tests/unit/test_bootstrap.c checks the C side alone)."""
import os
import random
import re
import subprocess
import sys

import pytest

import sumo.torch as st
from sumo import _lib
from sumo._abi import (SUMO_SUCCESS, SUMO_ERR_INVALID_ARGUMENT, SUMO_ERR_INVALID_USAGE,
                       SUMO_LAUNCHER_SRUN)
from sumo.torch import _init


@pytest.mark.parametrize("text, hosts", [
    ("node01", ["node01"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("node[098-101]", ["node098", "node099", "node100", "node101"]),
    ("a[1-2],login,b[3]", ["a1", "a2", "login", "b3"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("gpu-[1,3]-ib", ["gpu-1-ib", "gpu-3-ib"]),
    ("host.example.org", ["host.example.org"]),
])
def test_hostlist(text, hosts):
    assert _lib.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, why", [
    ("node[01-04", "'[' without ']'"), ("node01]", "']' without '['"),
    ("node[a-b]", "not a number"), ("node[4-1]", "backwards"), ("a,,b", "empty name"),
    ("n[[1]]", "nested"),
])
def test_hostlist_refused(text, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        _lib.expand_hostlist(text)


def step_env(**over):
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
           "SLURM_STEP_NODELIST": "node[03-04]", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "2"}
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


def test_step():
    s = _lib.bootstrap(step_env())
    assert s.code == SUMO_SUCCESS and s.launcher == SUMO_LAUNCHER_SRUN, s
    assert (s.rank, s.size, s.local_rank, s.host) == (1, 4, 1, "node03")
    # 12000 + (4242 * 64 + 2) mod 20000: the port every task of the step computes.
    assert s.port == 23490
    assert _lib.bootstrap(step_env(SLURM_PROCID="3", SLURM_LOCALID="1")).port == 23490
    assert _lib.bootstrap(step_env(SLURM_STEP_ID="3")).port == 23491
    assert _lib.bootstrap(step_env(SLURM_JOB_ID="4243")).port == 23554
    s = _lib.bootstrap(step_env(MASTER_ADDR="head", MASTER_PORT="29400"))
    assert (s.host, s.port) == ("head", 29400)


@pytest.mark.parametrize("var", ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                 "SLURM_STEP_NODELIST", "SLURM_JOB_ID", "SLURM_STEP_ID"])
def test_step_incomplete(var):
    s = _lib.bootstrap(step_env(**{var: None}))
    assert s.code == SUMO_ERR_INVALID_ARGUMENT
    assert var + " is not set" in s.message


@pytest.mark.parametrize("over, why", [
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID=x is not a number"),
    ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 is not a rank of SLURM_NTASKS=4"),
    ({"SLURM_STEP_NODELIST": "n[1-"}, "SLURM_STEP_NODELIST: hostlist 'n[1-'"),
    ({"MASTER_PORT": "29400x"}, "MASTER_PORT=29400x is not a number"),
])
def test_step_malformed(over, why):
    s = _lib.bootstrap(step_env(**over))
    assert s.code == SUMO_ERR_INVALID_ARGUMENT
    assert why in s.message


def test_launcher(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("SLURM_", "OMPI_", "PMI", "TORCHELASTIC_", "MPI_LOCAL")) or k in (
                "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PBS_NP", "LSB_DJOB_NUMPROC"):
            monkeypatch.delenv(k)
    assert _init._launcher() is None
    for k, v in step_env().items():
        monkeypatch.setenv(k, v)
    assert _init._launcher() == "srun"
    monkeypatch.setenv("SLURM_NTASKS", "1")  # a step of one task: a world of one
    assert _init._launcher() is None
    # A batch script's shell (no step) with several tasks is still refused, not joined.
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.delenv("SLURM_STEP_ID")
    monkeypatch.delenv("SLURM_STEP_NODELIST")
    assert "batch script" in _init._launcher()
    assert _lib.bootstrap().code == SUMO_ERR_INVALID_USAGE
    # Hydra's MPI_LOCALNRANKS alone is no MPI launch (PMI_SIZE is).
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("MPI_LOCALNRANKS", "2")
    assert _init._launcher() is None
    monkeypatch.setenv("PMI_SIZE", "2")
    assert _init._launcher() == "mpi"


TASK = r"""
import sys, torch, sumo.torch as st
st.init()
t = torch.full((5,), float(st.rank() + 1))
st.allreduce_(t, op=st.Sum)
print("task", st.rank(), st.size(), st.local_rank(), st.transport(), t[0].item(), flush=True)
st.shutdown()
"""


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI", "TORCHELASTIC_", "SUMO_TEST_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT", "GROUP_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def test_fake_srun_step():
    """Two tasks with the variables srun sets on one node: they meet at the derived port,
    reduce over sumo's shared memory and end."""
    if st.size() > 1:
        pytest.skip("starts a step of its own: one rank only")
    base = clean_env()
    base.update(SLURM_NTASKS="2", SLURM_STEP_NODELIST="localhost",
                SLURM_JOB_ID=str(random.randrange(1, 1 << 20)), SLURM_STEP_ID="0",
                SUMO_TIMEOUT="30")
    procs = []
    for rank in range(2):
        env = dict(base, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-W", "ignore:Failed to initialize NumPy",
                                       "-c", TASK], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(out)
        assert p.returncode == 0, out
    for rank, out in enumerate(outs):
        assert "task %d 2 %d shm 3.0" % (rank, rank) in out, out


def test_fake_srun_incomplete():
    if st.size() > 1:
        pytest.skip("starts a task of its own: one rank only")
    env = dict(clean_env(), SLURM_NTASKS="2", SLURM_STEP_ID="0", SLURM_PROCID="0",
               SLURM_LOCALID="0", SLURM_JOB_ID="7")
    p = subprocess.run([sys.executable, "-W", "ignore:Failed to initialize NumPy", "-c", TASK],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    assert p.returncode != 0
    assert "SLURM_STEP_NODELIST is not set" in p.stdout, p.stdout

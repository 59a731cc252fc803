#!/usr/bin/env python3
"""What losing one process of a data-parallel job costs: sumo's elastic training against
torchrun restarting every worker from a checkpoint and against torchft's fault-tolerant DDP,
on the same model, the same data and the same kill, in one run.

    make
    build/torch-venv/bin/python bench/elastic_recovery.py [--runs 5] [--nproc 3]

Each system trains an MLP of 4.2 M parameters (1024-2048-1024-10, SGD with momentum, fp32,
one thread per process) with --nproc processes on one host, each process taking a batch of
--batch rows made from (step, the rank it started as): the same data for every system.
  sumo      python -m sumo.launch --nproc N, sumo.torch.elastic (hvd.elastic.run, TorchState,
            DistributedOptimizer), state.commit() after every step
  sumo-group  the same with --transport group: sumo's collectives over gloo groups made from
            the store, one per membership, the survivors agreeing through the store with
            heartbeats, as processes on several hosts do (SUMO_LIVENESS_TIMEOUT, 5 s by
            default, is how soon a dead process is taken for dead)
  sumo-group:MS  the same with SUMO_LIVENESS_TIMEOUT of MS milliseconds
  sumo-tcp, sumo-tcp:MS  likewise with --transport tcp: sumo's own TCP connections met through
            the store, one communicator per membership (no message through the interpreter)
  torchrun  torchrun --standalone --nproc-per-node N --max-restarts 1, DDP over gloo; rank 0
            saves model, optimizer and step every --ckpt-every steps, and every worker
            starts from that file when there is one (its agent stops every worker when one
            fails and starts them all again); TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, without
            which the restarted workers cannot make their gloo group (see start_job)
  torchft   torchft's DistributedDataParallel and Optimizer wrappers with ProcessGroupGloo,
            each process a replica group of its own (its own TCPStore and Manager), meeting
            at a torchft_lighthouse started here with the options of torchft's README
            (--min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000), the heartbeat
            timeout its default (5000 ms); skipped, with one line, when torchft is not
            installed
  torchft:MS  the same with --heartbeat_timeout_ms MS: the lighthouse leaves a replica out
            of the quorum once it has not heard from it for that long, so this is how soon
            torchft can go on without a dead one
The kill: the process that started as rank --victim stops at the start of step --kill-step
(before its forward pass; the others go on into that step and wait for it) and marks it;
this driver sees the mark, sends SIGKILL and takes time.time() as the kill time. Every
worker appends time.time() after each completed step (after sumo's commit, torchrun's
checkpoint save, torchft's should_commit) to a file of its own, so every figure comes from
the same clock and the same rule:
  recovery    from the kill to the time every process still training (torchrun: the
              restarted ones) has completed a step again
  steps lost  the steps whose work was done again or thrown away: the step in flight and
              every completed step done again after the kill (torchrun: back to its
              checkpoint)
  regained    from the kill until the step in flight is completed (equal to recovery when
              nothing completed is done again)
Runs alternate between the systems so that a slow phase of a shared machine hits them alike;
the table gives medians over --runs and the spread (min-max). Not part of the test command.
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

# torch is imported by the workers alone: the driver stays a light process beside the jobs
# it times.
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SYSTEMS = ("sumo", "sumo-group", "sumo-tcp", "torchrun", "torchft")
GUARD = 300  # seconds one run may take at all (torch's start-up on a busy machine)


def options():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--runs", type=int, default=5, help="runs of each system")
    # --job-size: the name the workers get it by (torchrun takes --nproc for its own).
    p.add_argument("--nproc", "--job-size", type=int, default=3,
                   help="processes (replica groups) per job")
    p.add_argument("--steps", type=int, default=25, help="steps of the whole job")
    p.add_argument("--kill-step", type=int, default=15)
    p.add_argument("--victim", type=int, default=1, help="the rank killed (as started)")
    p.add_argument("--ckpt-every", type=int, default=10, help="torchrun's checkpoint interval")
    p.add_argument("--batch", type=int, default=32, help="rows per process and step")
    p.add_argument("--keep", action="store_true", help="keep each run's directory")
    # A worker of one job (this file run by the launchers).
    p.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--replica", type=int, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", help=argparse.SUPPRESS)
    return p


# ---------------------------------------------------------------------------------------------
# The workers


class Log:
    """One process's record: unbuffered appends, so a record written before a SIGKILL is on
    disk after it."""

    def __init__(self, directory, rank):
        self.fd = os.open(os.path.join(directory, "log.%d" % os.getpid()),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.put("start %d %d %.6f" % (os.getpid(), rank, time.time()))

    def put(self, line):
        os.write(self.fd, (line + "\n").encode())

    def step(self, step, size):
        self.put("step %d %.6f %d" % (step, time.time(), size))


def pause_here(a, step):
    """The victim's stop: it tells the driver where it is and waits to be killed, so the kill
    falls at the same point of the same step whatever the system."""
    path = os.path.join(a.dir, "victim")
    with open(path + ".tmp", "w") as f:
        f.write("%d %d %.6f\n" % (os.getpid(), step, time.time()))
    os.rename(path + ".tmp", path)
    while True:
        time.sleep(10)


def make_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10))


def make_optimizer(model):
    import torch
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def batch(a, step, rank):
    import torch
    g = torch.Generator().manual_seed(1000003 * step + rank)
    return torch.randn(a.batch, 1024, generator=g), torch.randint(0, 10, (a.batch,), generator=g)


def loss_of(model, a, step, rank):
    import torch
    x, y = batch(a, step, rank)
    return torch.nn.functional.cross_entropy(model(x), y)


def worker_sumo(a):
    import torch
    import sumo.torch as hvd
    from sumo.torch import _runtime
    torch.set_num_threads(1)
    hvd.init()  # the communicator sumo.launch made
    rank = hvd.rank()
    log = Log(a.dir, rank)
    model = make_model()
    opt = hvd.DistributedOptimizer(make_optimizer(model), named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    state.register_reset_callbacks([lambda: log.put("reset %.6f %d" % (time.time(), hvd.size()))])

    @hvd.elastic.run
    def train(state):
        log.put("call %.6f %d" % (time.time(), state.step))
        while state.step < a.steps:
            s = state.step
            if rank == a.victim and s == a.kill_step and _runtime.state.memberships == 0:
                pause_here(a, s)
            try:
                opt.zero_grad()
                loss_of(model, a, s, rank).backward()
                opt.step()
                state.step = s + 1
                t = time.time()
                state.commit()
                t = time.time() - t
            except hvd.elastic.HorovodInternalError:
                log.put("failed %.6f" % time.time())
                raise
            log.step(s, hvd.size())
            log.put("commit %.6f" % t)

    train(state)


def worker_torchrun(a):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    log = Log(a.dir, int(os.environ["RANK"]))
    dist.init_process_group("gloo")
    log.put("group %.6f" % time.time())
    rank, size = dist.get_rank(), dist.get_world_size()
    incarnation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = make_model()
    opt = make_optimizer(model)
    ckpt = os.path.join(a.dir, "checkpoint.pt")
    start = 0
    if os.path.exists(ckpt):
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        start = saved["step"]
    log.put("call %.6f %d" % (time.time(), start))
    ddp = DDP(model)
    for s in range(start, a.steps):
        if rank == a.victim and s == a.kill_step and incarnation == 0:
            pause_here(a, s)
        opt.zero_grad()
        loss_of(ddp, a, s, rank).backward()
        opt.step()
        if rank == 0 and (s + 1) % a.ckpt_every == 0:
            # Written whole, then renamed: a restart never reads half a checkpoint.
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "step": s + 1}, ckpt + ".tmp")
            os.rename(ckpt + ".tmp", ckpt)
        log.step(s, size)
    dist.destroy_process_group()


def worker_torchft(a):
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    torch.set_num_threads(1)
    rank = a.replica
    log = Log(a.dir, rank)
    model = make_model()
    opt = make_optimizer(model)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optimizer"])

    # A replica group of one process: its own store, as torchft's own tests and examples
    # start replica groups; the timeouts of torchft's train_ddp.py example.
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
                      load_state_dict=load_state_dict,
                      state_dict=lambda: {"model": model.state_dict(),
                                          "optimizer": opt.state_dict()},
                      replica_id="replica%d" % rank, store_addr="localhost",
                      store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=a.lighthouse, port=0, timeout=timedelta(seconds=30))
    ddp = DistributedDataParallel(manager, model)
    ftopt = Optimizer(manager, opt)
    # Every replica heartbeats before the first quorum, so that it takes all of them (the
    # lighthouse would otherwise start with whoever came first and heal the rest later).
    open(os.path.join(a.dir, "ready.%d" % rank), "w").close()
    while len([n for n in os.listdir(a.dir) if n.startswith("ready.")]) < a.nproc:
        time.sleep(0.01)
    log.put("call %.6f %d" % (time.time(), manager.current_step()))
    while True:
        s = manager.current_step()
        if s >= a.steps:
            break
        if rank == a.victim and s == a.kill_step:
            pause_here(a, s)
        ftopt.zero_grad()  # starts the step's quorum
        loss_of(ddp, a, s, rank).backward()
        ftopt.step()  # steps only if every participant's allreduce went through
        if manager.current_step() > s:
            log.step(s, manager.num_participants())
    # Its threads (heartbeat, quorum) need not wind down for the figures.
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# The driver


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def common_args(a, directory):
    return ["--dir", directory, "--job-size", str(a.nproc), "--steps", str(a.steps),
            "--kill-step", str(a.kill_step), "--victim", str(a.victim),
            "--ckpt-every", str(a.ckpt_every), "--batch", str(a.batch)]


def start_job(a, system, directory, out):
    """The job's processes (what ends the run when they end) and the helpers to stop after."""
    me = [sys.executable, os.path.abspath(__file__)]
    spawn = dict(env=env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    if system == "sumo" or system.startswith(("sumo-group", "sumo-tcp")):
        across = ["--transport", system[len("sumo-"):].partition(":")[0]] \
            if system != "sumo" else []
        ms = system.partition(":")[2]
        if ms:
            spawn["env"]["SUMO_LIVENESS_TIMEOUT"] = str(int(ms) / 1000)
        cmd = [sys.executable, "-m", "sumo.launch", "--nproc", str(a.nproc)] + across + \
            me[1:] + ["--worker", "sumo"] + common_args(a, directory)
        return [subprocess.Popen(cmd, **spawn)], []
    if system == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc-per-node", str(a.nproc), "--max-restarts", "1"] + me[1:] + \
            ["--worker", "torchrun"] + common_args(a, directory)
        # With the agent's store shared (torch's default), the restarted workers' gloo read
        # the first workers' addresses from it and fail to connect (pytorch/pytorch#135712):
        # each round then gets a store of its own.
        spawn["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        return [subprocess.Popen(cmd, **spawn)], []
    port = free_port()
    cmd = [lighthouse_binary(), "--bind", "[::]:%d" % port, "--min_replicas", "1",
           "--quorum_tick_ms", "100", "--join_timeout_ms", "10000"]
    if ":" in system:
        cmd += ["--heartbeat_timeout_ms", system.split(":")[1]]
    helpers = [subprocess.Popen(cmd, **spawn)]
    address = "http://localhost:%d" % port
    procs = [subprocess.Popen(me + ["--worker", "torchft", "--replica", str(r), "--lighthouse",
                                    address] + common_args(a, directory), **spawn)
             for r in range(a.nproc)]
    return procs, helpers


def lighthouse_binary():
    here = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    return here if os.path.exists(here) else shutil.which("torchft_lighthouse")


def stop(p):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def run_once(a, system):
    """One job with its kill; the records of its processes and the kill time."""
    directory = tempfile.mkdtemp(prefix="sumo-elastic-bench-")
    out = open(os.path.join(directory, "output"), "w")
    procs, helpers = start_job(a, system, directory, out)
    mark = os.path.join(directory, "victim")
    end = time.monotonic() + GUARD
    t_kill = victim = kill_step = None
    try:
        while not os.path.exists(mark):
            if time.monotonic() > end or all(p.poll() is not None for p in procs):
                raise RuntimeError("%s: the victim never reached step %d" % (system, a.kill_step))
            time.sleep(0.001)
        with open(mark) as f:
            victim, kill_step = (int(w) for w in f.read().split()[:2])
        os.kill(victim, signal.SIGKILL)
        t_kill = time.time()
        for p in procs:
            p.wait(timeout=max(1, end - time.monotonic()))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        out.flush()
        with open(os.path.join(directory, "output")) as f:
            tail = f.read()[-3000:]
        raise RuntimeError("%s (run left in %s):\n%s" % (e, directory, tail))
    finally:
        for p in procs + helpers:
            stop(p)
        out.close()
    records = read_records(directory)
    if not a.keep:
        shutil.rmtree(directory, ignore_errors=True)
    return figures(a, system, records, t_kill, kill_step)


def read_records(directory):
    """pid -> list of (kind, fields) in the order written."""
    records = {}
    for name in os.listdir(directory):
        if name.startswith("log."):
            with open(os.path.join(directory, name)) as f:
                records[int(name[4:])] = [(w[0], w[1:]) for w in
                                          (line.split() for line in f) if w]
    return records


def figures(a, system, records, t_kill, kill_step):
    """The run's figures from its records. A step below kill_step done by a process that was
    there before the kill is the first membership's work, whenever its record was written (a
    process may finish such a step just after the kill); every other step is work after the
    failure: a step redone, or a new one."""
    old, after = [], {}
    for pid, recs in records.items():
        there = float(recs[0][1][2]) < t_kill
        for kind, fields in recs:
            if kind != "step":
                continue
            step, t, size = int(fields[0]), float(fields[1]), int(fields[2])
            if there and step < kill_step:
                old.append((step, t, size, pid))
            else:
                after.setdefault(pid, []).append((step, t, size))
    last = max(s for s, _, _, _ in old)
    at_kill = min(size for s, _, size, _ in old if s == last)
    if last != kill_step - 1 or at_kill != a.nproc:
        raise RuntimeError("%s: before the kill, step %d with %d processes (expected step %d "
                           "with %d)" % (system, last, at_kill, kill_step - 1, a.nproc))
    if not after:
        raise RuntimeError("%s: no step completed after the kill" % system)
    firsts = [recs[0] for recs in after.values()]
    first_step = min(s for s, _, _ in firsts)
    # Every process of the new membership has completed a step.
    recovery = max(t for _, t, _ in firsts) - t_kill
    # The step in flight, and the completed steps done again.
    lost = kill_step - first_step + 1
    # The step in flight completed by every process of the new membership.
    regained = max(min(t for s, t, _ in recs if s >= kill_step) for recs in after.values()) \
        - t_kill
    # Steady step time: intervals between one process's steps before the kill, the first
    # steps (warm-up) left out.
    steps = []
    for pid in records:
        ts = sorted(t for s, t, _, p in old if p == pid and s >= 3)
        steps += [b - c for b, c in zip(ts[1:], ts)]
    # sumo's commit() of every step, before the kill.
    commits = [float(f[0]) for recs in records.values() for k, f in recs if k == "commit"]
    return {"recovery": recovery, "lost": lost, "regained": regained,
            "step": statistics.median(steps),
            "commit": statistics.median(commits) if commits else None,
            "after_size": max(recs[0][2] for recs in after.values()),
            "phases": phases(system, records, t_kill)}


def phases(system, records, t_kill):
    """Where the time went, as far as the records tell: sumo's new membership (its reset
    callback) and state synced (the run function called again); torchrun's restarted
    processes up (torch imported), their group made, and model and optimizer made and the
    checkpoint loaded."""
    def latest(kind, index):
        ts = [float(f[index]) for recs in records.values() for k, f in recs
              if k == kind and float(f[index]) > t_kill]
        return max(ts) - t_kill if ts else None
    if system.startswith("sumo"):
        return [("failure seen", latest("failed", 0)), ("new membership", latest("reset", 0)),
                ("state synced", latest("call", 0))]
    if system == "torchrun":
        return [("processes up", latest("start", 2)), ("group made", latest("group", 0)),
                ("checkpoint loaded", latest("call", 0))]
    return []


def spread(xs):
    return "%.3f (%.3f-%.3f)" % (statistics.median(xs), min(xs), max(xs))


def label(system):
    if system.startswith(("sumo-group", "sumo-tcp")):
        ms = system.partition(":")[2]
        return "sumo, across hosts (%s), liveness timeout %s" % (
            "gloo groups" if system.startswith("sumo-group") else "sumo's TCP",
            "%s ms" % ms if ms else "5000 ms (default)")
    if system.startswith("torchft"):
        ms = system.partition(":")[2]
        return "torchft, heartbeat timeout %s" % ("%s ms" % ms if ms else "5000 ms (default)")
    return system


def driver(a):
    systems = [s for s in a.systems.split(",") if s]
    for s in systems:
        name, _, ms = s.partition(":")
        if name not in SYSTEMS or (ms and (name not in ("torchft", "sumo-group", "sumo-tcp")
                                           or not ms.isdigit())):
            sys.exit("--systems: %s, each once, or torchft:MS, sumo-group:MS, sumo-tcp:MS"
                     % ", ".join(SYSTEMS))
    if any(s.startswith("torchft") for s in systems):
        import importlib.util
        if importlib.util.find_spec("torchft") is None or lighthouse_binary() is None:
            print("torchft: not installed with this python (%s): left out" % sys.executable)
            systems = [s for s in systems if not s.startswith("torchft")]
    if not systems:
        return
    if not 0 < a.victim < a.nproc or not 3 <= a.kill_step < a.steps:
        sys.exit("need 0 < --victim < --nproc and 3 <= --kill-step < --steps")
    print("%d processes on %d cores (load average %.1f), %d steps, SIGKILL of rank %d at the "
          "start of step %d; torchrun checkpoints every %d steps; %d runs each" % (
              a.nproc, os.cpu_count(), os.getloadavg()[0], a.steps, a.victim, a.kill_step,
              a.ckpt_every, a.runs))
    results = {s: [] for s in systems}
    for r in range(a.runs):
        for s in systems:
            f = run_once(a, s)
            results[s].append(f)
            extra = "".join(", %s %.3f s" % (what, t) for what, t in f["phases"]
                            if t is not None)
            if f["commit"] is not None:
                extra += ", commit %.1f ms" % (1e3 * f["commit"])
            print("run %d %-8s: recovery %.3f s, steps lost %d, regained %.3f s, step %.1f ms, "
                  "then %d processes%s" % (r + 1, s, f["recovery"], f["lost"], f["regained"],
                                            1e3 * f["step"], f["after_size"], extra),
                  flush=True)
    base = statistics.median(f["recovery"] for f in results["torchrun"]) \
        if results.get("torchrun") else None
    print()
    print("| system | step ms | recovery s, median (min-max) | steps lost | regained s | "
          "recovery vs torchrun |")
    print("|---|---|---|---|---|---|")
    for s in systems:
        fs = results[s]
        rec = [f["recovery"] for f in fs]
        lost = sorted({f["lost"] for f in fs})
        ratio = "%.3fx" % (statistics.median(rec) / base) if base else "-"
        print("| %s | %.1f | %s | %s | %s | %s |" % (
            label(s), 1e3 * statistics.median(f["step"] for f in fs), spread(rec),
            ", ".join(map(str, lost)), spread([f["regained"] for f in fs]), ratio))


def main():
    a = options().parse_args()
    if a.worker is None:
        return driver(a)
    {"sumo": worker_sumo, "torchrun": worker_torchrun, "torchft": worker_torchft}[a.worker](a)


if __name__ == "__main__":
    main()

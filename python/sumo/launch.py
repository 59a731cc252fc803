"""Starts processes that survive each other: the launch sumo.torch.elastic needs.

    python -m sumo.launch --nproc 4 train.py [args]
        four processes, each started on its own, meeting through a FileStore that lives in a
        file, not in any of them: one that dies (killed, crashed) leaves the others training.
        The launcher waits for them all, removes the store (unless --store named it) and exits
        0 when every process that ended by itself ended with 0 (one killed by a signal was
        lost, which is what the job survives).

    python -m sumo.launch --store PATH --rank R --size N train.py [args]
        one process of such a job, started on its own (by hand, by a scheduler): the N
        processes give the same PATH, a FileStore's file (made when missing), or a directory
        that exists (sumo's directory store; no joining through that).

    python -m sumo.launch --store PATH --join train.py [args]
        a process that joins the job running on PATH at its next commit().

    python -m sumo.launch --serve-store HOST:PORT
    python -m sumo.launch --store tcp://HOST:PORT --rank R --size N train.py
        across hosts: a store served by a process of its own (a TCPStore listening on
        HOST:PORT, until it is stopped), and the job's processes, started on any hosts, each
        meeting through it over sumo's TCP connections, made again for each membership
        (--transport tcp, the default with a tcp:// store; --transport group: gloo groups made
        from the store, every message through the interpreter; shm, the default otherwise, is
        for processes of one host). A lost process is found by its heartbeat
        (SUMO_LIVENESS_TIMEOUT). --transport tcp or group works with --nproc too, to try it on
        one host.

A process calls sumo.torch.init(store=..., rank=..., size=...) (or join=True) and runs the
script as __main__, whose own hvd.init() then finds the communicator made (sumo/torch/_launch.py).
torchrun's agent, by contrast, stops every worker when one fails, and mpirun ends the job.
This module imports neither torch nor sumo.torch, so the launcher itself starts at once.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

USAGE = "python -m sumo.launch"


def parser():
    p = argparse.ArgumentParser(
        prog=USAGE,
        description="Start processes of one host that survive each other (sumo.torch.elastic).")
    p.add_argument("--nproc", type=int, help="start this many processes and wait for them")
    p.add_argument("--store", help="the store's path: a FileStore's file (made when missing), "
                   "or an existing directory (sumo's directory store)")
    p.add_argument("--rank", type=int, help="this process's rank (with --store and --size)")
    p.add_argument("--size", type=int, help="the number of processes (with --store and --rank)")
    p.add_argument("--join", action="store_true", help="join the job running on --store")
    p.add_argument("--transport", choices=("shm", "tcp", "group"),
                   help="shm: processes of one host over shared memory (the default, but with "
                   "a tcp:// store); tcp: sumo's TCP connections met through the store, which "
                   "span hosts (the default with a tcp:// store); group: gloo groups made from "
                   "the store, which span hosts too")
    p.add_argument("--serve-store", metavar="HOST:PORT",
                   help="serve a TCPStore on HOST:PORT until stopped, for --store "
                   "tcp://HOST:PORT (port 0: one the system picks, printed)")
    p.add_argument("script", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p


def address(text, what, any_port=False):
    """(host, port) of HOST:PORT, or exits naming what it is; any_port: port 0 (the system
    picks one) is allowed."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not (0 if any_port else 1) <= int(port) < 65536:
        sys.exit("%s: %s must be HOST:PORT, not %r" % (USAGE, what, text))
    return host, int(port)


def transport_of(args):
    """--transport, or its default: a served store (tcp://) is what jobs across hosts use."""
    if args.transport is not None:
        return args.transport
    return "tcp" if (args.store or "").startswith("tcp://") else "shm"


def check(args):
    """Exits with a message for a combination of options that means nothing."""
    if args.serve_store is not None:
        if args.nproc is not None or args.store is not None or args.script is not None:
            sys.exit("%s: --serve-store runs the store alone: no --nproc, --store or script"
                     % USAGE)
        address(args.serve_store, "--serve-store", any_port=True)
        return
    if args.script is None:
        sys.exit("%s: give the script to run" % USAGE)
    if args.store is not None and args.store.startswith("tcp://"):
        address(args.store[len("tcp://"):], "--store tcp://")
    if args.nproc is not None:
        if args.rank is not None or args.size is not None or args.join:
            sys.exit("%s: --nproc starts the processes itself: no --rank, --size or --join"
                     % USAGE)
        if args.nproc < 1:
            sys.exit("%s: --nproc must be at least 1" % USAGE)
    elif args.store is None:
        sys.exit("%s: give --nproc, or --store with --rank and --size (or --join)" % USAGE)
    elif args.join and (args.rank is not None or args.size is not None):
        sys.exit("%s: --join takes no --rank or --size (the job hands them out)" % USAGE)
    elif not args.join and (args.rank is None or args.size is None):
        sys.exit("%s: --store needs --rank and --size (or --join)" % USAGE)


def worker_command(store, script, args, rank=None, size=None, join=False, transport="shm"):
    """The command of one process: sumo.torch's part (sumo/torch/_launch.py)."""
    place = ["--join"] if join else ["--rank", str(rank), "--size", str(size)]
    return [sys.executable, "-m", "sumo.torch._launch", "--store", store, "--transport",
            transport] + place + [script] + list(args)


def launch(args):
    """Starts args.nproc processes and waits for them; the exit status as the module says."""
    made = None
    store = args.store
    if store is None:
        made = tempfile.mkdtemp(prefix="sumo-store-")  # mode 0700
        store = os.path.join(made, "store")
    procs = []
    try:
        for r in range(args.nproc):
            procs.append(subprocess.Popen(worker_command(store, args.script, args.args,
                                                         rank=r, size=args.nproc,
                                                         transport=transport_of(args))))
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    for r, c in enumerate(codes):
        if c != 0:
            print("%s: process %d %s" % (USAGE, r, "was killed by signal %d" % -c if c < 0
                                         else "exited with %d" % c), file=sys.stderr)
    ended = [c for c in codes if c >= 0]
    return 0 if ended and all(c == 0 for c in ended) else 1


def main(argv=None):
    args = parser().parse_args(argv)
    check(args)
    if args.serve_store is not None:
        cmd = [sys.executable, "-m", "sumo.torch._launch", "--serve-store", args.serve_store]
        os.execv(cmd[0], cmd)
    if args.nproc is not None:
        return launch(args)
    cmd = worker_command(args.store, args.script, args.args, args.rank, args.size, args.join,
                         transport_of(args))
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())

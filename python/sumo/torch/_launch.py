"""One process that python -m sumo.launch starts (or execs into): the communicator made from
the store (sumo.torch.init(store=..., rank=..., size=...), or join=True), then the script run
as __main__. Its own hvd.init() finds the communicator made and returns. Or, with
--serve-store, the store of a job across hosts, served until the process is stopped."""
import os
import runpy
import signal
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from .. import launch
from . import _init, _runtime as rt


def _store(path):
    """tcp://HOST:PORT is a TCPStore served elsewhere (--serve-store); a directory that exists
    is sumo's directory store; any other path a FileStore's file (which has the atomic add that
    joining needs)."""
    if path.startswith("tcp://"):
        host, port = launch.address(path[len("tcp://"):], "--store tcp://")
        return dist.TCPStore(host, port, is_master=False,
                             timeout=timedelta(seconds=rt._deadline_s()))
    if os.path.isdir(path):
        return path
    return dist.FileStore(path, -1)


def _serve(where):
    """Serves a TCPStore on where (HOST:PORT) until SIGINT or SIGTERM."""
    host, port = launch.address(where, "--serve-store", any_port=True)
    store = dist.TCPStore(host, port, None, True, timedelta(seconds=rt._deadline_s()),
                          wait_for_workers=False)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("%s: serving a store on %s:%d (tcp://%s:%d), until stopped" % (
        launch.USAGE, host, store.port, host, store.port), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def main(argv=None):
    args = launch.parser().parse_args(argv)
    if args.serve_store is not None:
        launch.check(args)
        return _serve(args.serve_store)
    if args.nproc is not None:
        sys.exit("python -m sumo.torch._launch runs one process: start several with "
                 "python -m sumo.launch --nproc")
    launch.check(args)
    if args.join:  # the job's transport: a joiner made another way is refused by name
        _init.init(store=_store(args.store), join=True, transport=launch.transport_of(args))
    else:
        _init.init(store=_store(args.store), rank=args.rank, size=args.size,
                   transport=launch.transport_of(args))
    sys.argv = [args.script] + args.args
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()

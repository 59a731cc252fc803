"""One process that python -m sumo.launch starts (or execs into): the communicator made from
the store (sumo.torch.init(store=..., rank=..., size=...), or join=True), then the script run
as __main__. Its own hvd.init() finds the communicator made and returns."""
import os
import runpy
import sys

import torch.distributed as dist

from .. import launch
from . import _runtime as rt


def _store(path):
    """A directory that exists is sumo's directory store; any other path a FileStore's file
    (which has the atomic add that joining needs)."""
    if os.path.isdir(path):
        return path
    return dist.FileStore(path, -1)


def main(argv=None):
    args = launch.parser().parse_args(argv)
    if args.nproc is not None:
        sys.exit("python -m sumo.torch._launch runs one process: start several with "
                 "python -m sumo.launch --nproc")
    launch.check(args)
    if args.join:
        rt.init(store=_store(args.store), join=True)
    else:
        rt.init(store=_store(args.store), rank=args.rank, size=args.size)
    sys.argv = [args.script] + args.args
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()

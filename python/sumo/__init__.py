"""sumo from Python: the reduction ops and the error type. The PyTorch integration
(communicator, DDP hooks, Horovod-style optimizer, SlowMo) is in sumo.torch. `python -m sumo`
prints a build report (versions, kernels, transports, where the library was loaded from)."""
from ._abi import SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM
from ._lib import SumoError, version as _version

# The loaded library's version, which is the package's (setup.py reads include/sumo.h).
__version__ = _version()

# The ops, as Horovod names them (hvd.Adasum, hvd.Average, hvd.Sum): sumo_op values.
Sum = SUMO_OP_SUM
Average = SUMO_OP_AVERAGE
Adasum = SUMO_OP_ADASUM

__all__ = ["Sum", "Average", "Adasum", "SumoError", "__version__"]

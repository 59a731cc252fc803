"""sumo from Python: the reduction ops and the error type. The PyTorch integration
(communicator, DDP hooks, Horovod-style optimizer, SlowMo) is in sumo.torch."""
from ._lib import SumoError

# The ops, as Horovod names them (hvd.Adasum, hvd.Average, hvd.Sum): sumo_op values.
Sum = 0
Average = 1
Adasum = 2

__all__ = ["Sum", "Average", "Adasum", "SumoError"]

"""sumo from Python: the reduction ops and the error type. The PyTorch integration
(communicator, DDP hooks, Horovod-style optimizer, SlowMo) is in sumo.torch."""
from ._abi import SUMO_OP_SUM, SUMO_OP_AVERAGE, SUMO_OP_ADASUM
from ._lib import SumoError

# The ops, as Horovod names them (hvd.Adasum, hvd.Average, hvd.Sum): sumo_op values.
Sum = SUMO_OP_SUM
Average = SUMO_OP_AVERAGE
Adasum = SUMO_OP_ADASUM

__all__ = ["Sum", "Average", "Adasum", "SumoError"]

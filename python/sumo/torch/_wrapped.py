"""What the wrapping optimizers (DistributedOptimizer, SlowMo) share: they present the wrapped
torch optimizer's parameter groups, state and defaults as their own (shared, not copied), so
schedulers and checkpoints that reach into them see the real thing."""

import torch


class WrappedOptimizer(torch.optim.Optimizer):
    # Set by the subclass's __init__ before anything reads the properties below.
    _opt = None

    @property
    def param_groups(self):
        return self._opt.param_groups

    @property
    def state(self):
        return self._opt.state

    @property
    def defaults(self):
        return self._opt.defaults

    # The wrapped optimizer's own signature and default: set_to_none is False in torch 1.13
    # and True from 2.0, and a wrapper must not change what zero_grad() leaves behind.
    def zero_grad(self, *args, **kwargs):
        return self._opt.zero_grad(*args, **kwargs)

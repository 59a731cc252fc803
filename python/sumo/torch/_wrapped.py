"""What the wrapping optimizers (DistributedOptimizer, SlowMo, DiLoCo) share: they present the
wrapped torch optimizer's parameter groups, state and defaults as their own (shared, not
copied), so schedulers and checkpoints that reach into them see the real thing; and the local
optimizers' step that a rank with non-finite gradients skips alone."""

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

    def _finite_locally(self):
        """Whether this rank's gradients are finite: no collective (the schedule, not an
        agreement, keeps the ranks together). A float64 sum of each gradient is finite exactly
        when every element is (an inf or NaN makes it inf or NaN; float32 values cannot
        overflow it), and costs one read instead of a mask per tensor: isfinite per tensor took
        about half as long as an AdamW step on a small model. Float64 gradients could
        overflow it; only then is each element checked."""
        grads = [p.grad for g in self._opt.param_groups for p in g["params"]
                 if p.grad is not None]
        if not grads:
            return True
        total = torch.stack([t.sum(dtype=torch.float64) for t in grads]).sum()
        if bool(torch.isfinite(total)):
            return True
        return all(bool(torch.isfinite(t).all()) for t in grads)

    def _local_step(self, closure):
        """The wrapped optimizer's step, or, with skip_nonfinite and gradients this rank cannot
        use, none: counted in self.skipped and said in self.last_skipped, so that the rank stays
        on the schedule. Returns the closure's loss (None when skipped)."""
        self.last_skipped = self.skip_nonfinite and not self._finite_locally()
        if self.last_skipped:
            self.skipped += 1
            return None
        loss = self._opt.step(closure)
        self.steps += 1
        return loss

"""What the parity tests against the binding's C drivers (the *_driver.c files here) share: the
inputs they hand a driver are raw float32 files, as driver_io.h reads them."""
import ctypes

import torch


def floats_to_file(t, path):
    t = t.detach().contiguous().to(torch.float32)
    with open(path, "wb") as f:
        f.write(ctypes.string_at(t.data_ptr(), t.numel() * 4))

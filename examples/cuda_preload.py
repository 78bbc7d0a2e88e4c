"""A forkserver preload module that is NOT CUDA-clean: it initialises CUDA at import time.

Used by `examples/forkserver_ranks.py --cuda-in-preload` to show starttrace's CUDA-clean audit:
every process forked from a forkserver that imported this module inherits an initialised (or,
on a CPU-only torch, attempted) CUDA context, which CUDA does not survive.
"""

import torch

try:
    torch.cuda.init()
    CUDA_ERROR = ""
except Exception as exc:  # CPU-only torch: "Torch not compiled with CUDA enabled"
    CUDA_ERROR = f"{type(exc).__name__}: {exc}"

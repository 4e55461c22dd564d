"""Prints, for each case on the command line ("n:replicas:rank:seed:epoch"),
the indices PyTorch's DistributedSampler gives that rank (shuffle on,
drop_last off, after set_epoch(epoch)), space-separated, one line per case.
Exits 77 when torch cannot be imported."""
import sys

try:
    import torch
    from torch.utils.data.distributed import DistributedSampler
except ImportError:
    print("SKIP: torch is not importable by", sys.executable)
    sys.exit(77)


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


for case in sys.argv[1:]:
    n, replicas, rank, seed, epoch = (int(v) for v in case.split(":"))
    s = DistributedSampler(Sized(n), num_replicas=replicas, rank=rank, seed=seed)
    s.set_epoch(epoch)
    print(" ".join(str(i) for i in s))

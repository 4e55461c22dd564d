"""transformers' get_scheduler on a real optimizer: for each case on the
command line ("name:lr:warmup:total:steps") prints the learning rate of the
first `steps` optimizer steps (the lr each step uses), space-separated.
Exits 77 when torch or transformers cannot be imported."""
import sys

try:
    import torch
    from transformers import get_scheduler
except ImportError:
    print("SKIP: torch/transformers not importable by", sys.executable)
    sys.exit(77)

for case in sys.argv[1:]:
    name, lr, warmup, total, steps = case.split(":")
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=float(lr))
    sched = get_scheduler(name, optimizer=opt, num_warmup_steps=int(warmup), num_training_steps=int(total))
    out = []
    for _ in range(int(steps)):
        out.append(repr(opt.param_groups[0]["lr"]))
        opt.step()
        sched.step()
    print(" ".join(out))

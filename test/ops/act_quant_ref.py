#!/usr/bin/env python3
"""Reference for act_quantize (test_cpu_act_quant.cpp): DeepSpeed Compression's
QuantAct and Sym/AsymQuantizer forward, as deepspeed/compression/basic_layer.py
and utils.py write them, run by PyTorch on f32 and bf16 tensors. PyTorch on the
CPU has no f16 round, so f16 runs the same expressions in numpy with each
elementwise result rounded to f16 (what PyTorch's GPU kernels do).
  act_quant_ref.py CASES_FILE   (one case per line: dtype mode bits calls N C v0 v1 ...)
Prints per case and call the output values (and, static, the range) as f32 hex."""
import struct, sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"missing {e.name}")
    sys.exit(77)


def hexs(vals):
    return " ".join(struct.pack(">f", float(v)).hex() for v in vals)


# compression/utils.py, forward bodies (num_groups: rows for dynamic, 1 for static).
def sym_quant(input, num_bits, min_value=None, max_value=None, num_groups=1):
    q_range = 2**num_bits
    input_shape = input.shape
    if min_value is None:
        input = input.reshape(num_groups, -1)
        max_input = torch.amax(torch.abs(input), dim=-1).view(num_groups, -1)
    else:
        max_input = torch.max(min_value.abs(), max_value).view(-1)
    scale = 2 * max_input / q_range
    output = (input / scale).round().clamp(-q_range // 2, q_range // 2 - 1) * scale
    return output.reshape(input_shape).contiguous()


def asym_quant(input, num_bits, min_value=None, max_value=None, num_groups=1):
    q_range = 2**num_bits
    input_shape = input.shape
    if min_value is None:
        input = input.reshape(num_groups, -1)
        min_value = input.amin(dim=-1, keepdim=True)
        max_value = input.amax(dim=-1, keepdim=True)
    scale = (max_value - min_value) / q_range
    zero_point = (min_value / scale).round() * scale
    output = ((input - zero_point) / scale).round().clamp(0, q_range - 1) * scale + zero_point
    return output.reshape(input_shape).contiguous()


def torch_case(dtype, mode, bits, xs):
    dt = torch.float32 if dtype == "f32" else torch.bfloat16
    static, sym = mode.startswith("static"), mode.endswith("_sym")
    fn = sym_quant if sym else asym_quant
    x_min_max = torch.zeros(2)  # QuantAct's buffer
    m = 0.95
    out = []
    for x in xs:
        x = torch.tensor(x, dtype=torch.float32).to(dt)
        if static:
            x_min, x_max = x.data.min(), x.data.max()
            if x_min_max[0] == x_min_max[1]:
                x_min_max[0] = x_min
                x_min_max[1] = x_max
            x_min_max[0] = x_min_max[0] * m + x_min * (1 - m)
            x_min_max[1] = x_min_max[1] * m + x_max * (1 - m)
            q = fn(x, bits, x_min_max[0], x_min_max[1])
            out.append((q.float().flatten().tolist(), x_min_max.tolist()))
        else:
            q = fn(x, bits, None, None, x.numel() // x.size(-1))
            out.append((q.float().flatten().tolist(), None))
    return out


def f16_case(mode, bits, xs):
    h = np.float16
    r = lambda v: np.asarray(v, dtype=np.float32).astype(h).astype(np.float32)  # one f16 result
    static, sym = mode.startswith("static"), mode.endswith("_sym")
    q = np.float32(2**bits)
    rng = np.zeros(2, dtype=np.float32)
    m, c = np.float32(0.95), r(np.float32(1 - 0.95))  # the Python float becomes an f16 (x_min's dtype)
    out = []
    for x in xs:
        x = r(np.asarray(x, dtype=np.float32))
        if static:
            lo, hi = x.min(), x.max()
            if rng[0] == rng[1]:
                rng[:] = [lo, hi]
            rng[0] = np.float32(rng[0] * m) + r(lo * c)
            rng[1] = np.float32(rng[1] * m) + r(hi * c)
            # asymmetric (symmetric static needs f32); the f32 scale and zero
            # point meet the f16 tensor as f16 values (PyTorch's common dtype)
            scale32 = np.float32((rng[1] - rng[0]) / q)
            zp = r(np.float32(np.round(np.float32(rng[0] / scale32)) * scale32))
            scale = r(scale32)
            y = r(np.clip(np.round(r(r(x - zp) / scale)), 0, q - 1) * scale)
            out.append((r(y + zp).flatten().tolist(), rng.tolist()))
            continue
        rows = []
        for row in x:
            if sym:
                scale = r(r(2 * np.abs(row).max()) / q)
                rows.append(r(np.clip(np.round(r(row / scale)), -q / 2, q / 2 - 1) * scale))
            else:
                lo, hi = row.min(), row.max()
                scale = r(r(hi - lo) / q)
                zp = r(np.round(r(lo / scale)) * scale)
                y = r(np.clip(np.round(r(r(row - zp) / scale)), 0, q - 1) * scale)
                rows.append(r(y + zp))
        out.append((np.stack(rows).flatten().tolist(), None))
    return out


for line in open(sys.argv[1]):
    w = line.split()
    dtype, mode, bits, calls, N, C = w[0], w[1], int(w[2]), int(w[3]), int(w[4]), int(w[5])
    vals = [struct.unpack(">f", bytes.fromhex(v))[0] for v in w[6:]]
    xs = [np.array(vals[i * N * C:(i + 1) * N * C], dtype=np.float32).reshape(N, C) for i in range(calls)]
    res = f16_case(mode, bits, xs) if dtype == "f16" else torch_case(dtype, mode, bits, xs)
    print(" | ".join(hexs(o) + (" range " + hexs(rg) if rg is not None else "") for o, rg in res))

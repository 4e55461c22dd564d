#!/usr/bin/env python3
"""Reference for dstrain's MoQ (test_compression.cpp): DeepSpeed's
runtime/quantize.py Quantizer.quantize_highbit on f16 weights, with numpy's
float16 arithmetic (each operation rounded to f16, as PyTorch's half kernels;
PyTorch on the CPU cannot round f16 tensors).
  moq_ref.py FILE   (lines: bits groups symmetric|asymmetric rows cols heads v0 v1 ... as f16 hex, in
                     Megatron's layout)
Prints each line's quantized values as f16 hex."""
import sys

try:
    import numpy as np
except ImportError:
    print("missing numpy")
    sys.exit(77)


def quantize_highbit(inputs, num_bits, q_groups, q_type):
    q_range = 2**num_bits
    input_flat = inputs.reshape(q_groups, -1)
    g_min = input_flat.min(axis=-1, keepdims=True)
    g_max = input_flat.max(axis=-1, keepdims=True)
    p = np.float16(0.0)  # rounding 'nearest'
    if q_type == "symmetric":
        scale = np.float16(2) * np.maximum(np.abs(g_min), np.abs(g_max)) / np.float16(q_range)
        input_flat = np.clip(np.round(input_flat / scale + p), -(q_range >> 1), (q_range >> 1) - 1).astype(np.float16) * scale
    else:
        scale = (g_max - g_min) / np.float16(q_range)
        zero_point = np.round(g_min / scale) * scale
        input_flat = np.clip(np.round((input_flat - zero_point) / scale + p), 0, q_range - 1).astype(np.float16) * scale + zero_point
    return input_flat.reshape(inputs.shape)


for line in open(sys.argv[1]):
    w = line.split()
    bits, groups, qtype = int(w[0]), int(w[1]), w[2]
    vals = np.array([int(h, 16) for h in w[3:]], dtype=np.uint16).view(np.float16)
    q = quantize_highbit(vals, bits, groups, qtype).astype(np.float16)
    print(" ".join(f"{int(v):04x}" for v in q.view(np.uint16)))

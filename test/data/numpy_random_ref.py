#!/usr/bin/env python3
"""numpy's default_rng draws for test_numpy_random: for each seed, one line
each of raw 64-bit outputs, random() doubles (their bits), shuffles of arange(n),
and choice(len(p), size, replace=True, p) - in that order on one generator,
so the buffered 32-bit half and the draw order are exercised. Exit 77 without numpy."""
import struct, sys
try:
    import numpy as np
except ImportError:
    print("SKIP: numpy not importable")
    sys.exit(77)
for seed in (0, 1, 1234, 2**32 + 5, 2**63 - 1):
    g = np.random.default_rng(seed)
    print("raw", seed, *[int(v) for v in g.bit_generator.random_raw(5)])
    print("random", seed, *[struct.unpack("<Q", struct.pack("<d", float(v)))[0] for v in g.random(4)])
    for n in (1, 2, 10, 997):
        x = np.arange(n, dtype=np.int64)
        g.shuffle(x)
        print("shuffle", seed, n, *x.tolist())
    sizes = [3, 5, 2]
    w = [s / sum(sizes) for s in sizes]
    print("choice", seed, *g.choice(len(w), 40, replace=True, p=w).tolist())
    print("random", seed, *[struct.unpack("<Q", struct.pack("<d", float(v)))[0] for v in g.random(2)])

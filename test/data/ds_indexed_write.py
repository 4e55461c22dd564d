#!/usr/bin/env python3
"""Writes indexed datasets in DeepSpeed's flavour of the format (the layout of
data_sampling/indexed_dataset.py: Megatron's MMIDIDX header and arrays, its
own dtype codes 6 = u16, 7 = u32, 8 = u64) for test_data_analysis, which reads
them back. One line per file on stdout: PREFIX DTYPE then the rows, separated
by '|'. The u64 file ends with a row holding 2**64 - 1.

    ds_indexed_write.py OUTDIR
Exit 77 without numpy."""
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy not importable")
    sys.exit(77)

CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 6, np.uint32: 7, np.uint64: 8}
NAMES = {np.uint16: "u16", np.uint32: "u32", np.uint64: "u64", np.int16: "i16"}


def write(prefix, dtype, rows, doc_idx):
    arrays = [np.array(r, dtype=dtype) for r in rows]
    with open(prefix + ".bin", "wb") as f:
        for a in arrays:
            f.write(a.tobytes())
    sizes = np.array([a.size for a in arrays], dtype=np.int32)
    pointers = np.zeros(len(arrays), dtype=np.int64)
    if len(arrays) > 1:
        pointers[1:] = np.cumsum(sizes.astype(np.int64) * np.dtype(dtype).itemsize)[:-1]
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<QQ", len(arrays), len(doc_idx)))
        f.write(sizes.tobytes() + pointers.tobytes() + np.array(doc_idx, dtype=np.int64).tobytes())
    print(prefix, NAMES[dtype], " | ".join(" ".join(str(int(v)) for v in r) for r in rows))


out = sys.argv[1]
write(f"{out}/u16", np.uint16, [[0, 65535, 300], [7], [1, 2]], [0, 2, 3, 3])
write(f"{out}/u32", np.uint32, [[70000], [4294967295, 0, 5]], [0, 2])
write(f"{out}/i16", np.int16, [[-32768, 32767], [-1]], [0, 1, 2, 2])
write(f"{out}/u64", np.uint64, [[0, 2**63 - 1], [3], [2**64 - 1]], [0, 3, 3])

#!/usr/bin/env python3
"""numpy's side of test_data_npy (lib/data/npy.h). Exit 77 without numpy.
Subcommands, one output line per array:
  write DIR                  np.save / format.write_array of every accepted integer
                             dtype, 1-d and 2-d, format versions 1.0, 2.0 and 3.0;
                             prints "FILE DESCR DIMS VALUES..." (DIMS like 3,2)
  read FILE...               np.load(mmap_mode='r') of each; prints the same line
"""
import os
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy not importable")
    sys.exit(77)

DTYPES = ["<i1", "<u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8"]


def line(name, a):
    dims = ",".join(str(d) for d in a.shape)
    return " ".join([name, a.dtype.str, dims] + [str(int(v)) for v in a.reshape(-1)])


def values(descr, n):
    info = np.iinfo(np.dtype(descr))
    lo, hi = max(int(info.min), -2**63), min(int(info.max), 2**63 - 1)
    pool = [lo, hi, 0, 1, lo // 3, hi // 7, 5, hi - 1, lo + 1 if lo < 0 else 2, 3]
    return np.array([pool[i % len(pool)] for i in range(n)], dtype=descr)


def cmd_write(out):
    for descr in DTYPES:
        tag = descr[1:]
        for shape in [(7,), (3, 2), (0,)]:
            a = values(descr, int(np.prod(shape))).reshape(shape)
            dims = "x".join(str(d) for d in shape)
            name = f"{tag}_{dims}_save.npy"
            np.save(os.path.join(out, name), a)
            print(line(name, a))
            for version in [(1, 0), (2, 0), (3, 0)]:
                name = f"{tag}_{dims}_v{version[0]}.npy"
                with open(os.path.join(out, name), "wb") as f:
                    np.lib.format.write_array(f, a, version=version)
                print(line(name, a))


def cmd_read(files):
    for path in files:
        a = np.load(path, mmap_mode="r")
        print(line(os.path.basename(path), np.asarray(a)))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "write":
        cmd_write(args[0])
    elif cmd == "read":
        cmd_read(args)
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()

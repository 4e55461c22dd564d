#!/usr/bin/env python3
"""numpy's side of test_data_npy (lib/data/npy.h, lib/data/index_maps.h).
Exit 77 without numpy. Subcommands, one output line per array or sample:
  write DIR                  np.save / format.write_array of every accepted integer
                             dtype, 1-d and 2-d, format versions 1.0, 2.0 and 3.0;
                             prints "FILE DESCR DIMS VALUES..." (DIMS like 3,2)
  read FILE...               np.load(mmap_mode='r') of each; prints the same line
  samples PREFIX DOC SAMPLE SHUFFLE
                             Megatron's GPTDataset.__getitem__ (written from its
                             description) over the three maps and the indexed
                             dataset PREFIX.bin/.idx read with numpy; prints
                             "IDX TOKENS..." for every dataset index
  build PREFIX SEQ SEED DOC SAMPLE SHUFFLE
                             index maps laid out the way Megatron lays them out (two
                             epochs of documents in one shuffled doc_idx, an empty
                             document first, int64 sample_idx whose row 0 is (0, 0),
                             uint32 shuffle_idx), computed here from token positions
"""
import os
import struct
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


class Indexed:
    """PREFIX.idx / PREFIX.bin read directly with numpy."""
    CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
             8: np.uint16}

    def __init__(self, prefix):
        raw = open(prefix + ".idx", "rb").read()
        assert raw[:9] == b"MMIDIDX\x00\x00", "bad magic"
        (version,) = struct.unpack("<Q", raw[9:17])
        assert version == 1
        code = raw[17]
        n_seq, _ = struct.unpack("<QQ", raw[18:34])
        self.sizes = np.frombuffer(raw, np.int32, n_seq, 34)
        self.pointers = np.frombuffer(raw, np.int64, n_seq, 34 + 4 * n_seq)
        self.dtype = np.dtype(self.CODES[code])
        self.tokens = np.memmap(prefix + ".bin", dtype=self.dtype, mode="r")

    def get(self, seq, offset=0, length=None):
        if length is None:
            length = int(self.sizes[seq]) - offset
        first = int(self.pointers[seq]) // self.dtype.itemsize + offset
        return self.tokens[first:first + length]


def cmd_samples(prefix, doc_path, sample_path, shuffle_path):
    ds = Indexed(prefix)
    doc_idx = np.load(doc_path, mmap_mode="r")
    sample_idx = np.load(sample_path, mmap_mode="r")
    shuffle_idx = np.load(shuffle_path, mmap_mode="r")
    for i in range(sample_idx.shape[0] - 1):
        row = int(shuffle_idx[i])
        first_k, first_off = (int(v) for v in sample_idx[row])
        last_k, last_off = (int(v) for v in sample_idx[row + 1])
        if first_k == last_k:  # the whole sample inside one document
            toks = ds.get(doc_idx[first_k], first_off, last_off - first_off + 1)
        else:  # tail of the first document, whole middle ones, head of the last
            pieces = [ds.get(doc_idx[first_k], first_off)]
            pieces += [ds.get(doc_idx[k]) for k in range(first_k + 1, last_k)]
            pieces.append(ds.get(doc_idx[last_k], 0, last_off + 1))
            toks = np.concatenate(pieces)
        print(i, *[int(t) for t in toks])


def cmd_build(prefix, seq, seed, doc_path, sample_path, shuffle_path):
    ds = Indexed(prefix)
    rng = np.random.RandomState(seed)
    epochs = 2
    doc_idx = np.tile(np.arange(len(ds.sizes), dtype=np.int32), epochs)
    rng.shuffle(doc_idx)
    empty = np.nonzero(ds.sizes[doc_idx] == 0)[0]
    assert len(empty) > 0, "the test dataset needs an empty document"
    doc_idx[[0, empty[0]]] = doc_idx[[empty[0], 0]]
    lengths = ds.sizes[doc_idx].astype(np.int64)
    ends = np.cumsum(lengths)  # tokens through doc_idx[k]
    n = (int(ends[-1]) - 1) // seq
    # Row r >= 1 is stream token r * seq: the document holding it and its offset there.
    pos = np.arange(1, n + 1, dtype=np.int64) * seq
    k = np.searchsorted(ends, pos, side="right")
    rows = np.zeros((n + 1, 2), dtype=np.int64)
    rows[1:, 0] = k
    rows[1:, 1] = pos - (ends[k] - lengths[k])
    shuffle = np.arange(n, dtype=np.uint32)
    rng.shuffle(shuffle)
    np.save(doc_path, doc_idx)
    np.save(sample_path, rows)
    np.save(shuffle_path, shuffle)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "write":
        cmd_write(args[0])
    elif cmd == "read":
        cmd_read(args)
    elif cmd == "samples":
        cmd_samples(*args)
    elif cmd == "build":
        cmd_build(args[0], int(args[1]), int(args[2]), *args[3:])
    else:
        sys.exit(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main()

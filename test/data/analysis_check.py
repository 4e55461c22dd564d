#!/usr/bin/env python3
"""dsprep's data analysis against an independent transcription of DeepSpeed's
DataAnalyzer map and reduce with analyze_data.py's GPT metrics
(total_vocab_freq, vocab_rarity), written here with numpy (and torch for the
rarity sum, as analyze_data.py; math.fsum when torch is missing).

Makes a Megatron dataset and a byte-level vocabulary, runs dsprep with the
flags of ds_analyze_gpt_data_map.sh / _reduce.sh for several worker / thread /
reduce-thread layouts, runs the transcription on the same samples (dumped by
analysis_probe: epoch 0 of the train split) and compares every reduce output,
and every map part file, byte for byte; the percentile lines too.

    analysis_check.py ANALYSIS_PROBE DSPREP
Exit 77 when numpy is missing."""
import csv
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy not importable")
    sys.exit(77)
try:
    import torch
except ImportError:
    torch = None

PROBE, DSPREP = sys.argv[1], sys.argv[2]
SEQ, SEED, SPLIT = 128, 1234, "949,50,1"
VOCAB = 300  # 256 byte tokens, 43 others, <|endoftext|>

# DeepSpeed's dtype codes (data_sampling/indexed_dataset.py), and Megatron's for the token data.
DS_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.uint16, 7: np.uint32,
            8: np.uint64}
MEGATRON_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
                  7: np.float32, 8: np.uint16}


def code_of(dtype, table):
    return next(c for c, t in table.items() if t == dtype)


class Builder:
    """The indexed-dataset builder: items appended, documents closed, other
    files merged in (sizes and doc_idx appended), then the .idx written."""

    def __init__(self, prefix, dtype, table=DS_CODES):
        self.prefix, self.dtype, self.table = prefix, dtype, table
        self.data, self.sizes, self.doc_idx = bytearray(), [], [0]

    def add_item(self, values):
        a = np.array(values, dtype=np.int64).astype(self.dtype).reshape(-1)
        self.data += a.tobytes()
        self.sizes.append(a.size)

    def end_document(self):
        self.doc_idx.append(len(self.sizes))

    def merge(self, prefix):
        dtype, sizes, _, doc_idx, data = read_raw(prefix)
        assert dtype == self.dtype
        base = len(self.sizes)
        self.sizes.extend(int(s) for s in sizes)
        self.doc_idx.extend(int(base + d) for d in doc_idx[1:])
        self.data += data
        assert len(self.data) > 0, "DeepSpeed's merge refuses an empty result"

    def close(self):  # close_mmap_dataset_builder: one more end_document, then finalize
        self.end_document()
        os.makedirs(os.path.dirname(self.prefix), exist_ok=True)
        with open(self.prefix + ".bin", "wb") as f:
            f.write(bytes(self.data))
        item = np.dtype(self.dtype).itemsize
        pointers = np.zeros(len(self.sizes), dtype=np.int64)
        if self.sizes:
            pointers[1:] = np.cumsum(np.array(self.sizes, dtype=np.int64) * item)[:-1]
        with open(self.prefix + ".idx", "wb") as f:
            f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code_of(self.dtype, self.table)))
            f.write(struct.pack("<Q", len(self.sizes)) + struct.pack("<Q", len(self.doc_idx)))
            f.write(np.array(self.sizes, dtype=np.int32).tobytes())
            f.write(pointers.tobytes())
            f.write(np.array(self.doc_idx, dtype=np.int64).tobytes())


def read_raw(prefix, table=DS_CODES):
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    dtype = table[idx[17]]
    n, nd = struct.unpack("<QQ", idx[18:34])
    sizes = np.frombuffer(idx, np.int32, n, 34)
    pointers = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    doc_idx = np.frombuffer(idx, np.int64, nd, 34 + 12 * n)
    return dtype, sizes, pointers, doc_idx, open(prefix + ".bin", "rb").read()


def rows(prefix):
    dtype, sizes, pointers, _, data = read_raw(prefix)
    return [np.frombuffer(data, dtype, int(s), int(p)) for s, p in zip(sizes, pointers)]


def fit_dtype(lo, hi):  # find_fit_int_dtype
    if lo >= 0:
        for t, m in ((np.uint8, 255), (np.uint16, 65535), (np.uint32, 4294967295)):
            if hi <= m:
                return t
        return np.uint64
    for t in (np.int8, np.int16, np.int32):
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return t
    return np.int64


def split_index(start, end, parts):
    b = np.linspace(start, end, dtype=int, num=parts + 1)
    return [(int(b[i]), int(b[i + 1])) for i in range(parts)]


# ---------------------------------------------------------------------------
# The transcription: map of every worker, then reduce.

def map_worker(samples, save, metric, w, W, T, batch, padded, table):
    n = len(samples)
    ws = split_index(0, n, W)[w]
    for t, (a, b) in enumerate(split_index(ws[0], ws[1], T)):
        part = f"{save}/{metric}/worker{w}_thread{t}"
        os.makedirs(part, exist_ok=True)
        if metric == "total_vocab_freq":
            total = None
            for s in range(a, b, batch):
                freq = np.bincount(samples[s:min(b, s + batch)].reshape(-1), minlength=padded + 1).astype(np.int64)
                total = freq if total is None else total + freq
            if total is not None:
                out = Builder(f"{part}/{metric}_metric_value", np.int64)
                out.add_item(total)
                out.close()
            continue
        out = Builder(f"{part}/{metric}_sample_to_metric", np.int64)
        pending = {}
        csv_prefix = f"{part}/{metric}_metric_to_sample"

        def flush(more_than):
            for v in pending:
                if len(pending[v]) > more_than:
                    with open(f"{csv_prefix}_{v}.csv", "a") as f:
                        csv.writer(f).writerows([pending[v]])
                    pending[v] = []

        for s in range(a, b, batch):
            for i in range(s, min(b, s + batch)):
                value = rarity(table, samples[i])
                out.add_item([value])
                pending.setdefault(value, []).append(i)
            flush(100)
        out.close()
        flush(0)


def rarity(table, row):
    if torch is not None:
        return int(torch.sum(table[torch.from_numpy(row.astype(np.int64))]).item())
    return int(math.fsum(table[row]))


def rarity_table(save):
    freq = np.copy(rows(f"{save}/total_vocab_freq/total_vocab_freq_metric_value")[0])
    freq[freq == 0] = 1
    p = np.log(freq / sum(freq)) * -1
    return torch.tensor(p, dtype=torch.double) if torch is not None else p


def reduce_metric(n, save, metric, W, T, R):
    d = f"{save}/{metric}"
    parts = [(w, t) for w in range(W) for t in range(T)]
    if metric == "total_vocab_freq":
        total = None
        for w, t in parts:
            v = np.copy(rows(f"{d}/worker{w}_thread{t}/{metric}_metric_value")[0])
            total = v if total is None else total + v
        out = Builder(f"{d}/{metric}_metric_value", fit_dtype(int(min(total)), int(max(total))))
        out.add_item(total.astype(np.int64))
        out.close()
        return []
    sample_dtype = fit_dtype(0, n - 1)
    unique, count = set(), 0
    for w, t in parts:
        r = rows(f"{d}/worker{w}_thread{t}/{metric}_sample_to_metric")
        unique |= set(int(x) for x in np.unique(np.array(r)))
        count += len(r)
    assert count == n
    value_dtype = fit_dtype(min(unique), max(unique))
    merged = Builder(f"{d}/{metric}_sample_to_metric", value_dtype)
    for k, (a, b) in enumerate(split_index(0, len(parts), R)):
        chunk = Builder(f"{d}/ref_chunk_s2m_{k}", value_dtype)
        for w, t in parts[a:b]:
            for r in rows(f"{d}/worker{w}_thread{t}/{metric}_sample_to_metric"):
                chunk.add_item(r.astype(np.int64))
        chunk.close()
        merged.merge(chunk.prefix)
    merged.close()
    values = sorted(unique)
    to_sample = Builder(f"{d}/{metric}_index_to_sample", sample_dtype)
    to_metric = Builder(f"{d}/{metric}_index_to_metric", value_dtype)
    for k, (a, b) in enumerate(split_index(0, len(values), R)):
        cs = Builder(f"{d}/ref_chunk_i2s_{k}", sample_dtype)
        cm = Builder(f"{d}/ref_chunk_i2m_{k}", value_dtype)
        for v in values[a:b]:
            ids = []
            for w, t in parts:
                name = f"{d}/worker{w}_thread{t}/{metric}_metric_to_sample_{v}.csv"
                if os.path.isfile(name):
                    with open(name) as f:
                        for line in csv.reader(f):
                            ids += [int(x) for x in line]
            cs.add_item(ids)
            cm.add_item([v])
        cs.close()
        cm.close()
        to_sample.merge(cs.prefix)
        to_metric.merge(cm.prefix)
    to_sample.close()
    to_metric.close()
    i2s = rows(to_sample.prefix)
    i2m = rows(to_metric.prefix)
    step = max(1, len(i2s) // 100)
    pct = Builder(f"{d}/{metric}_index_to_sample_percentile_merged", sample_dtype)
    for v in range(0, len(i2s), step):
        pct.add_item(np.concatenate(i2s[v:min(len(i2s), v + step)], axis=None).astype(np.int64))
    pct.close()
    lines, seen, p = [f"Checking the value percentiles of metric {metric}..."], 0, 5
    for k in range(len(i2s)):
        seen += len(i2s[k])
        if seen >= n * p / 100.0:
            lines.append(f"Metric {metric} {p}th percentile: {int(i2m[k][0])}")
            p += 5
    return lines


# ---------------------------------------------------------------------------
# Inputs and the comparison.

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_inputs(tmp):
    import json
    names = [bytes_to_unicode()[b] for b in range(256)] + [f"tok{i}" for i in range(VOCAB - 257)] + ["<|endoftext|>"]
    with open(f"{tmp}/vocab.json", "w") as f:
        json.dump({name: i for i, name in enumerate(names)}, f)
    with open(f"{tmp}/merges.txt", "w") as f:
        f.write("#version: 0.2\n")
    rng = np.random.default_rng(7)
    docs = []
    for _ in range(600):  # each its own mix of zipf-skewed and uniform ids: a wide spread of rarities
        n, common = int(rng.integers(1, 400)), rng.random()
        docs.append(np.where(rng.random(n) < common, np.minimum(rng.zipf(1.3, size=n) - 1, VOCAB - 1),
                             rng.integers(0, VOCAB, size=n)))
    data = Builder(f"{tmp}/data/corpus", np.uint16, MEGATRON_CODES)
    for doc in docs:
        data.add_item(doc)
        data.end_document()
    data.doc_idx.pop()  # Megatron's builder: one end_document per document, no extra one at the end
    data.close()
    return f"{tmp}/data/corpus"


def dsprep(task, metric, save, data, tmp, W, T, extra):
    args = [DSPREP, "--analyzing-task", task, "--analyzing-data-type", "GPT", "--analyzing-metric", metric,
            "--analyzing-num-workers", str(W), "--analyzing-num-threads", str(T), "--vocab-file",
            f"{tmp}/vocab.json", "--merge-file", f"{tmp}/merges.txt", "--data-path", data, "--data-impl", "mmap",
            "--tokenizer-type", "GPT2BPETokenizer", "--micro-batch-size", "10", "--global-batch-size", "10",
            "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--num-layers", "1", "--hidden-size",
            "1", "--num-attention-heads", "1", "--split", SPLIT, "--distributed-backend", "gloo",
            "--train-data-exact-num-epochs", "1", "--return-data-index", "--save-interval", "1", "--save", save]
    r = subprocess.run(args + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: dsprep {' '.join(args + extra)} exited {r.returncode}:\n{r.stdout}")
    return r.stdout


def same(a, b):
    for ext in (".bin", ".idx"):
        if open(a + ext, "rb").read() != open(b + ext, "rb").read():
            return f"{a}{ext} differs from {b}{ext}"
    return None


def check_layout(tmp, data, samples, W, T, R, batch, divisible, specific):
    ours, ref = f"{tmp}/ours_{W}_{T}_{R}", f"{tmp}/ref_{W}_{T}_{R}"
    padded = (VOCAB + divisible - 1) // divisible * divisible
    extra = ["--make-vocab-size-divisible-by", str(divisible)]
    failures = []
    for metric in ("total_vocab_freq", "vocab_rarity"):
        for w in range(W):
            threads = [["--analyzing-specific-threads", str(t)] for t in specific] if w == 1 and specific else [[]]
            for sel in threads:
                dsprep("map", metric, ours, data, tmp, W, T, extra + ["--analyzing-worker-id", str(w)] + sel)
        out = dsprep("reduce", metric, ours, data, tmp, W, T, extra + ["--analyzing-num-threads-reduce", str(R)])
        table = rarity_table(ref) if metric == "vocab_rarity" else None
        for w in range(W):
            map_worker(samples, ref, metric, w, W, T, batch, padded, table)
        want_lines = reduce_metric(len(samples), ref, metric, W, T, R)
        got_lines = [l for l in out.splitlines() if l.startswith("Checking the value") or l.startswith("Metric ")]
        if got_lines != want_lines:
            failures.append(f"{metric}: percentile lines {got_lines} != {want_lines}")
        outputs = ["metric_value"] if metric == "total_vocab_freq" else \
            ["sample_to_metric", "index_to_sample", "index_to_metric", "index_to_sample_percentile_merged"]
        for name in outputs:
            diff = same(f"{ours}/{metric}/{metric}_{name}", f"{ref}/{metric}/{metric}_{name}")
            if diff:
                failures.append(diff)
        part_file = "metric_value" if metric == "total_vocab_freq" else "sample_to_metric"
        for w in range(W):
            for t in range(T):
                diff = same(f"{ours}/{metric}/worker{w}_thread{t}/{metric}_{part_file}",
                            f"{ref}/{metric}/worker{w}_thread{t}/{metric}_{part_file}")
                if diff:
                    failures.append(diff)
    i2s = rows(f"{ours}/vocab_rarity/vocab_rarity_index_to_sample")
    print(f"layout W={W} T={T} R={R}: {len(samples)} samples, {len(i2s)} rarity values, "
          f"{'failures: ' + '; '.join(failures) if failures else 'all files equal'}")
    return failures


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = make_inputs(tmp)
        out = subprocess.run([PROBE, data, SPLIT, str(SEQ), str(SEED), f"{tmp}/samples.i32"], check=True,
                             stdout=subprocess.PIPE, text=True).stdout
        n = int(out.strip())
        samples = np.fromfile(f"{tmp}/samples.i32", dtype=np.int32).reshape(n, SEQ + 1).astype(np.int64)
        failures = []
        for W, T, R, batch, divisible, specific in ((1, 1, 1, 16, 128, []), (2, 3, 2, 7, 128, []),
                                                     (3, 2, 4, 50, 64, [1, 0])):
            failures += check_layout(tmp, data, samples, W, T, R, batch, divisible, specific)
        # How exact the rarity sum is: the correctly rounded sum (what dsprep computes) against torch's.
        table = rarity_table(f"{tmp}/ref_1_1_1")
        p = np.asarray(table)
        off = sum(1 for row in samples if int(math.fsum(p[row])) != rarity(table, row))
        print(f"rarity: int(math.fsum) and int(torch.sum) differ on {off} of {n} samples"
              f"{'' if torch is not None else ' (torch missing: math.fsum used for both)'}")
        if off:
            failures.append(f"{off} samples where torch's sum truncates to another integer than the exact sum")
    if failures:
        print("FAIL")
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()

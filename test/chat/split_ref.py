"""Prints, for each case on the command line ("seed:n:split:phase"), the
indices DeepSpeed-Chat's get_raw_dataset_split_index gives (its arithmetic
and numpy's legacy RandomState shuffle, written out here), one line per case.
Exits 77 when numpy cannot be imported."""
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not importable by", sys.executable)
    sys.exit(77)

for case in sys.argv[1:]:
    seed, size, data_split, phase = case.split(":")
    seed, size, phase = int(seed), int(size), int(phase)
    data_split = data_split.replace(";", ",")
    splits = [float(s) for s in data_split.split(",")]
    splits_sum = sum(splits)
    splits = [split / splits_sum for split in splits]
    splits_index = [0]
    for index, split in enumerate(splits):
        splits_index.append(splits_index[index] + int(round(split * float(size))))
    diff = splits_index[-1] - size
    for index in range(1, len(splits_index)):
        splits_index[index] -= diff
    rng = np.random.RandomState(seed=seed)
    idx = np.arange(start=0, stop=size, step=1, dtype=np.uint32)
    rng.shuffle(idx)
    part = idx[splits_index[phase]:splits_index[phase + 1]]
    print(" ".join(str(int(v)) for v in part))

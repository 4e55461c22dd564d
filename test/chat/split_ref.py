"""Prints, for each case on the command line ("seed:n:split:phase"), the
indices DeepSpeed-Chat's get_raw_dataset_split_index gives (its arithmetic
and numpy's legacy RandomState shuffle, written out here), one line per case;
for "blend:seed:split:phase:n1;n2;..." the order create_prompt_dataset gives
the step's examples of several datasets ("d.i": example i of dataset d); for
"sftonly:seed:split:phase:n1;n2;...:m1;m2;..." that order with SFT-only
datasets of sizes m appended ("sd.i") and the whole shuffled.
Exits 77 when numpy cannot be imported."""
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not importable by", sys.executable)
    sys.exit(77)

def split_index(seed, size, data_split, phase):
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
    return idx[splits_index[phase]:splits_index[phase + 1]].tolist()



def shuffled(seed, parts):
    """get_shuffle_idx(seed, len(parts)) applied: create_prompt_dataset's Subset."""
    rng = np.random.RandomState(seed=seed)
    order = np.arange(start=0, stop=len(parts), step=1, dtype=np.uint32)
    rng.shuffle(order)
    return [parts[int(k)] for k in order]


def blended(seed, data_split, phase, sizes):
    """The step's examples of datasets of `sizes` ("d.i": example i of dataset d)."""
    parts = []
    for d, n in enumerate(sizes):
        parts += [f"{d}.{i}" for i in split_index(seed, n, data_split, phase - 1)]
    return shuffled(seed, parts) if len(sizes) > 1 else parts  # only a blend is shuffled


def main():
    for case in sys.argv[1:]:
        if case.startswith("sftonly:"):  # sftonly:seed:split:phase:n1;n2:m1;m2 -> blend, then SFT-only appended
            _, seed, data_split, phase, sizes, sft_sizes = case.split(":")
            seed, phase = int(seed), int(phase)
            parts = blended(seed, data_split.replace(";", ","), phase, [int(v) for v in sizes.split(";")])
            for d, n in enumerate(int(v) for v in sft_sizes.split(";")):
                parts += [f"s{d}.{i}" for i in split_index(seed, n, "10,0,0", 0)]
            print(" ".join(shuffled(seed, parts)))
            continue
        if case.startswith("blend:"):  # blend:seed:split:phase(1-based):n1;n2;... -> "d.i" of the blended order
            _, seed, data_split, phase, sizes = case.split(":")
            print(" ".join(blended(int(seed), data_split.replace(";", ","), int(phase),
                                   [int(v) for v in sizes.split(";")])))
            continue
        seed, size, data_split, phase = case.split(":")
        part = split_index(int(seed), int(size), data_split.replace(";", ","), int(phase))
        print(" ".join(str(int(v)) for v in part))


if __name__ == "__main__":
    main()

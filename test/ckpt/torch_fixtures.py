"""Writes PyTorch files for test_torch_file into OUT: ok.pt (a state dict of
several dtypes, a transposed view, a view with an offset, nested containers
and plain values), linear.pt (an nn.Linear state dict: an OrderedDict of
Parameters), evil.pt (an object whose unpickling would call os.system),
legacy.pt (the pre-1.6 format), cycle.pt and deep.pt (hand-made pickles:
a list holding itself, lists nested 100 deep), and for every tensor of ok.pt and linear.pt
its contiguous bytes (NAME.bin) and a line "file name dtype dims..." in
expected.txt. Exits 77 when torch cannot be imported."""
import os
import sys

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable by", sys.executable)
    sys.exit(77)

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
g = torch.Generator().manual_seed(5)
base = torch.randn(10, generator=g)
wide = torch.randn(5, 6, generator=g)
ok = {
    "a": torch.randn(3, 4, generator=g),
    "b": {"c": torch.randn(7, generator=g).half(), "d": torch.randn(2, 3, generator=g).bfloat16()},
    "e": torch.arange(6, dtype=torch.int64).reshape(2, 3) - 2,
    "t": wide.t(),          # non-contiguous, shares nothing
    "v": base[2:5],         # a view at an offset of a shared storage
    "w": base,              # the same storage whole
    "i32": torch.tensor([1, -2, 3], dtype=torch.int32),
    "u8": torch.tensor([0, 255, 7], dtype=torch.uint8),
    "n": 7,
    "neg": -123456789012,
    "x": 0.25,
    "s": "hello",
    "flag": True,
    "none": None,
    "lst": [torch.ones(2), 3],
}
torch.save(ok, os.path.join(out, "ok.pt"))
lin = torch.nn.Linear(4, 3)
torch.save(lin.state_dict(), os.path.join(out, "linear.pt"))


class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + os.path.join(out, "pwned"),))


torch.save({"x": Evil()}, os.path.join(out, "evil.pt"))
torch.save({"a": torch.ones(2)}, os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)

# Hand-made pickles in torch.save's zip layout: a list appended to itself
# (a cycle) and lists nested 100 deep.
import zipfile
for name, pkl in [("cycle", b"\x80\x02]q\x00h\x00a."), ("deep", b"\x80\x02" + b"]" * 100 + b"a" * 99 + b".")]:
    with zipfile.ZipFile(os.path.join(out, name + ".pt"), "w", zipfile.ZIP_STORED) as z:
        z.writestr(name + "/data.pkl", pkl)

names = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "int64": "i64", "int32": "i32", "uint8": "u8"}
with open(os.path.join(out, "expected.txt"), "w") as f:
    def emit(file, name, t):
        t = t.detach().contiguous()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        with open(os.path.join(out, file + "." + name + ".bin"), "wb") as b:
            b.write(raw.numpy().tobytes())
        f.write(" ".join([file, name, names[str(t.dtype).replace("torch.", "")]] + [str(s) for s in t.shape]) + "\n")
    for name, t in [("a", ok["a"]), ("b.c", ok["b"]["c"]), ("b.d", ok["b"]["d"]), ("e", ok["e"]), ("t", ok["t"]),
                    ("v", ok["v"]), ("w", ok["w"]), ("i32", ok["i32"]), ("u8", ok["u8"]), ("lst.0", ok["lst"][0])]:
        emit("ok", name, t)
    for name, t in lin.state_dict().items():
        emit("linear", name, t)

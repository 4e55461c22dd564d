#!/usr/bin/env python3
"""dsgen end to end on models dstrain trained (a synthetic corpus, a BPE
tokenizer trained on it, two small models: GPT-2 and LLaMA blocks, a few
dozen steps each, saved as checkpoints and exported to Hugging Face format).
  dsgen_check.py models BUILD DIR   trains the models into DIR (the ctest fixture)
  dsgen_check.py cli BUILD DIR      prompts, prompt files, stdin, sampling, errors, the checkpoint's tokenizer
  dsgen_check.py tp BUILD DIR       dsrun with 2 tensor-parallel ranks == 1 process
  dsgen_check.py hf BUILD DIR       greedy tokens == transformers' generate() (exit 77 without it)
  dsgen_check.py temporaries BUILD DIR   saves and exports after killed ones: stale temporaries removed
Each mode prints what it compared and exits non-zero on the first mismatch."""
import array, json, os, socket, struct, subprocess, sys, tempfile

MODE, BUILD, DIR = sys.argv[1], sys.argv[2], sys.argv[3]
DSPREP = f"{BUILD}/apps/dsprep/dsprep"
DSTRAIN = f"{BUILD}/apps/dstrain/dstrain"
DSGEN = f"{BUILD}/apps/dsgen/dsgen"
DSRUN = f"{BUILD}/apps/dsrun/dsrun"
DSCONVERT = f"{BUILD}/apps/dsconvert/dsconvert"
PROMPTS = ["The", "Once upon a time there was", "In the morning the", "A small village near the river had"]
NEW = 64

if MODE == "hf":
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except Exception as e:  # environment dependent
        print(f"SKIP: transformers/torch not importable ({e}); scripts/setup.sh installs them")
        sys.exit(77)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def run(args, stdin=None, env=None, expect=0):
    p = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env)
    if p.returncode != expect:
        fail(f"{' '.join(args)} exited {p.returncode} (expected {expect})\nstdout: {p.stdout[-2000:]}\n"
             f"stderr: {p.stderr[-3000:]}")
    return p


def build_models(d):
    """Corpus, tokenizer, dataset, and a checkpoint + HF export per family."""
    run([DSPREP, "--generate-corpus", f"{d}/corpus.txt", "--size-mb", "0.2", "--seed", "1"])
    run([DSPREP, "--train-tokenizer", "--input", f"{d}/corpus.txt", "--vocab-size", "512", "--output-dir", f"{d}/tok"])
    run([DSPREP, "--input", f"{d}/corpus.txt", "--output-prefix", f"{d}/data/corpus",
         "--vocab-file", f"{d}/tok/vocab.json", "--merge-file", f"{d}/tok/merges.txt"])
    for family in ("gpt2", "llama", "opt"):
        model = {"family": "gpt2" if family == "opt" else family, "num_layers": 2, "hidden_size": 64, "num_heads": 4, "seq_length": 64,
                 "max_position_embeddings": 128, "make_vocab_size_divisible_by": 128}
        if family == "llama":
            model["num_key_value_heads"] = 2
        if family == "opt":  # GPT-2 blocks with ReLU: exported as OPTForCausalLM
            model.update({"activation": "relu", "embedding_dropout": 0.0})
        cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
               "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
               "model": model,
               "data": {"data_path": f"{d}/data/corpus", "split": "100,0,0",
                        "vocab_file": f"{d}/tok/vocab.json", "merge_file": f"{d}/tok/merges.txt"},
               "training": {"train_iters": 60, "seed": 7, "lr_warmup_iters": 4, "log_interval": 60,
                            "eval_interval": 1000, "save": f"{d}/{family}/ckpt", "save_interval": 60,
                            "export_hf": f"{d}/{family}/hf"}}
        with open(f"{d}/{family}.json", "w") as f:
            json.dump(cfg, f)
        run([DSTRAIN, "--config", f"{d}/{family}.json"])
    with open(f"{d}/prompts.jsonl", "w") as f:
        for p in PROMPTS:
            f.write(json.dumps({"prompt": p}) + "\n")


def tok_flags(d):
    """The run's tokenizer, named explicitly (flags win over the copy a checkpoint holds)."""
    return ["--vocab-file", f"{d}/tok/vocab.json", "--merge-file", f"{d}/tok/merges.txt"]


def gen_jsonl(d, args, launcher=()):
    out = f"{d}/out-{abs(hash(tuple(args)))}.jsonl"
    run(list(launcher) + [DSGEN] + args + ["--prompt-file", f"{d}/prompts.jsonl", "--output-file", out])
    with open(out) as f:
        return [json.loads(line) for line in f]


def check_cli(d):
    for family in ("gpt2", "llama"):
        load = ["--load", f"{d}/{family}/ckpt", "--max-new-tokens", "24"] + tok_flags(d)
        rows = gen_jsonl(d, load)
        if len(rows) != len(PROMPTS) or any(r["prompt"] != p for r, p in zip(rows, PROMPTS)):
            fail(f"{family}: prompt file rows {rows}")
        if not any(len(r["tokens"]) > 0 and r["text"] for r in rows):
            fail(f"{family}: nothing generated")
        # The KV cache gives the tokens of recomputing the whole prefix; batch size 1 the tokens of a batch of 4.
        if gen_jsonl(d, load + ["--no-kv-cache"]) != rows:
            fail(f"{family}: --no-kv-cache differs from the KV-cache path")
        if family == "llama" and gen_jsonl(d, load + ["--batch-size", "1"]) != rows:
            fail(f"{family}: --batch-size 1 differs from one batch of 4")
        # Under dsrun (which passes --local_rank=0, as DeepSpeed's launcher does).
        if family == "gpt2" and gen_jsonl(d, load, [DSRUN, "--include", "localhost:0", "--master_port", str(free_port())]) != rows:
            fail(f"{family}: one rank through dsrun differs from the plain process")
        # --prompt prints prompt + generation; the same text as the prompt file gives.
        p = run([DSGEN] + load + ["--prompt", PROMPTS[1]])
        if p.stdout != PROMPTS[1] + rows[1]["text"] + "\n":
            fail(f"{family}: --prompt printed {p.stdout!r}, expected {PROMPTS[1] + rows[1]['text']!r}")
        # stdin: one prompt per line, streamed; the same text.
        p = run([DSGEN] + load, stdin=PROMPTS[1] + "\n" + PROMPTS[2] + "\n")
        want = PROMPTS[1] + rows[1]["text"] + "\n" + PROMPTS[2] + rows[2]["text"] + "\n"
        if p.stdout != want:
            fail(f"{family}: stdin mode printed {p.stdout!r}, expected {want!r}")
        if family == "gpt2":  # the rest is family-independent; once is enough (time)
            print(f"{family}: prompt file, --prompt, stdin, --no-kv-cache, batching: ok")
            continue
        # Sampling: a fixed seed repeats, another seed differs.
        samp = load + ["--temperature", "1.2", "--top-k", "40", "--top-p", "0.95", "--repetition-penalty", "1.1"]
        a = gen_jsonl(d, samp + ["--seed", "5"])
        if gen_jsonl(d, samp + ["--seed", "5"]) != a:
            fail(f"{family}: sampling with --seed 5 is not reproducible")
        if gen_jsonl(d, samp + ["--seed", "6"]) == a or a == rows:
            fail(f"{family}: sampling ignores the seed or equals greedy")
        # A stop string cuts the text before it.
        text = rows[1]["text"]
        stop = text[len(text) // 2:len(text) // 2 + 3] if len(text) > 8 else None
        if stop and stop.strip():
            r = gen_jsonl(d, load + ["--stop", stop])[1]
            if r["text"] != text[:text.find(stop)] or r["stop_reason"] != "stop":
                fail(f"{family}: --stop {stop!r} gave {r}")
        print(f"{family}: prompt file, --prompt, stdin, --no-kv-cache, batching, seeds, --stop: ok "
              f"(e.g. {PROMPTS[1]!r} -> {rows[1]['text'][:60]!r})")
    # User errors: one line naming the input, exit 1, no output file.
    ck = f"{d}/gpt2/ckpt"
    out = f"{d}/never.jsonl"
    ckt = ["--load", ck] + tok_flags(d)
    import shutil
    notok = f"{d}/hf-notok"  # an export without tokenizer files
    shutil.rmtree(notok, ignore_errors=True)
    os.makedirs(notok)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{d}/gpt2/hf/{name}", notok)
    for args, needle in [(["--load", f"{d}/nowhere"], "nowhere"),
                         (ckt + ["--top-p", "0", "--prompt", "x"], "--top-p"),
                         (ckt + ["--temperature", "0", "--prompt", "x"], "--temperature"),
                         (ckt + ["--prompt-file", f"{d}/missing.jsonl", "--output-file", out], "missing.jsonl"),
                         (ckt + ["--prompt", "word " * 200], "context"),
                         (ckt + ["--init-from", f"{d}/gpt2/hf"], "excludes"),
                         (["--init-from", notok, "--prompt", "x"], "tokenizer"),
                         (ckt + ["--tensor-model-parallel-size", "2", "--prompt", "x"], "dsrun"),
                         (["--load", ck, "--vocab-file", f"{d}/nope.json", "--merge-file", "m", "--prompt", "x"],
                          "nope.json")]:
        p = run([DSGEN] + args, expect=1)
        lines = p.stderr.strip().splitlines()
        if len(lines) != 1 or needle not in lines[0] or "error" not in lines[0]:
            fail(f"dsgen {' '.join(args)[:80]}: expected one error line naming {needle!r}, got {p.stderr!r}")
    if os.path.exists(out):
        fail("a failed run left its --output-file behind")
    print("errors: 9 user errors, one line each, exit 1: ok")
    check_prompt_faults(d)
    check_saved_tokenizer_paths(d)
    check_tokenizer_copies(d)
    check_crafted_limits(d)
    check_larger_vocab(d)
    check_tokenizer_files(d)


def check_prompt_faults(d):
    """Prompts that cannot be generated for, out-of-range sampling values and NaN weights."""
    load = ["--load", f"{d}/gpt2/ckpt", "--max-new-tokens", "8"] + tok_flags(d)
    good = run([DSGEN] + load, stdin=PROMPTS[1] + "\n").stdout
    # stdin: a too-long prompt and one with a NUL are an error line each, not echoed; the next line still runs.
    p = subprocess.run([DSGEN] + load, input=("word " * 200 + "\n" + "a\0b\n" + PROMPTS[1] + "\n").encode(),
                       capture_output=True)
    err = p.stderr.decode(errors="replace")
    lines = err.strip().splitlines()
    if (p.returncode != 1 or p.stdout.decode() != good or len(lines) != 3 or "stdin line 1: prompt 1 has" not in lines[0]
            or "stdin line 2: prompt 2 holds a NUL byte" not in lines[1] or "2 stdin prompts failed" not in lines[2]):
        fail(f"stdin faults: exit {p.returncode}, stdout {p.stdout[:200]!r} (expected {good!r}), stderr {err!r}")
    # --prompt: a too-long prompt is refused before it is echoed.
    p = run([DSGEN] + load + ["--prompt", "word " * 200], expect=1)
    if p.stdout or not one_line(p, "prompt 1 has"):
        fail(f"--prompt too long: stdout {p.stdout[:100]!r}, stderr {p.stderr!r}")
    with open(f"{d}/nul.jsonl", "w") as f:
        f.write(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"prompt": "a\u0000b"}) + "\n")
    p = run([DSGEN] + load + ["--prompt-file", f"{d}/nul.jsonl"], expect=1)
    if not one_line(p, "nul.jsonl: line 2 holds a NUL character"):
        fail(f"--prompt-file with a NUL: {p.stderr!r}")
    # Sampling values echoed as given, never as inf.
    for flag, value in [("--temperature", "1e300"), ("--top-p", "0x1p-1"), ("--repetition-penalty", "1e-60")]:
        p = run([DSGEN] + load + [flag, value, "--prompt", "x"], expect=1)
        if not one_line(p, f"{flag} '{value}' is not a decimal number within float range") or "inf" in p.stderr:
            fail(f"{flag} {value}: {p.stderr!r}")
    # NaN weights: an error naming the prompt and step, exit 1 (not token 0 with exit 0).
    def nan_bias(header, data):
        e = header["transformer.ln_f.bias"]
        n = (e["data_offsets"][1] - e["data_offsets"][0]) // 4
        return {"transformer.ln_f.bias": (e["shape"], array.array("f", [float("nan")] * n).tobytes())}
    nan = crafted_hf(d, "nan", {}, nan_bias)
    p = run([DSGEN, "--init-from", nan, "--prompt", "x"] + tok_flags(d), expect=1)
    if not one_line(p, "prompt 1, generated token 1: the model's logits are not finite"):
        fail(f"NaN weights: {p.stderr!r}")
    print("prompt faults: stdin goes on past a too-long or NUL prompt (exit 1), --prompt refused before its echo, "
          "NUL in a prompt file, sampling values echoed as given, NaN weights: one error line each: ok")


def check_saved_tokenizer_paths(d):
    """A checkpoint's config names tokenizer files: dsgen uses them on its own only inside the checkpoint
    directory. state.json is edited as an older, unversioned file (no checksum to update), the way a
    crafted checkpoint would be."""
    import shutil
    ck = f"{d}/crafted/ckpt"
    shutil.rmtree(f"{d}/crafted", ignore_errors=True)
    shutil.copytree(f"{d}/gpt2/ckpt", ck)
    shutil.copytree(f"{d}/tok", f"{ck}/tok")
    with open(f"{d}/crafted/secret.txt", "w") as f:
        f.write("SECRET-hunter2 not a tokenizer\n")
    os.symlink(f"{d}/crafted/secret.txt", f"{ck}/tok/link.txt")
    step = open(f"{ck}/latest").read().strip()
    state_file = f"{ck}/{step}/state.json"
    state = json.load(open(state_file))
    for key in ("state_checksum", "format_version"):
        state.pop(key, None)
    copies = state.pop("tokenizer")  # as a checkpoint from before the copies: the config's paths count

    def with_paths(vocab, merges):
        state["config"]["data"]["vocab_file"], state["config"]["data"]["merge_file"] = vocab, merges
        with open(state_file, "w") as f:
            json.dump(state, f)

    want = gen_jsonl(d, ["--load", f"{d}/gpt2/ckpt", "--max-new-tokens", "8"] + tok_flags(d))
    with_paths("tok/vocab.json", "tok/merges.txt")  # relative to the checkpoint directory: used
    if gen_jsonl(d, ["--load", ck, "--max-new-tokens", "8"]) != want:
        fail("tokenizer files inside the checkpoint directory gave other text")
    for vocab, merges in [(f"{d}/crafted/secret.txt", "tok/merges.txt"), ("../secret.txt", "tok/merges.txt"),
                          ("tok/vocab.json", "tok/link.txt"), (f"{d}/tok/vocab.json", f"{d}/tok/merges.txt")]:
        with_paths(vocab, merges)
        p = run([DSGEN, "--load", ck, "--prompt", "x"], expect=1)
        lines = p.stderr.strip().splitlines()
        if len(lines) != 1 or "--vocab-file" not in lines[0] or "SECRET" in p.stderr or "hunter2" in p.stderr:
            fail(f"stored tokenizer paths {vocab!r}, {merges!r}: expected one refusal line, got {p.stderr!r}")
        # Naming the tokenizer explicitly still works.
        if gen_jsonl(d, ["--load", ck, "--max-new-tokens", "8"] + tok_flags(d)) != want:
            fail("explicit tokenizer flags on a checkpoint with outside paths gave other text")
    # The copies' names in state.json "tokenizer": only the copies' own names, and only real files inside.
    state["tokenizer"] = dict(copies, vocab_file="../secret.txt")
    with_paths("tok/vocab.json", "tok/merges.txt")
    p = run([DSGEN, "--load", ck, "--prompt", "x"], expect=1)
    if len(p.stderr.strip().splitlines()) != 1 or "tokenizer.vocab_file" not in p.stderr:
        fail(f"state.json tokenizer naming '../secret.txt': expected one refusal line, got {p.stderr!r}")
    state["tokenizer"] = copies
    with_paths("tok/vocab.json", "tok/merges.txt")
    os.remove(f"{ck}/{step}/vocab.json")
    os.symlink(f"{d}/crafted/secret.txt", f"{ck}/{step}/vocab.json")
    p = run([DSGEN, "--load", ck, "--prompt", "x"], expect=1)
    if len(p.stderr.strip().splitlines()) != 1 or "vocab.json" not in p.stderr or "SECRET" in p.stderr:
        fail(f"a copied vocab.json linking out of the checkpoint: expected one refusal line, got {p.stderr!r}")
    print("saved tokenizer paths: used inside the checkpoint directory; outside, '..', a link out and an "
          "absolute path elsewhere are refused without reading them (the copies' names too); flags override: ok")


def same_bytes(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def check_tokenizer_copies(d):
    """dstrain copies the run's tokenizer into each step directory (state.json's checksums cover it): dsgen --load
    needs no tokenizer flags, dsconvert carries the copies into its output and its HF export, and a corrupted copy
    is refused by its checksum with one line naming the file."""
    import shutil
    for family in ("gpt2", "llama"):
        ck = f"{d}/{family}/ckpt"
        step = open(f"{ck}/latest").read().strip()
        base = ["--max-new-tokens", "24"]
        want = gen_jsonl(d, ["--load", ck] + base + tok_flags(d))
        for name in ("vocab.json", "merges.txt"):
            if not same_bytes(f"{ck}/{step}/{name}", f"{d}/tok/{name}"):
                fail(f"{family}: {ck}/{step}/{name} is not the run's {name}")
        if gen_jsonl(d, ["--load", ck] + base) != want:
            fail(f"{family}: --load without tokenizer flags gave other text than with them")
        conv, hf = f"{d}/conv/{family}", f"{d}/conv/{family}-hf"
        shutil.rmtree(conv, ignore_errors=True)
        shutil.rmtree(hf, ignore_errors=True)
        run([DSCONVERT, "--load", ck, "--save", conv, "--target-tp", "2", "--target-dp", "1"])
        run([DSCONVERT, "--load", ck, "--export-hf", hf])
        for out in (f"{conv}/{step}", hf, f"{d}/{family}/hf"):
            for name in ("vocab.json", "merges.txt"):
                if not same_bytes(f"{out}/{name}", f"{d}/tok/{name}"):
                    fail(f"{family}: {out}/{name} is not the run's {name}")
        if gen_jsonl(d, ["--load", conv] + base) != want:
            fail(f"{family}: --load of dsconvert's output without tokenizer flags gave other text")
        for h in (hf, f"{d}/{family}/hf"):
            if gen_jsonl(d, ["--init-from", h] + base) != want:
                fail(f"{family}: --init-from {h} without tokenizer flags gave other text")
    # A corrupted copy: one line naming it from dsgen and dsconvert, nothing written; flags still work.
    bad = f"{d}/corrupt/ckpt"
    shutil.rmtree(f"{d}/corrupt", ignore_errors=True)
    shutil.copytree(f"{d}/gpt2/ckpt", bad)
    step = open(f"{bad}/latest").read().strip()
    with open(f"{bad}/{step}/vocab.json", "r+b") as f:
        f.seek(10)
        c = f.read(1)
        f.seek(10)
        f.write(bytes([c[0] ^ 0x20]))
    for args in ([DSGEN, "--load", bad, "--prompt", "x"],
                 [DSCONVERT, "--load", bad, "--save", f"{d}/corrupt/out", "--target-tp", "1", "--target-dp", "1"],
                 [DSCONVERT, "--load", bad, "--export-hf", f"{d}/corrupt/hf"]):
        p = run(args, expect=1)
        lines = p.stderr.strip().splitlines()
        if len(lines) != 1 or f"{bad}/{step}/vocab.json" not in lines[0] or "corrupt" not in lines[0]:
            fail(f"{os.path.basename(args[0])} on a corrupted vocab.json copy: expected one line naming it, "
                 f"got {p.stderr!r}")
    if os.path.exists(f"{d}/corrupt/out") or os.path.exists(f"{d}/corrupt/hf"):
        fail("dsconvert left output behind after refusing a corrupted tokenizer copy")
    if gen_jsonl(d, ["--load", bad, "--max-new-tokens", "24"] + tok_flags(d)) != \
            gen_jsonl(d, ["--load", f"{d}/gpt2/ckpt", "--max-new-tokens", "24"] + tok_flags(d)):
        fail("explicit tokenizer flags on a checkpoint with a corrupted copy gave other text")
    print("tokenizer copies: --load without flags == with flags (gpt2, llama), dsconvert --save and --export-hf "
          "and dstrain's export carry them, a corrupted copy is refused naming the file: ok")


def read_safetensors(path):
    """(header dict, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_safetensors(path, header, data, replace):
    """The file of (header, data) with the tensors named in `replace` given new (shape, bytes)."""
    out, blobs, off = {}, [], 0
    for name, e in sorted(header.items()):
        if name == "__metadata__":
            out[name] = e
            continue
        shape, raw = replace.get(name, (e["shape"], data[e["data_offsets"][0]:e["data_offsets"][1]]))
        out[name] = {"dtype": e["dtype"], "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(out).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def crafted_hf(d, name, config_edit, replace=None):
    """A copy of the GPT-2 HF export with config.json fields (and tensors) replaced."""
    import shutil
    out = f"{d}/crafted_hf/{name}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(f"{d}/gpt2/hf", out)
    cfg = json.load(open(f"{out}/config.json"))
    cfg.update(config_edit)
    with open(f"{out}/config.json", "w") as f:
        json.dump(cfg, f)
    if replace:
        header, data = read_safetensors(f"{out}/model.safetensors")
        write_safetensors(f"{out}/model.safetensors", header, data, replace(header, data))
    return out


def one_line(p, needle):
    """The run's stderr is one user error line holding `needle`."""
    return (len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr and "error" in p.stderr
            and "internal" not in p.stderr)


def check_crafted_limits(d):
    """A config.json with sizes past the model limits, or unlike the weights' header: one error line each."""
    for edit, needle in [({"n_layer": 100000000}, "n_layer 100000000 is more than the 65536 layers"),
                         ({"n_embd": 1000000000, "n_head": 1}, "n_embd 1000000000"),
                         ({"n_layer": 3}, "tensor 'transformer.h.2.ln_1.weight' is missing"),
                         ({"n_embd": 128}, "tensor 'transformer.wte.weight' is (")]:
        hf = crafted_hf(d, "limits", edit)
        p = run([DSGEN, "--init-from", hf, "--prompt", "x"] + tok_flags(d), expect=1)
        if not one_line(p, needle) or ("transformer" in needle and "config.json" not in p.stderr):
            fail(f"config.json {edit}: expected one error line naming {needle!r}, got {p.stderr!r}")
    print("config.json past the model limits or unlike the weights' header: one error line each: ok")


def check_larger_vocab(d):
    """A model vocabulary larger than the tokenizer's (as Pythia and Qwen2 ship) never yields the ids past it."""
    # A model vocabulary of twice the tokenizer's, the extra rows ten times the real ones (tied output), so
    # that without the mask an extra id would win: the text equals the original model's.
    def doubled(header, data):
        e = header["transformer.wte.weight"]
        rows = array.array("f", data[e["data_offsets"][0]:e["data_offsets"][1]])
        extra = array.array("f", (10 * x for x in rows))
        return {"transformer.wte.weight": ([2 * e["shape"][0], e["shape"][1]], (rows + extra).tobytes())}
    V = json.load(open(f"{d}/gpt2/hf/config.json"))["vocab_size"]
    big = crafted_hf(d, "bigvocab", {"vocab_size": 2 * V}, doubled)
    args = ["--max-new-tokens", "24", "--prompt-file", f"{d}/prompts.jsonl"] + tok_flags(d)
    out_big, out_ref = f"{d}/crafted_hf/big.jsonl", f"{d}/crafted_hf/ref.jsonl"
    p = run([DSGEN, "--init-from", big, "--output-file", out_big] + args)
    run([DSGEN, "--init-from", f"{d}/gpt2/hf", "--output-file", out_ref] + args)
    rows_big, rows_ref = ([json.loads(line) for line in open(f)] for f in (out_big, out_ref))
    if rows_big != rows_ref:
        fail(f"a model vocabulary larger than the tokenizer's changed the greedy text: {rows_big} vs {rows_ref}")
    note = f"the model's vocabulary has {2 * V} ids, the tokenizer's {V}; ids {V} and up are never generated"
    if p.stderr.count(note) != 1:
        fail(f"expected the note {note!r} once, got {p.stderr!r}")
    sampled = gen_jsonl(d, ["--init-from", big, "--max-new-tokens", "24", "--temperature", "1.5"] + tok_flags(d))
    if any(t >= V for r in sampled for t in r["tokens"]):
        fail(f"sampling generated ids past the tokenizer's vocabulary {V}")
    print(f"model vocabulary {2 * V} > tokenizer's {V}: greedy text unchanged, sampling within it, noted once: ok")


def check_tokenizer_files(d):
    """Tokenizer paths that are a directory or a device are refused by name before any read."""
    ck = ["--load", f"{d}/gpt2/ckpt", "--prompt", "x"]
    for args, needle in [(["--vocab-file", f"{d}/tok", "--merge-file", f"{d}/tok/merges.txt"],
                          f"vocab file '{d}/tok' is not a regular file (it is a directory)"),
                         (["--vocab-file", f"{d}/tok/vocab.json", "--merge-file", "/dev/zero"],
                          "merges file '/dev/zero' is not a regular file (it is a character device)")]:
        p = run([DSGEN] + ck + args, expect=1)
        if not one_line(p, needle):
            fail(f"dsgen {' '.join(args)}: expected one error line naming {needle!r}, got {p.stderr!r}")
    print("tokenizer files that are a directory or /dev/zero: one error line each: ok")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def check_tp(d):
    for family in ("gpt2", "llama"):
        load = ["--load", f"{d}/{family}/ckpt", "--max-new-tokens", "24"] + tok_flags(d)
        one = gen_jsonl(d, load)
        launcher = [DSRUN, "--include", "localhost:0,1", "--master_port", str(free_port())]
        two = gen_jsonl(d, load + ["--tensor-model-parallel-size", "2"], launcher)
        if one != two:
            fail(f"{family}: TP 2 through dsrun differs from one process:\n{one}\n{two}")
        samp = ["--temperature", "1.0", "--top-k", "20", "--seed", "3"]
        if family == "llama" and gen_jsonl(d, load + samp) != gen_jsonl(d, load + samp + ["--tensor-model-parallel-size", "2"],
                                                   [DSRUN, "--include", "localhost:0,1", "--master_port",
                                                    str(free_port())]):
            fail(f"{family}: seeded sampling differs between TP 2 and one process")
        print(f"{family}: dsrun --include localhost:0,1 dsgen --tensor-model-parallel-size 2 == 1 process "
              f"(greedy{' and seeded sampling' if family == 'llama' else ''}, {len(one)} prompts): ok")


def check_hf(d):
    for family, arch in (("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"), ("opt", "OPTForCausalLM")):
        hf = f"{d}/{family}/hf"
        ours = gen_jsonl(d, ["--init-from", hf, "--max-new-tokens", str(NEW)] + tok_flags(d))
        from_ckpt = gen_jsonl(d, ["--load", f"{d}/{family}/ckpt", "--max-new-tokens", str(NEW)] + tok_flags(d))
        if ours != from_ckpt:
            fail(f"{family}: --init-from of the export differs from --load of the checkpoint")
        model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32)
        if type(model).__name__ != arch:
            fail(f"{family}: transformers loaded {type(model).__name__}")
        eos = model.config.eos_token_id
        total = 0
        for r in ours:
            ids = torch.tensor([r["prompt_tokens"]])
            with torch.no_grad():
                out = model.generate(ids, do_sample=False, max_new_tokens=NEW, attention_mask=torch.ones_like(ids),
                                     pad_token_id=eos)
            theirs = out[0, ids.shape[1]:].tolist()
            if theirs and theirs[-1] == eos:  # transformers keeps the eos it stopped at; dsgen drops it
                theirs = theirs[:-1]
            if theirs != r["tokens"]:
                fail(f"{family}: prompt {r['prompt']!r}: dsgen {r['tokens']} transformers {theirs}")
            total += len(theirs)
        if total < NEW:
            fail(f"{family}: only {total} tokens compared")
        print(f"{family}: greedy tokens identical to transformers {transformers.__version__} generate() "
              f"({arch}, {len(ours)} prompts, {total} tokens): ok")


def check_temporaries(d):
    """Temporaries a killed dstrain / dsconvert leaves (NAME.tmp.<pid>, an export's OUT.tmp-<pid>) are removed by
    the next save or export when their pid is dead and never committed into its step; a live process's stay."""
    import shutil
    p = subprocess.Popen(["true"])
    p.wait()
    dead, live = str(p.pid), str(os.getpid())  # this script is the parent of every tool it runs: alive
    t = f"{d}/temps"
    shutil.rmtree(t, ignore_errors=True)

    def plant(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("partial")
        return path

    def check(out, stale, alive, what):
        for root, dirs, files in os.walk(out):
            for name in dirs + files:
                if ".tmp" in name:
                    fail(f"{what}: {os.path.join(root, name)} is in the output")
        for path in stale:
            if os.path.exists(path):
                fail(f"{what}: the stale temporary {path} was left")
        for path in alive:
            if not os.path.exists(path):
                fail(f"{what}: a live process's temporary {path} was removed")

    # dstrain --save: a killed save of the same step left a partial file in its temporary step directory.
    cfg = json.load(open(f"{d}/gpt2.json"))
    cfg["training"].update({"train_iters": 4, "save_interval": 4, "lr_warmup_iters": 1, "save": f"{t}/ckpt",
                            "export_hf": ""})
    with open(f"{t}.json", "w") as f:
        json.dump(cfg, f)
    stale = [plant(f"{t}/ckpt/.tmp-global_step4/model.safetensors.tmp.{dead}"), plant(f"{t}/ckpt/latest.tmp.{dead}")]
    alive = [plant(f"{t}/ckpt/latest.tmp.{live}")]
    run([DSTRAIN, "--config", f"{t}.json"])
    check(f"{t}/ckpt/global_step4", stale, alive, "dstrain --save")
    # dsconvert --save into a directory a killed dsconvert left.
    stale = [plant(f"{t}/conv/.tmp-global_step60/model.safetensors.tmp.{dead}"), plant(f"{t}/conv/latest.tmp.{dead}")]
    alive = [plant(f"{t}/conv/latest.tmp.{live}")]
    run([DSCONVERT, "--load", f"{d}/gpt2/ckpt", "--save", f"{t}/conv", "--target-tp", "2", "--target-dp", "1"])
    check(f"{t}/conv/global_step60", stale, alive, "dsconvert --save")
    # dsconvert --export-hf: a killed export's OUT.tmp-<pid> beside OUT.
    stale = [plant(f"{t}/hf.tmp-{dead}/model.safetensors")]
    alive = [plant(f"{t}/hf.tmp-{live}/model.safetensors"), plant(f"{t}/other.tmp-{dead}/x")]
    run([DSCONVERT, "--load", f"{d}/gpt2/ckpt", "--export-hf", f"{t}/hf"])
    check(f"{t}/hf", [os.path.dirname(stale[0])], alive, "dsconvert --export-hf")
    print("stale temporaries: dstrain --save, dsconvert --save and --export-hf remove a dead pid's and commit none; "
          "a live pid's (and another name's) stay: ok")


if MODE == "models":
    import shutil
    shutil.rmtree(DIR, ignore_errors=True)
    os.makedirs(DIR)
    build_models(DIR)
else:
    if not os.path.exists(f"{DIR}/prompts.jsonl"):
        fail(f"{DIR} has no models (run the test_dsgen_models fixture first)")
    {"cli": check_cli, "tp": check_tp, "hf": check_hf, "temporaries": check_temporaries}[MODE](DIR)
print(f"dsgen {MODE}: passed")

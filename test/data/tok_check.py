#!/usr/bin/env python3
"""test_tokenizers_ref: our tokenizers against the reference libraries, id by id.

SentencePiece models are trained here by the sentencepiece package, tokenizer.json
files built or trained by the tokenizers package, all on tinyshakespeare
(../shared/data); then tok_probe (our code) and the reference encode the same
texts: every paragraph of the play, the whole play as one document, and
hand-written edge cases. Finally dsprep --workers 2 tokenizes a JSON lines file
and its .bin/.idx is read back and compared with the reference documents.
Exits 77 (skipped) without the packages (scripts/setup.sh installs them into
.deps/tokref) or without ../shared/data.
   tok_check.py TOK_PROBE DSPREP
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77


def skip(msg):
    print(f"SKIP: {msg}")
    sys.exit(SKIP)


try:
    import sentencepiece as spm
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
except ImportError as e:
    skip(f"reference tokenizers not installed ({e}); scripts/setup.sh puts them in .deps/tokref")

SRC = os.environ.get("DS_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(SRC, "..", "shared", "data")
if not os.path.isfile(os.path.join(DATA, "tinyshakespeare.txt")):
    skip(f"{DATA}/tinyshakespeare.txt not found")

CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = CL100K.replace(r"\p{N}{1,3}", r"\p{N}")

EDGE = [
    "", " ", "   ", "\n", "\n\n\n", "\t \t", "a  b", "a   b   ", "  leading", "trailing  ", "x\r\ny", "line\n  indented\n",
    "Hello, world! It's 2024; I'M here, you'RE there, we'll see.", "don't 's 'S 'Ve 'LL 'd",
    "1234567 3.14159 1,000,000 007 ٣٤٥ ½ ² Ⅻ", "caf\u00e9 na\u00efve r\u00e9sum\u00e9 e\u0301", "中文测试，你好。",
    "Привет мир", "مرحبا بالعالم", "हिन्दी भाषा", "日本語のテキスト", "👍🏽 🇺🇸 👨‍👩‍👧 😀😀", "\u00a0nbsp\u3000ideo\u2028sep",
    "tabs\tand\tmore\t\t", "<|endoftext|>", "a<|endoftext|>b", "hello <|endoftext|> world", "<s> </s> <EOD> <unk>",
    "<|begin_of_text|>x<|end_of_text|>", "  <|pad|>  spaced  <|pad|>", "ends with newline\n", "!!!??? ...---",
    "x" * 300, "ab" * 200 + " " + "9" * 50, "\x01\x02 control", "mixed123abc456 a1b2c3",
]


def paragraphs(text):
    out, cur = [], []
    for line in text.split("\n"):
        if line.strip():
            cur.append(line)
        elif cur:
            out.append("\n".join(cur))
            cur = []
    if cur:
        out.append("\n".join(cur))
    return out


def probe(probe_bin, args, texts):
    inp = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    r = subprocess.run([probe_bin] + args, input=inp.encode(), capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: tok_probe {args}: {r.stderr.decode()}")
    return json.loads(r.stdout)


class Check:
    def __init__(self):
        self.failures = 0

    def ids(self, name, texts, ours, ref, field="ids"):
        bad = 0
        for t, o, r in zip(texts, ours["docs"], ref):
            if o[field] != r:
                bad += 1
                if bad <= 3:
                    k = next((i for i, (a, b) in enumerate(zip(o[field], r)) if a != b), min(len(o[field]), len(r)))
                    print(f"  {name} {field} differ for {t[:60]!r}: first at {k}: ours {o[field][k:k + 8]} "
                          f"ref {r[k:k + 8]}")
        n_ids = sum(len(r) for r in ref)
        print(f"{name}: {field}: {len(texts) - bad}/{len(texts)} texts identical ({n_ids} reference ids)")
        self.failures += bad

    def equal(self, name, ours, ref):
        if ours != ref:
            print(f"  {name}: ours {ours} reference {ref}")
            self.failures += 1

    def roundtrip(self, name, texts, ours):
        bad = [t for t, o in zip(texts, ours["docs"]) if not o["roundtrip"]]
        print(f"{name}: decode(encode(x)) == x for {len(texts) - len(bad)}/{len(texts)} texts")
        self.failures += len(bad)


def megatron_sp_tokenize(sp, text):
    """Megatron's _SentencePieceTokenizer: its special tokens and tokenize loop."""
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    special = {}

    def add(t):
        if t not in vocab:
            vocab[t] = len(vocab)
        special[t] = vocab[t]

    for t in ("<CLS>", "<SEP>", "<EOD>", "<MASK>"):
        add(t)
    for get, dflt in ((sp.pad_id, "<PAD>"), (sp.bos_id, "<BOS>"), (sp.eos_id, "<EOS>")):
        i = get()
        add(sp.id_to_piece(i) if 0 <= i < sp.get_piece_size() else dflt)
    ids, idx = [], 0
    while True:
        found = {t: text[idx:].index(t) for t in special if t in text[idx:]}
        if not found:
            break
        nxt = min(found, key=found.get)
        at = idx + found[nxt]
        ids += sp.encode_as_ids(text[idx:at]) + [special[nxt]]
        idx = at + len(nxt)
    return ids + sp.encode_as_ids(text[idx:]), len(vocab), special["<EOD>"]


def check_sentencepiece(c, probe_bin, tmp, corpus, texts):
    common = dict(input=corpus, vocab_size=2000, num_threads=2, minloglevel=2)
    spm.SentencePieceTrainer.train(model_prefix=f"{tmp}/llama", model_type="bpe", byte_fallback=True,
                                   split_digits=True, allow_whitespace_only_pieces=True,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False, **common)
    spm.SentencePieceTrainer.train(model_prefix=f"{tmp}/uni", model_type="unigram", **common)
    for model in ("llama", "uni"):
        path = f"{tmp}/{model}.model"
        sp = spm.SentencePieceProcessor(model_file=path)
        ref = [sp.encode_as_ids(t) for t in texts]
        for kind in ("GPTSentencePieceTokenizer", "Llama2Tokenizer"):
            ours = probe(probe_bin, [kind, path], texts)
            c.ids(f"{kind}({model})", texts, ours, ref)
            bos = [sp.bos_id()] if kind == "Llama2Tokenizer" else []
            c.ids(f"{kind}({model})", texts, ours, [bos + r + [sp.eos_id()] if bos + r else [] for r in ref], "doc")
            c.equal(f"{kind}({model}) info", ours["info"]["vocab_size"], sp.get_piece_size())
            c.equal(f"{kind}({model}) bos/eos", [ours["info"]["bos_id"], ours["info"]["eos_id"]], [sp.bos_id(), sp.eos_id()])
            if model == "llama":  # byte fallback, no normalization: decoding gives the text back
                c.roundtrip(f"{kind}({model})", texts, ours)
        ours = probe(probe_bin, ["SentencePieceTokenizer", path], texts)
        mt = [megatron_sp_tokenize(sp, t) for t in texts]
        c.ids(f"SentencePieceTokenizer({model})", texts, ours, [m[0] for m in mt])
        c.equal("SentencePieceTokenizer vocab/eod", [ours["info"]["vocab_size"], ours["info"]["eod_id"]],
                [mt[0][1], mt[0][2]])


def hf_tokenizers(tmp, corpus):
    """(name, tokenizer) pairs: GPT-2 from its files, and three trained ones."""
    out = []
    gpt2 = Tokenizer(models.BPE.from_file(f"{DATA}/gpt2-vocab.json", f"{DATA}/gpt2-merges.txt"))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    gpt2.add_special_tokens(["<|endoftext|>"])
    out.append(("gpt2", gpt2))
    alphabet = pre_tokenizers.ByteLevel.alphabet()

    def train(name, pre, specials, ignore_merges=False, template=None):
        t = Tokenizer(models.BPE(ignore_merges=ignore_merges))
        t.pre_tokenizer = pre
        t.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials, initial_alphabet=alphabet,
                                 show_progress=False)
        t.train([corpus], tr)
        if template:
            t.post_processor = processors.TemplateProcessing(
                single=f"{template} $A", special_tokens=[(template, t.token_to_id(template))])
        out.append((name, t))
        return t

    split = lambda rx: pre_tokenizers.Sequence([  # noqa: E731
        pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    train("llama3", split(CL100K), ["<|begin_of_text|>", "<|end_of_text|>"], ignore_merges=True,
          template="<|begin_of_text|>")
    train("qwen2", split(QWEN2), ["<|endoftext|>"])
    neox = train("neox", pre_tokenizers.ByteLevel(add_prefix_space=True), ["<|endoftext|>"])
    neox.add_special_tokens([AddedToken("<|pad|>", lstrip=True, rstrip=True, special=True)])
    return out


def check_hf(c, probe_bin, tmp, corpus, texts):
    for name, t in hf_tokenizers(tmp, corpus):
        d = f"{tmp}/{name}"
        os.makedirs(d)
        t.save(f"{d}/tokenizer.json")
        ours = probe(probe_bin, ["HFTokenizer", d], texts)
        c.ids(f"HFTokenizer({name})", texts, ours, [t.encode(x, add_special_tokens=False).ids for x in texts])
        eos = ours["info"]["eos_id"]
        c.ids(f"HFTokenizer({name})", texts, ours,
              [e + [eos] if e else [] for e in (t.encode(x).ids for x in texts)], "doc")
        c.equal(f"HFTokenizer({name}) vocab", ours["info"]["vocab_size"], t.get_vocab_size(with_added_tokens=True))
        if name != "neox":  # add_prefix_space: decoding keeps the added space, as the reference does
            c.roundtrip(f"HFTokenizer({name})", texts, ours)


def read_indexed(prefix):
    """Documents of a Megatron .bin/.idx pair (one sequence per document)."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "bad .idx magic"
    code = idx[17]
    n, ndoc = struct.unpack_from("<QQ", idx, 18)
    sizes = struct.unpack_from(f"<{n}i", idx, 34)
    ptrs = struct.unpack_from(f"<{n}q", idx, 34 + 4 * n)
    fmt, width = {1: ("B", 1), 3: ("h", 2), 4: ("i", 4), 8: ("H", 2)}[code]
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    return [list(struct.unpack_from(f"<{s}{fmt}", data, p)) for s, p in zip(sizes, ptrs)]


def check_dsprep(c, dsprep, tmp, texts):
    t = Tokenizer.from_file(f"{tmp}/llama3/tokenizer.json")
    jsonl = f"{tmp}/docs.jsonl"
    with open(jsonl, "w") as f:
        for x in texts:
            f.write(json.dumps({"content": x}) + "\n")
    r = subprocess.run([dsprep, "--input", jsonl, "--json-keys", "content", "--output-prefix", f"{tmp}/out",
                        "--tokenizer-type", "HFTokenizer", "--tokenizer-model", f"{tmp}/llama3", "--append-eod",
                        "--workers", "2"], capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: dsprep: {r.stderr.decode()}")
    eos = t.token_to_id("<|end_of_text|>")
    ref = [e + [eos] for e in (t.encode(x).ids for x in texts if x)]
    got = read_indexed(f"{tmp}/out_content_document")
    ok = got == ref
    print(f"dsprep --workers 2 HFTokenizer(llama3): {len(got)} documents, {'identical' if ok else 'DIFFERENT'}"
          f" to the reference ({sum(map(len, ref))} ids)")
    c.failures += 0 if ok else 1


def main():
    probe_bin, dsprep = sys.argv[1], sys.argv[2]
    corpus = os.path.join(DATA, "tinyshakespeare.txt")
    with open(corpus, encoding="utf-8") as f:
        play = f.read()
    texts = EDGE + paragraphs(play) + [play]
    c = Check()
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([probe_bin, "GPTSentencePieceTokenizer", corpus], input=b"", capture_output=True)
        if b"needs the SentencePiece library" in r.stderr:
            print("NOTE: this build has no SentencePiece library; the SentencePiece comparisons did not run")
        else:
            check_sentencepiece(c, probe_bin, tmp, corpus, texts)
        check_hf(c, probe_bin, tmp, corpus, texts)
        check_dsprep(c, dsprep, tmp, texts)
    if c.failures:
        print(f"FAIL: {c.failures} mismatches")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""dschat sft against DeepSpeed-Chat's step 1 computed with transformers and
PyTorch.

Usage: sft_check.py DSCHAT DSRUN SHARED_DATA_DIR

A tiny GPT-2 and a tiny OPT (GPT-2's tokenizer, OPT's with "</s>" and a bos
first; DeepSpeed-Chat's resize to a multiple of 8 adds embedding rows to
both) and local/jsonfile data are made here; dschat sft runs
from training/step1_supervised_finetuning/ below the data as DeepSpeed-Chat's
scripts do, on one process and on two (ZeRO-3, each rank initialising its
partition), fp32, with an uneven number of micro-batches per
gradient-accumulation step and per epoch. The reference
follows DeepSpeed-Chat's main.py: the phase-1 split, PyTorch's
DistributedSampler, labels -100 on padding, the per-micro-batch loss averaged
over ranks and accumulation steps, DeepSpeed's gradient clipping (1.0),
torch.optim.AdamW (betas 0.9 / 0.95) with DeepSpeed-Chat's decay and
no-decay groups (weight decay 5: large enough that one misplaced norm weight
shows), transformers' get_scheduler stepped per optimizer step, and the
perplexity evaluation. Every training loss, every
learning rate and every evaluation must agree; the exported directory must
load in transformers and give the final evaluation loss again. Exits 77 when
torch or transformers is missing, or without the shared GPT-2 vocabulary."""
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import torch
    from torch.utils.data.distributed import DistributedSampler
    from transformers import AutoTokenizer, GPT2LMHeadModel, OPTForCausalLM, get_scheduler
except ImportError as e:
    print("SKIP: torch/transformers not importable by", sys.executable, e)
    sys.exit(77)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dschat_ref import Checks, LinearLayer_LoRA, close, convert_to_lora, tiny_causal_lm  # noqa: E402
from split_ref import split_index  # noqa: E402  (DeepSpeed-Chat's phase split, written out)

dschat, dsrun, shared = sys.argv[1], sys.argv[2], sys.argv[3]
if not os.path.exists(os.path.join(shared, "gpt2-vocab.json")):
    print("SKIP: no", os.path.join(shared, "gpt2-vocab.json"))
    sys.exit(77)
torch.manual_seed(0)
work = tempfile.mkdtemp(prefix="ds_dschat_sft_")


check = Checks()
failures = check.failures


# The model and the data.


def make_model(family):
    return tiny_causal_lm(family, os.path.join(work, "model" if family == "gpt2" else "model_" + family), shared)


app = os.path.join(work, "app")
os.makedirs(os.path.join(app, "data"))
os.makedirs(os.path.join(app, "training", "step1_supervised_finetuning"))
rnd = random.Random(7)
words = ["red", "green", "blue", "small", "large", "quick", "slow", "happy", "bright", "quiet"]


def example():
    a, b = rnd.sample(words, 2)
    n = rnd.randint(1, 12)
    return {"prompt": "Human: tell me about " + " ".join(rnd.choice(words) for _ in range(n)) + ". Assistant:",
            "chosen": f"It is {a} and " + " ".join(rnd.choice(words) for _ in range(rnd.randint(0, 14))),
            "rejected": f"It is {b}."}


raw = {"train": [example() for _ in range(47)], "eval": [example() for _ in range(19)]}
for split, rows in raw.items():
    with open(os.path.join(app, "data", split + ".json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

SEED, SPLIT, B, EB, T, LR, WD, EPOCHS, GA, WARMUP, SCHED = 1234, "6,2,2", 3, 5, 40, 5e-3, 5.0, 2, 2, 2, "cosine"
FAMILIES = {"gpt2": GPT2LMHeadModel, "opt": OPTForCausalLM}


def flags_for(model):
    return ["--data_path", "local/jsonfile", "--data_split", SPLIT, "--seed", str(SEED), "--model_name_or_path",
            model, "--per_device_train_batch_size", str(B), "--per_device_eval_batch_size", str(EB),
            "--max_seq_len", str(T), "--learning_rate", str(LR), "--weight_decay", str(WD), "--num_train_epochs",
            str(EPOCHS), "--gradient_accumulation_steps", str(GA), "--lr_scheduler_type", SCHED,
            "--num_warmup_steps", str(WARMUP), "--dtype", "fp32", "--deepspeed"]


def run(cmd, out_dir):
    step_dir = os.path.join(app, "training", "step1_supervised_finetuning")
    os.makedirs(out_dir)  # the scripts make it and send their log into it (&> $OUTPUT/training.log)
    with open(os.path.join(out_dir, "training.log"), "w") as f:
        f.write("log\n")
    p = subprocess.run(cmd + flags + ["--output_dir", out_dir], cwd=step_dir, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        print(p.stdout[-4000:], p.stderr[-4000:])
        raise SystemExit(f"dschat failed with {p.returncode}")
    evals = [(float(m.group(1)), float(m.group(2)))
             for m in re.finditer(r"^(?:\[rank 0\] )?ppl: (\S+), loss: (\S+)$", p.stdout, re.M)]
    steps = [(float(m.group(1)), float(m.group(2)))
             for m in re.finditer(r"learning rate: (\S+) .*? lm loss: (\S+) ", p.stdout)]
    return evals, steps


# The reference: DeepSpeed-Chat's step 1, written out with transformers and PyTorch.
def phase1(rows, mask_prompt=False):
    idx = split_index(SEED, len(rows), SPLIT, 0)
    out = []
    for i in idx:
        e = rows[int(i)]
        text = " " + e["prompt"] + " " + e["chosen"] + tok.eos_token
        enc = tok(text, max_length=T, padding="max_length", truncation=True, return_tensors="pt")
        ids, mask = enc["input_ids"][0], enc["attention_mask"][0]
        labels = torch.where(mask.bool(), ids, -100)
        if mask_prompt:  # dschat's --mask_prompt: the prompt's labels -100 (its ids as tokenized alone)
            labels[:len(tok(" " + e["prompt"])["input_ids"])] = -100
        out.append((ids, mask, labels))
    return out


def reference_model():
    m = model_cls.from_pretrained(model_dir)
    old = m.get_input_embeddings().weight.data.clone()
    m.resize_token_embeddings(8 * math.ceil(len(tok) / 8))
    m.get_input_embeddings().weight.data[old.shape[0]:] = old.mean(dim=0)  # dschat's resize: the rows' mean
    return m


def batches(ds, world, rank, bs):
    order = list(DistributedSampler(list(range(len(ds))), num_replicas=world, rank=rank))
    return [[ds[i] for i in order[k:k + bs]] for k in range(0, len(order), bs)]


def batch_loss(model, rows):
    ids = torch.stack([r[0] for r in rows])
    return model(input_ids=ids, attention_mask=torch.stack([r[1] for r in rows]),
                 labels=torch.stack([r[2] for r in rows])).loss


def evaluation(model, world):
    model.eval()
    with torch.no_grad():
        per_rank = []
        for r in range(world):
            bl = batches(evals_ds, world, r, EB)
            per_rank.append(sum(batch_loss(model, b).float() for b in bl) / len(bl))
        loss = sum(per_rank) / world
    model.train()
    return math.exp(loss.item()), loss.item()


def grouped_parameters(model, lora_lr):  # DeepSpeed-Chat's get_optimizer_grouped_parameters
    no_decay = ["bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight"]
    lora = ["lora_right_weight", "lora_left_weight"]
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if not any(nd in n.lower() for nd in no_decay + lora)],
               "weight_decay": WD},
              {"params": [p for n, p in named if not any(nd in n.lower() for nd in no_decay)
                          and any(nd in n.lower() for nd in lora)], "weight_decay": WD, "lr": lora_lr},
              {"params": [p for n, p in named if any(nd in n.lower() for nd in no_decay)], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def reference(world, model=None, lora_lr=None):
    model = model or reference_model()
    model.train()
    opt = torch.optim.AdamW(grouped_parameters(model, lora_lr), lr=LR, betas=(0.9, 0.95), eps=1e-8)
    per_rank = [batches(train, world, r, B) for r in range(world)]
    per_epoch = len(per_rank[0])
    sched = get_scheduler(SCHED, optimizer=opt, num_warmup_steps=WARMUP,
                          num_training_steps=EPOCHS * math.ceil(per_epoch / GA))
    evals, steps, micro, window = [evaluation(model, world)], [], 0, []
    for _ in range(EPOCHS):
        for i in range(per_epoch):
            losses = [batch_loss(model, per_rank[r][i]) for r in range(world)]
            loss = sum(losses) / world
            (loss / GA).backward()
            window.append(loss.item())
            micro += 1
            if micro % GA == 0:
                lr = opt.param_groups[0]["lr"] / opt.param_groups[0]["initial_lr"] * LR  # the base rate
                params = [p for p in model.parameters() if p.grad is not None]
                norm = torch.norm(torch.stack([p.grad.detach().norm(2) for p in params]), 2).item()
                coef = 1.0 / (norm + 1e-6)  # DeepSpeed's clip_grad_norm_ at gradient_clipping 1.0
                if coef < 1:
                    for p in params:
                        p.grad.mul_(coef)
                opt.step()
                sched.step()
                opt.zero_grad()
                steps.append((lr, sum(window) / GA))
                window = []
        evals.append(evaluation(model, world))
    return evals, steps


for family, model_cls in FAMILIES.items():
    model_dir = make_model(family)
    flags = flags_for(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.pad_token = tok.eos_token  # DeepSpeed-Chat's get_tokenizer
    tok.padding_side = "right"
    train, evals_ds = phase1(raw["train"]), phase1(raw["eval"])
    for world, cmd in ((1, [dschat, "sft"]), (2, [dsrun, "--num_gpus", "2", "--master_port", "29611", dschat, "sft",
                        "--zero_stage", "3"])):
        out_dir = os.path.join(work, f"out{world}" + ("" if family == "gpt2" else "_" + family))
        got_evals, got_steps = run(cmd, out_dir)
        ref_evals, ref_steps = reference(world)
        print(f"{family} world {world}: {len(got_steps)} steps, eval losses {[e[1] for e in got_evals]} "
              f"(reference {[e[1] for e in ref_evals]})")
        check(len(got_evals) == EPOCHS + 1 and len(got_steps) == len(ref_steps) > 0,
              f"{family} world {world}: {len(got_evals)} evaluations, {len(got_steps)} steps "
              f"(reference {len(ref_steps)})")
        check(close(got_evals[0][1], ref_evals[0][1], 1e-5) and close(got_evals[0][0], ref_evals[0][0], 1e-4),
              f"{family} world {world}: evaluation before training {got_evals[0]} vs {ref_evals[0]}")
        for k, (g, r) in enumerate(zip(got_steps, ref_steps)):
            check(close(g[0], r[0], 1e-5), f"{family} world {world} step {k + 1}: lr {g[0]} vs {r[0]}")
            check(close(g[1], r[1], 2e-5), f"{family} world {world} step {k + 1}: loss {g[1]} vs {r[1]}")
        for k, (g, r) in enumerate(zip(got_evals[1:], ref_evals[1:])):
            check(close(g[1], r[1], 2e-5), f"{family} world {world} epoch {k + 1}: eval loss {g[1]} vs {r[1]}")
        # The export: beside the log, transformers loads it and evaluates to the last evaluation's loss.
        files = ["config.json", "merges.txt", "model.safetensors", "training.log", "vocab.json"]
        files += [] if family == "gpt2" else ["tokenizer_config.json"]
        check(sorted(os.listdir(out_dir)) == sorted(files), f"--output_dir holds {sorted(os.listdir(out_dir))}")
        exported = model_cls.from_pretrained(out_dir)
        check(exported.config.vocab_size == 8 * math.ceil(len(tok) / 8),
              f"exported vocab {exported.config.vocab_size}")
        check(AutoTokenizer.from_pretrained(out_dir)("hello world")["input_ids"] == tok("hello world")["input_ids"],
              "exported tokenizer")
        check(close(evaluation(exported, world)[1], got_evals[-1][1], 1e-5),
              f"{family} world {world}: the export's eval loss")
    if family == "opt":  # --mask_prompt (OPT's tokenizer adds a bos: it is part of the prompt)
        unmasked_first = got_evals[0][1]
        train, evals_ds = phase1(raw["train"], True), phase1(raw["eval"], True)
        got_evals, got_steps = run([dschat, "sft", "--mask_prompt"], os.path.join(work, "out1_opt_mask"))
        ref_evals, ref_steps = reference(1)
        print(f"opt --mask_prompt: eval losses {[e[1] for e in got_evals]} (reference {[e[1] for e in ref_evals]})")
        check(len(got_steps) == len(ref_steps) > 0 and len(got_evals) == len(ref_evals), "--mask_prompt: counts")
        for k, (g, r) in enumerate(zip(got_steps, ref_steps)):
            check(close(g[1], r[1], 2e-5), f"--mask_prompt step {k + 1}: loss {g[1]} vs {r[1]}")
        for k, (g, r) in enumerate(zip(got_evals, ref_evals)):
            check(close(g[1], r[1], 2e-5), f"--mask_prompt evaluation {k}: {g} vs {r}")
        check(abs(got_evals[0][1] - unmasked_first) > 1e-3,
              "--mask_prompt changes the loss")
        train, evals_ds = phase1(raw["train"]), phase1(raw["eval"])  # the LoRA runs below train unmasked
    if family == "gpt2":
        gpt2_dir, gpt2_flags = model_dir, flags


# LoRA on the OPT: DeepSpeed-Chat's LinearLayer_LoRA and convert_linear_layer_to_lora written out. Both sides
# start from a file holding the LoRA tensors unfused (dschat reads MODULE.lora_*_weight where a file has them),
# so that torch's draw of lora_right_weight is the one dschat trains; the export holds the fused weights.
LORA_DIM, LORA_LR = 4, 2e-2
lora_dir = os.path.join(work, "model_opt_lora")
os.makedirs(lora_dir)
for f in os.listdir(model_dir):
    if f.endswith((".json", ".txt")):
        shutil.copy(os.path.join(model_dir, f), os.path.join(lora_dir, f))
start, wrapped = convert_to_lora(reference_model(), "decoder.layers.", LORA_DIM, False)
check(wrapped == 12, f"{wrapped} linears wrapped")
torch.save(start.state_dict(), os.path.join(lora_dir, "pytorch_model.bin"))
start.config.save_pretrained(lora_dir)
for only_lora in (False, True):
    extra = ["--lora_dim", str(LORA_DIM), "--lora_module_name", "decoder.layers.", "--lora_learning_rate",
             str(LORA_LR)] + (["--only_optimize_lora"] if only_lora else [])
    for world, cmd in ((1, [dschat, "sft"]),) + (((2, [dsrun, "--num_gpus", "2", "--master_port", "29611", dschat,
                                                        "sft", "--zero_stage", "3"]),) if not only_lora else ()):
        flags = flags_for(lora_dir) + extra
        out_dir = os.path.join(work, f"out{world}_lora" + ("_only" if only_lora else ""))
        got_evals, got_steps = run(cmd, out_dir)
        ref = convert_to_lora(model_cls(start.config), "decoder.layers.", LORA_DIM, only_lora)[0]
        ref.load_state_dict(torch.load(os.path.join(lora_dir, "pytorch_model.bin")), strict=True)
        ref_evals, ref_steps = reference(world, ref, LORA_LR)
        what = f"LoRA{' only' if only_lora else ''} world {world}"
        print(f"{what}: {len(got_steps)} steps, eval losses {[e[1] for e in got_evals]} "
              f"(reference {[e[1] for e in ref_evals]})")
        check(len(got_steps) == len(ref_steps) > 0 and len(got_evals) == len(ref_evals),
              f"{what}: {len(got_steps)} steps, {len(got_evals)} evaluations")
        for k, (g, r) in enumerate(zip(got_steps, ref_steps)):
            check(close(g[0], r[0], 1e-5) and close(g[1], r[1], 2e-5), f"{what} step {k + 1}: {g} vs {r}")
        for k, (g, r) in enumerate(zip(got_evals, ref_evals)):
            check(close(g[1], r[1], 2e-5), f"{what} evaluation {k}: {g} vs {r}")
        # The export: fused (no LoRA tensors), transformers' OPT with the reference's fused weights.
        exported = model_cls.from_pretrained(out_dir)
        with torch.no_grad():
            for m in ref.modules():
                if isinstance(m, LinearLayer_LoRA):
                    m.fuse()
        want = {k: v for k, v in ref.state_dict().items() if "lora_" not in k}
        got = exported.state_dict()
        check(sorted(got) == sorted(want), f"{what}: exported names {sorted(set(got) ^ set(want))}")
        # (a key bias has no gradient but rounding noise, which Adam turns into steps of about lr: not compared)
        worst = max(((got[k] - want[k]).abs().max().item() / (want[k].abs().max().item() + 1e-6), k)
                    for k in want if k in got and not k.endswith("k_proj.bias"))
        check(worst[0] < 1e-4, f"{what}: exported weights differ by {worst}")

# A hub name through the local Hugging Face cache (never the network), and
# inputs a user can get wrong: one error line, exit 1, nothing written.
cache = os.path.join(work, "hub")
snap = os.path.join(cache, "models--tiny--gpt2", "snapshots", "abc123")
shutil.copytree(gpt2_dir, snap)
flags = gpt2_flags
os.makedirs(os.path.join(cache, "models--tiny--gpt2", "refs"))
with open(os.path.join(cache, "models--tiny--gpt2", "refs", "main"), "w") as f:
    f.write("abc123")
step_dir = os.path.join(app, "training", "step1_supervised_finetuning")
env = dict(os.environ, HF_HUB_CACHE=cache)


def dschat_run(extra, model="tiny/gpt2"):
    args = [dschat, "sft"] + flags + extra
    args[args.index("--model_name_or_path") + 1] = model
    return subprocess.run(args, cwd=step_dir, capture_output=True, text=True, timeout=300, env=env)


p = dschat_run(["--num_train_epochs", "0"])
check(p.returncode == 0 and "ppl: " in p.stdout, f"hub name from the cache: rc {p.returncode} {p.stderr[-300:]}")
with open(os.path.join(work, "a_file"), "w") as f:
    f.write("x")
bad = [
    (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
    (["--per_device_train_batch_size", "x"], "argument --per_device_train_batch_size: invalid int value: 'x'"),
    (["--lora_dim", "8", "--only_optimize_lora"], "selects no nn.Linear of the model (GPT-2's layers are Conv1D)"),
    (["--lora_dim", "8", "--lora_module_name", "head"], "selects lm_head, which dschat does not adapt"),
    (["--deepspeed_config", "ds.json"], "drop --deepspeed_config"),
    (["--data_path", "Dahoas/rm-static"], "Hugging Face Hub datasets are not downloaded"),
    (["--max_seq_len", "100"], "longer than the model's 64 positions"),
    (["--output_dir", os.path.join(work, "a_file")], "--output_dir"),
    (["--seed", "-1"], "--seed -1 must be between 0 and 2**32 - 1"),
    (["--data_split", "0,10,0"], "leaves no training examples"),
]
for extra, want in bad:
    p = dschat_run(extra)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    check(p.returncode == 1 and len(lines) == 1 and lines[0].startswith("dschat: error: ") and want in lines[0],
          f"{extra}: rc {p.returncode}, stderr {p.stderr!r}")
p = dschat_run([], model="tiny/missing")
check(p.returncode == 1 and "never downloads" in p.stderr and "models--tiny--missing" in p.stderr,
      f"a hub name not in the cache: {p.stderr!r}")
empty_model = os.path.join(work, "hub", "empty")
os.makedirs(empty_model)
p = dschat_run([], model=empty_model)
check(p.returncode == 1 and "config.json" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
      f"a model directory without config.json: {p.stderr!r}")
check(sorted(os.listdir(work)) == ["a_file", "app", "hub", "model", "model_opt", "model_opt_lora", "out1",
                                   "out1_lora", "out1_lora_only", "out1_opt", "out1_opt_mask", "out2", "out2_lora",
                                   "out2_opt"],
      f"nothing else written: {sorted(os.listdir(work))}")

shutil.rmtree(work, ignore_errors=True)
if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("dschat sft matches DeepSpeed-Chat's step 1 (transformers + PyTorch) on 1 and 2 processes")

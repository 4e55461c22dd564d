"""dschat reward against DeepSpeed-Chat's step 2 computed with transformers
and PyTorch.

Usage: reward_check.py DSCHAT DSRUN SHARED_DATA_DIR

A tiny GPT-2 (GPT-2's tokenizer; the step's "<|endoftext|>" is its eos and
pad) is made here and turned into DeepSpeed-Chat's RewardModel: the
backbone (GPT2Model, embedding resized to a multiple of 8) and a v_head
drawn by torch, saved as step 2 saves it (pytorch_model.bin with
'rwtransformer.' names and 'v_head.weight'), so that both sides start from
the same weights. dschat reward runs from
training/step2_reward_model_finetuning/ below local/jsonfile data, on one
process and on two (ZeRO-3), fp32, with an uneven number of micro-batches
per accumulation step, chosen and rejected answers of different lengths
(the pairwise span covers the shorter one's padding, whose values depend on
the attention mask) and an evaluation every 2 steps. The reference follows
main.py: the phase-2 split, DistributedSampler, DataCollatorReward's
[chosen; rejected] batches with their attention masks, RewardModel.forward's
loss (reward_ref.py) averaged over ranks and accumulation steps, DeepSpeed's
clipping, torch AdamW (betas 0.9 / 0.95, weight decay 5 on DeepSpeed-Chat's
decay group), get_scheduler, and evaluation_reward. Every step's loss and
learning rate and every evaluation must agree, and the export
(pytorch_model.bin) must load into RewardModel as step 3 loads its critic and
hold the trained weights. Exits 77 when torch or
transformers is missing, or without the shared GPT-2 vocabulary."""
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
    from transformers import AutoConfig, AutoModel, AutoTokenizer, get_scheduler
except ImportError as e:
    print("SKIP: torch/transformers not importable by", sys.executable, e)
    sys.exit(77)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dschat_ref  # noqa: E402
from dschat_ref import Checks, close, convert_to_lora  # noqa: E402  (DeepSpeed-Chat's LoRA, ...)
from reward_ref import forward as reward_forward  # noqa: E402  (RewardModel.forward's loss, written out)
from split_ref import split_index  # noqa: E402

dschat, dsrun, shared = sys.argv[1], sys.argv[2], sys.argv[3]
if not os.path.exists(os.path.join(shared, "gpt2-vocab.json")):
    print("SKIP: no", os.path.join(shared, "gpt2-vocab.json"))
    sys.exit(77)
torch.manual_seed(0)
work = tempfile.mkdtemp(prefix="ds_dschat_reward_")


check = Checks()
failures = check.failures


class RewardModel(dschat_ref.RewardModel):  # with RewardModel.forward's pairwise loss
    def forward(self, input_ids, attention_mask):
        hidden = self.rwtransformer(input_ids, attention_mask=attention_mask)[0]
        rewards = self.v_head(hidden).squeeze(-1)
        bs = input_ids.shape[0] // 2
        return reward_forward(input_ids[:bs], input_ids[bs:], rewards[:bs], rewards[bs:], PAD, NPB)


def make_reward_model(family):
    return dschat_ref.make_reward_model(family, work, shared, RewardModel)


app = os.path.join(work, "app")
os.makedirs(os.path.join(app, "data"))
os.makedirs(os.path.join(app, "training", "step2_reward_model_finetuning"))
rnd = random.Random(11)
words = ["red", "green", "blue", "small", "large", "quick", "slow", "happy", "bright", "quiet"]


def example():
    n = rnd.randint(1, 8)
    prompt = "Human: tell me about " + " ".join(rnd.choice(words) for _ in range(n)) + ". Assistant:"
    good = "It is " + " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 10)))
    bad = "I do not know " + " ".join(rnd.choice(words) for _ in range(rnd.randint(0, 6)))
    return {"prompt": prompt, "chosen": good, "rejected": bad}


raw = {"train": [example() for _ in range(61)], "eval": [example() for _ in range(23)]}
for split, rows in raw.items():
    with open(os.path.join(app, "data", split + ".json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

SEED, SPLIT, B, EB, T, LR, WD, EPOCHS, GA, WARMUP, SCHED = 1234, "2,6,2", 3, 4, 40, 2e-3, 5.0, 2, 2, 1, "linear"
NPB, EVAL_ITERS, EVAL_INTERVAL = 1, 3, 2


def flags_for(model):
    return ["--data_path", "local/jsonfile", "--data_split", SPLIT, "--seed", str(SEED), "--model_name_or_path",
            model, "--per_device_train_batch_size", str(B), "--per_device_eval_batch_size", str(EB), "--max_seq_len",
            str(T), "--learning_rate", str(LR), "--weight_decay", str(WD), "--num_train_epochs", str(EPOCHS),
            "--gradient_accumulation_steps", str(GA), "--lr_scheduler_type", SCHED, "--num_warmup_steps",
            str(WARMUP), "--num_padding_at_beginning", str(NPB), "--eval_iters", str(EVAL_ITERS), "--eval_interval",
            str(EVAL_INTERVAL), "--dtype", "fp32", "--deepspeed"]



SCORES = re.compile(r"^(?:\[rank 0\] )?chosen_last_scores \(higher is better\) : (\S+), rejected_last_scores "
                    r"\(lower is better\) : (\S+), acc \(higher is better\) : (\S+)$", re.M)
ITER = re.compile(r"^(?:\[rank 0\] )?Iter (\d+): c_scores: (\S+), r_scores: (\S+), diff: (\S+), acc: (\S+)$", re.M)


def run(cmd, out_dir):
    step_dir = os.path.join(app, "training", "step2_reward_model_finetuning")
    os.makedirs(out_dir)
    with open(os.path.join(out_dir, "training.log"), "w") as f:
        f.write("log\n")
    p = subprocess.run(cmd + flags + ["--output_dir", out_dir], cwd=step_dir, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        print(p.stdout[-4000:], p.stderr[-4000:])
        raise SystemExit(f"dschat failed with {p.returncode}")
    evals = [tuple(float(x) for x in m.groups()) for m in SCORES.finditer(p.stdout)]
    iters = [(int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(5)))
             for m in ITER.finditer(p.stdout)]
    steps = [(float(m.group(1)), float(m.group(2)))
             for m in re.finditer(r"learning rate: (\S+) .*? lm loss: (\S+) ", p.stdout)]
    return evals, iters, steps


# The reference: DeepSpeed-Chat's step 2 with transformers and PyTorch.
def phase2(rows):
    out = []
    for i in split_index(SEED, len(rows), SPLIT, 1):
        e = rows[int(i)]
        pair = []
        for answer in ("chosen", "rejected"):
            enc = tok(" " + e["prompt"] + " " + e[answer] + "<|endoftext|>", max_length=T, padding="max_length",
                      truncation=True, return_tensors="pt")
            pair += [enc["input_ids"], enc["attention_mask"]]
        out.append(pair)
    return out


def batches(ds, world, rank, bs):
    order = list(DistributedSampler(list(range(len(ds))), num_replicas=world, rank=rank))
    return [[ds[i] for i in order[k:k + bs]] for k in range(0, len(order), bs)]


def collate(rows):  # DataCollatorReward
    return (torch.cat([r[0] for r in rows] + [r[2] for r in rows]),
            torch.cat([r[1] for r in rows] + [r[3] for r in rows]))


def evaluation(model, world):
    model.eval()
    accs, cs, rs = [], [], []
    with torch.no_grad():
        for r in range(world):
            correct, total, c_sum, r_sum, n = 0, 0, 0.0, 0.0, 0
            for b in batches(evals_ds, world, r, EB)[:EVAL_ITERS]:
                _, c, rj = model(*collate(b))
                correct += (c > rj).sum().item()
                total += c.shape[0]
                c_sum += c.mean().float().item()
                r_sum += rj.mean().float().item()
                n += 1
            accs.append(correct / total)
            cs.append(c_sum / n)
            rs.append(r_sum / n)
    model.train()
    return sum(cs) / world, sum(rs) / world, sum(accs) / world


def reference(world):
    model = RewardModel(AutoModel.from_config(rm_config))
    model.load_state_dict(torch.load(os.path.join(rm_dir, "pytorch_model.bin")))
    model.train()
    no_decay = ["bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight"]
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not any(nd in n.lower() for nd in no_decay)], "weight_decay": WD},
              {"params": [p for n, p in named if any(nd in n.lower() for nd in no_decay)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=1e-8)
    per_rank = [batches(train, world, r, B) for r in range(world)]
    per_epoch = len(per_rank[0])
    sched = get_scheduler(SCHED, optimizer=opt, num_warmup_steps=WARMUP,
                          num_training_steps=EPOCHS * math.ceil(per_epoch / GA))
    evals, iters, steps, micro, window = [evaluation(model, world)], [], [], 0, []
    for _ in range(EPOCHS):
        for i in range(per_epoch):
            loss = sum(model(*collate(per_rank[r][i]))[0] for r in range(world)) / world
            (loss / GA).backward()
            window.append(loss.item())
            micro += 1
            if micro % GA == 0:
                lr = opt.param_groups[0]["lr"]
                params = [p for p in model.parameters() if p.grad is not None]
                norm = torch.norm(torch.stack([p.grad.detach().norm(2) for p in params]), 2).item()
                coef = 1.0 / (norm + 1e-6)
                if coef < 1:
                    for p in params:
                        p.grad.mul_(coef)
                opt.step()
                sched.step()
                opt.zero_grad()
                steps.append((lr, sum(window) / GA))
                window = []
                if len(steps) % EVAL_INTERVAL == 0:
                    iters.append((len(steps),) + evaluation(model, world))
        evals.append(evaluation(model, world))
    return evals, iters, steps, model


# Weights the loss does not depend on: the final norm's bias shifts every reward (the loss sees differences) and
# a key bias shifts every score of a query row (softmax ignores it); their gradients are rounding noise, which
# Adam turns into steps of about lr in either direction, so they are not compared.
NULL_DIRECTIONS = ("ln_f.bias", "decoder.final_layer_norm.bias", "k_proj.bias")
for family in ("gpt2", "opt", "opt350m"):
    # OPT-350m has no final norm: its last layer's final_layer_norm.bias is the shift there.
    null = NULL_DIRECTIONS + (("layers.1.final_layer_norm.bias",) if family == "opt350m" else ())
    rm_dir, tok, rm_config = make_reward_model(family)
    PAD = tok.pad_token_id
    flags = flags_for(rm_dir)
    train, evals_ds = phase2(raw["train"]), phase2(raw["eval"])
    for world, cmd in ((1, [dschat, "reward"]), (2, [dsrun, "--num_gpus", "2", "--master_port", "29612", dschat, "reward",
                        "--zero_stage", "3"])):
        out_dir = os.path.join(work, f"out{world}_{family}")
        got_evals, got_iters, got_steps = run(cmd, out_dir)
        ref_evals, ref_iters, ref_steps, ref_model = reference(world)
        print(f"{family} world {world}: {len(got_steps)} steps; evaluations {got_evals} (reference {ref_evals})")
        check(len(got_evals) == EPOCHS + 1 and len(got_steps) == len(ref_steps) > 0 and len(got_iters) == len(ref_iters),
              f"{family} world {world}: {len(got_evals)} evaluations, {len(got_iters)} interval evaluations, {len(got_steps)} "
              f"steps (reference {len(ref_iters)}, {len(ref_steps)})")
        for k, (g, r) in enumerate(zip(got_steps, ref_steps)):
            check(close(g[0], r[0], 1e-5), f"{family} world {world} step {k + 1}: lr {g[0]} vs {r[0]}")
            check(close(g[1], r[1], 2e-5), f"{family} world {world} step {k + 1}: loss {g[1]} vs {r[1]}")
        # The loss depends on chosen - rejected only, so ln_f.bias (a shift of every reward by v_head . bias) has
        # no gradient but rounding noise, which Adam turns into steps of about lr: the scores themselves drift
        # apart by up to lr x steps x |v_head|; their differences and the accuracy must agree.
        def same_eval(g, r):
            return (close(g[0] - g[1], r[0] - r[1], 1e-4, 1e-2) and abs(g[2] - r[2]) < 1e-6
                    and abs(g[0] - r[0]) < 5e-3 and abs(g[1] - r[1]) < 5e-3)
        for k, (g, r) in enumerate(zip(got_evals, ref_evals)):
            check(same_eval(g, r), f"{family} world {world} evaluation {k}: {g} vs {r}")
        for g, r in zip(got_iters, ref_iters):
            check(g[0] == r[0] and same_eval(g[1:], r[1:]), f"{family} world {world} interval evaluation: {g} vs {r}")
        # The export: pytorch_model.bin in RewardModel's names, as step 2 saves it, loaded the way step 3 loads
        # its critic (AutoModel.from_config, RewardModel, the state dict: strictly here), the trained weights.
        files = sorted(os.listdir(out_dir))
        check(files == sorted(["config.json", "merges.txt", "pytorch_model.bin", "training.log", "vocab.json"]
                              + ([] if family == "gpt2" else ["tokenizer_config.json"])),
              f"--output_dir holds {files}")
        got = torch.load(os.path.join(out_dir, "pytorch_model.bin"), weights_only=True)
        critic = RewardModel(AutoModel.from_config(AutoConfig.from_pretrained(out_dir)))
        critic.load_state_dict(got, strict=True)
        want = ref_model.state_dict()
        check(sorted(got) == sorted(want), f"exported names {sorted(set(got) ^ set(want))}")
        worst = max(((got[k] - want[k]).abs().max().item() / (want[k].abs().max().item() + 1e-6), k)
                    for k in want if k in got and not k.endswith(null))  # noise-driven, see above
        check(worst[0] < 1e-3, f"{family} world {world}: exported weights differ by {worst}")

# LoRA with --only_optimize_lora on the OPT reward model: DeepSpeed-Chat's LinearLayer_LoRA on every
# "decoder.layers." linear, everything else frozen but v_head (force_optimize_params), from a file holding the
# LoRA tensors unfused, so that both start from torch's draw.
lora_rm = os.path.join(work, "rm_opt_lora")
shutil.copytree(rm_dir, lora_rm)
os.remove(os.path.join(lora_rm, "pytorch_model.bin"))
force = ("v_head.weight",)  # step 2's force_optimize_params
lora_start = convert_to_lora(RewardModel(AutoModel.from_config(rm_config)), "decoder.layers.", 4, True, force)[0]
lora_start.load_state_dict(torch.load(os.path.join(rm_dir, "pytorch_model.bin")), strict=False)
torch.save(lora_start.state_dict(), os.path.join(lora_rm, "pytorch_model.bin"))
flags = flags_for(lora_rm) + ["--lora_dim", "4", "--only_optimize_lora", "--lora_learning_rate", "2e-2"]
got_evals, got_iters, got_steps = run([dschat, "reward"], os.path.join(work, "out1_opt_lora"))
ref = convert_to_lora(RewardModel(AutoModel.from_config(rm_config)), "decoder.layers.", 4, True, force)[0]
ref.load_state_dict(torch.load(os.path.join(lora_rm, "pytorch_model.bin")), strict=True)


def reference_lora(model):
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    lora = [p for n, p in named if "lora_" in n]
    opt = torch.optim.AdamW([{"params": [p for n, p in named if "lora_" not in n], "weight_decay": WD},
                             {"params": lora, "weight_decay": WD, "lr": 2e-2}], lr=LR, betas=(0.9, 0.95), eps=1e-8)
    batches_ = batches(train, 1, 0, B)
    sched = get_scheduler(SCHED, optimizer=opt, num_warmup_steps=WARMUP,
                          num_training_steps=EPOCHS * math.ceil(len(batches_) / GA))
    steps, window, micro = [], [], 0
    for _ in range(EPOCHS):
        for b in batches_:
            loss = model(*collate(b))[0]
            (loss / GA).backward()
            window.append(loss.item())
            micro += 1
            if micro % GA == 0:
                params = [p for p in model.parameters() if p.grad is not None]
                norm = torch.norm(torch.stack([p.grad.detach().norm(2) for p in params]), 2).item()
                if 1.0 / (norm + 1e-6) < 1:
                    for p in params:
                        p.grad.mul_(1.0 / (norm + 1e-6))
                opt.step()
                sched.step()
                opt.zero_grad()
                steps.append(sum(window) / GA)
                window = []
    return steps


ref_losses = reference_lora(ref)
check(len(got_steps) == len(ref_losses) > 0, f"LoRA reward: {len(got_steps)} steps vs {len(ref_losses)}")
for k, (g, r) in enumerate(zip(got_steps, ref_losses)):
    check(close(g[1], r, 2e-5), f"LoRA reward step {k + 1}: loss {g[1]} vs {r}")
print(f"opt LoRA (--only_optimize_lora): {len(got_steps)} steps, losses {[g[1] for g in got_steps][:4]} ... "
      f"(reference {ref_losses[:4]} ...)")

# Inputs a user can get wrong: one error line, exit 1.
flags = flags_for(rm_dir)
step_dir = os.path.join(app, "training", "step2_reward_model_finetuning")
for extra, want in [(["--num_padding_at_beginning", "-1"], "--num_padding_at_beginning -1"),
                    (["--eval_iters", "0"], "--eval_iters 0"), (["--data_split", "10,0,0"], "no training pairs"),
                    (["--lora_dim", "4", "--lora_module_name", "head"], "selects v_head, which dschat does not adapt")]:
    p = subprocess.run([dschat, "reward"] + flags + extra, cwd=step_dir, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    check(p.returncode == 1 and len(lines) == 1 and lines[0].startswith("dschat: error: ") and want in lines[0],
          f"{extra}: rc {p.returncode}, stderr {p.stderr!r}")

shutil.rmtree(work, ignore_errors=True)
if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("dschat reward matches DeepSpeed-Chat's step 2 (transformers + PyTorch) on 1 and 2 processes")

"""dschat ppo against DeepSpeed-Chat's step 3 computed with transformers and
PyTorch.

Usage: ppo_check.py DSCHAT DSRUN SHARED_DATA_DIR

Per family (GPT-2, OPT): a tiny causal LM is the step-1 actor and a tiny
RewardModel saved as step 2 saves it is the critic (and the reward model).
dschat ppo runs from training/step3_rlhf_finetuning/ below local/jsonfile
data, on one process (GPT-2, OPT) and on two (OPT; the actor under ZeRO-3,
the critic under ZeRO-2; the reference averages the ranks' losses), fp32, with generation batches of 3 prompts, PPO mini-batches of 2,
two generation batches per PPO round and two PPO epochs (so that MiniDataset
and random.shuffle order the updates), prompts of different lengths
(left padding), some longer than --max_prompt_seq_len (left out), answers
that end early and answers cut at --max_answer_seq_len, the actor with
weight decay, and --enable_ema. The reference follows main.py and
ppo_trainer.py: the phase-3 split and filter, DistributedSampler,
DataCollatorRLHF, generate() (greedy, pad = eos), the too-short filter,
generate_experience, compute_rewards, get_advantages_and_returns, both
losses, torch AdamW (betas 0.9 / 0.95) on DeepSpeed-Chat's groups with
clipping 1.0 and get_scheduler over num_total_iters, moving_average. Every
round's printed actor loss, critic loss, average and EMA reward must agree,
and the exported actor, critic and actor_ema must hold the reference's
weights. Exits 77 when torch or transformers is missing, or without the
shared GPT-2 vocabulary."""
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
    import torch.nn.functional as F
    from torch.utils.data.distributed import DistributedSampler
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, get_scheduler
except ImportError as e:
    print("SKIP: torch/transformers not importable by", sys.executable, e)
    sys.exit(77)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dschat_ref import Checks, RewardModel, close, make_reward_model, resize_as_dschat  # noqa: E402
from split_ref import split_index  # noqa: E402

dschat, dsrun, shared = sys.argv[1], sys.argv[2], sys.argv[3]
if not os.path.exists(os.path.join(shared, "gpt2-vocab.json")):
    print("SKIP: no", os.path.join(shared, "gpt2-vocab.json"))
    sys.exit(77)
torch.manual_seed(0)
work = tempfile.mkdtemp(prefix="ds_dschat_ppo_")
check = Checks()

app = os.path.join(work, "app")
os.makedirs(os.path.join(app, "data"))
step_dir = os.path.join(app, "training", "step3_rlhf_finetuning")
os.makedirs(step_dir)
rnd = random.Random(5)
words = ["red", "green", "blue", "small", "large", "quick", "slow", "happy", "bright", "quiet"]


def example():
    prompt = "Human: tell me about " + " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 14))) + ". Assistant:"
    return {"prompt": prompt, "chosen": "It is red", "rejected": "No"}


raw = {"train": [example() for _ in range(40)], "eval": [example() for _ in range(4)]}
for split, rows in raw.items():
    with open(os.path.join(app, "data", split + ".json"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

# The unsupervised term's data: a local dataset folder as datasets.load_dataset(FOLDER, "default") reads it, its
# train split the file named so (the test file left out), one example per line (empty ones too), more than
# map's 1000-example batch so that group_texts cuts two batches apart.
UNSUP_DIR = os.path.join(work, "unsup_corpus")
os.makedirs(UNSUP_DIR)
unsup_lines = [" ".join(rnd.choice(words) for _ in range(rnd.randint(0, 4))) for _ in range(1100)]
with open(os.path.join(UNSUP_DIR, "corpus_train.txt"), "w") as f:
    f.write("\n".join(unsup_lines) + "\n")
with open(os.path.join(UNSUP_DIR, "corpus_test.txt"), "w") as f:
    f.write("not read\n")
UNSUP_COEF = 0.5

SEED, SPLIT, G, S, GEN_BATCHES, PPO_EPOCHS, P, A = 1234, "2,2,6", 3, 2, 2, 2, 20, 6
ALR, CLR, AWD, WARMUP, SCHED = 2e-3, 3e-3, 0.1, 1, "linear"
KL, CLIP_REWARD, CLIP, CLIP_V, GAMMA, LAM = 0.1, 5, 0.2, 0.2, 1.0, 0.95


def flags_for(actor, critic):
    return ["--data_path", "local/jsonfile", "--data_split", SPLIT, "--seed", str(SEED),
            "--actor_model_name_or_path", actor, "--critic_model_name_or_path", critic,
            "--per_device_generation_batch_size", str(G), "--per_device_training_batch_size", str(S),
            "--generation_batches", str(GEN_BATCHES), "--ppo_epochs", str(PPO_EPOCHS), "--max_prompt_seq_len",
            str(P), "--max_answer_seq_len", str(A), "--actor_learning_rate", str(ALR), "--critic_learning_rate",
            str(CLR), "--actor_weight_decay", str(AWD), "--lr_scheduler_type", SCHED, "--num_warmup_steps",
            str(WARMUP), "--dtype", "fp32", "--enable_ema", "--deepspeed", "--enable_hybrid_engine"]


ROUND = re.compile(r"^(?:\[rank 0\] )?Epoch: (\d+) \| Step: (\d+) \| PPO Epoch: \d+ \| Actor Loss: (\S+) \| Critic Loss: (\S+) \| "
                   r"Unsupervised Loss: (\S+)$",
                   re.M)
REWARD = re.compile(r"^(?:\[rank 0\] )?Average reward score: (\S+) \| EMA reward score: (\S+)$", re.M)


def run(cmd, flags, out_dir):
    p = subprocess.run(cmd + flags + ["--output_dir", out_dir], cwd=step_dir, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        print(p.stdout[-4000:], p.stderr[-4000:])
        raise SystemExit(f"dschat failed with {p.returncode}")
    rounds = [(int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5)))
              for m in ROUND.finditer(p.stdout)]
    rewards = [(float(m.group(1)), float(m.group(2))) for m in REWARD.finditer(p.stdout)]
    return rounds, rewards, p.stdout


# The reference: DeepSpeed-Chat's step 3 with transformers and PyTorch.
def phase3_prompts(tok):
    out = []
    for i in split_index(SEED, len(raw["train"]), SPLIT, 2):
        enc = tok(" " + raw["train"][int(i)]["prompt"], return_tensors="pt")
        if enc["input_ids"].shape[-1] <= P:  # create_dataset_split's filter
            out.append((enc["input_ids"][0].flip(0), enc["attention_mask"][0].flip(0)))
    return out


def collate(rows, pad):  # DataCollatorRLHF
    prompt = torch.nn.utils.rnn.pad_sequence([r[0] for r in rows], padding_value=pad, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([r[1] for r in rows], padding_value=0, batch_first=True)
    prompt = F.pad(prompt, (0, P - prompt.shape[1]), value=pad)
    mask = F.pad(mask, (0, P - mask.shape[1]), value=0)
    return prompt.flip(1), mask.flip(1)


def gather_log_probs(logits, labels):
    return F.log_softmax(logits, dim=-1).gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)


def optimizer(model, lr, wd, total):  # get_optimizer_grouped_parameters, FusedAdam, get_scheduler
    no_decay = ["bias", "layer_norm.weight", "layernorm.weight", "norm.weight", "ln_f.weight"]
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if not any(nd in n.lower() for nd in no_decay)], "weight_decay": wd},
              {"params": [p for n, p in named if any(nd in n.lower() for nd in no_decay)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)
    return opt, get_scheduler(SCHED, optimizer=opt, num_warmup_steps=WARMUP, num_training_steps=total)


def step(model, opt, sched):  # DeepSpeed's engine.step: clipping 1.0, then the update and the schedule
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.norm(torch.stack([p.grad.detach().norm(2) for p in params]), 2).item()
    if 1.0 / (norm + 1e-6) < 1:
        for p in params:
            p.grad.mul_(1.0 / (norm + 1e-6))
    opt.step()
    sched.step()
    opt.zero_grad()


def unsupervised_blocks(tok):
    """get_unsupervised_data: the text column tokenized, group_texts over map's 1000-example batches."""
    ids = [tok(t)["input_ids"] for t in unsup_lines]
    block, out = P + A, []
    for b0 in range(0, len(ids), 1000):
        cat = [x for row in ids[b0:b0 + 1000] for x in row]
        total = len(cat) // block * block if len(cat) >= block else len(cat)
        out += [cat[i:i + block] for i in range(0, total, block)]
    return out


def reference(actor_dir, critic_dir, rm_config, tok, world, ga, unsup):
    pad = tok.pad_token_id
    prompts = phase3_prompts(tok)
    per_rank = []  # each rank's generation batches in its DistributedSampler order
    for r in range(world):
        order = list(DistributedSampler(list(range(len(prompts))), num_replicas=world, rank=r))
        per_rank.append([collate([prompts[i] for i in order[k:k + G]], pad) for k in range(0, len(order), G)])
    unsup_rank = [[None] * len(per_rank[r]) for r in range(world)]  # main.py's [[None] * G] placeholder batches
    if unsup:
        blocks = unsupervised_blocks(tok)
        for r in range(world):
            order = list(DistributedSampler(blocks, num_replicas=world, rank=r))
            unsup_rank[r] = [torch.tensor([blocks[i] for i in order[k:k + G]]) for k in range(0, len(order), G)]
    n_gen = min(len(per_rank[0]), len(unsup_rank[0]))  # zip(prompt_train_dataloader, unsupervised_train_dataloader)
    total = int(1 * n_gen * (G / S) * PPO_EPOCHS / ga)
    aga = 2 * ga if unsup else ga  # gradient_accumulation_steps_actor

    def causal():
        m = AutoModelForCausalLM.from_pretrained(actor_dir)
        resize_as_dschat(m, tok)
        return m

    def critic_model():
        m = RewardModel(AutoModel.from_config(rm_config), pad)
        m.load_state_dict(torch.load(os.path.join(critic_dir, "pytorch_model.bin")))
        return m

    actor, ref, ema, critic, reward = causal(), causal(), causal(), critic_model(), critic_model()
    a_opt, a_sched = optimizer(actor, ALR, AWD, total)
    c_opt, c_sched = optimizer(critic, CLR, 0.0, total)
    random.seed(SEED)  # every rank's random module draws the same shuffles
    rounds, rewards, pending, ema_reward, last = [], [], [[] for _ in range(world)], None, [None] * world
    micro_steps, step_average_reward = 0, 0.0  # DeepSpeed's engine counts train_rlhf calls across rounds
    pending_unsup = [[] for _ in range(world)]
    for stp in range(n_gen):
        for r in range(world):  # generate_experience on each rank
            prompt, pmask = per_rank[r][stp]
            for m in (actor, ref, critic, reward):
                m.eval()
            with torch.no_grad():
                seq = actor.generate(prompt, attention_mask=pmask, max_length=P + A, pad_token_id=pad)
            keep = [i for i in range(seq.shape[0]) if (seq[i, P:] != pad).sum() > 1]
            if keep:
                seq = last[r] = seq[keep]
            else:
                seq = last[r]
            actor.train()
            critic.train()
            mask = seq.not_equal(pad).long()
            with torch.no_grad():
                pending[r].append({
                    "logprobs": gather_log_probs(actor(seq, attention_mask=mask).logits[:, :-1], seq[:, 1:]),
                    "ref_logprobs": gather_log_probs(ref(seq, attention_mask=mask).logits[:, :-1], seq[:, 1:]),
                    "rewards": reward.forward_value(seq, mask, prompt_length=P)["chosen_end_scores"],
                    "value": critic.forward_value(seq, mask, return_value_only=True)[:, :-1],
                    "input_ids": seq, "attention_mask": mask})
        for r in range(world):
            pending_unsup[r].append(unsup_rank[r][stp])
        if len(pending[0]) < GEN_BATCHES:
            continue
        minis = [[{k: v[i:i + S] for k, v in e.items()} for e in pending[r] for i in range(0, e["input_ids"].shape[0], S)]
                 for r in range(world)]
        umini = [[u[i:i + S] for u in pending_unsup[r] for i in range(0, u.shape[0], S)] if unsup
                 else [None] * (GEN_BATCHES * math.ceil(G / S)) for r in range(world)]
        pending, pending_unsup = [[] for _ in range(world)], [[] for _ in range(world)]
        a_sum, c_sum, u_sum, avg, inner = 0.0, 0.0, 0.0, 0, 0
        for _ in range(PPO_EPOCHS):
            for i in range(min(len(minis[0]), len(umini[0]))):
                a_losses, c_losses = [], []
                for r in range(world):  # DeepSpeed averages the ranks' gradients
                    e = minis[r][i]
                    start = P - 1
                    action_mask = e["attention_mask"][:, 1:]
                    old_values = e["value"]
                    with torch.no_grad():  # compute_rewards, the zeroing, get_advantages_and_returns
                        rw = -KL * (e["logprobs"] - e["ref_logprobs"])
                        ends = start + action_mask[:, start:].sum(1) + 1
                        clip = torch.clamp(e["rewards"], -CLIP_REWARD, CLIP_REWARD)
                        for j in range(rw.shape[0]):
                            rw[j, start:ends[j]][-1] += clip[j]
                        for j in range(rw.shape[0]):
                            rw[j, ends[j]:] = 0
                            old_values[j, ends[j]:] = 0
                        lastgaelam, adv_rev, length = 0, [], rw.shape[-1]
                        for t in reversed(range(start, length)):
                            nextvalues = old_values[:, t + 1] if t < length - 1 else 0.0
                            delta = rw[:, t] + GAMMA * nextvalues - old_values[:, t]
                            lastgaelam = delta + GAMMA * LAM * lastgaelam
                            adv_rev.append(lastgaelam)
                        adv = torch.stack(adv_rev[::-1], dim=1)
                        returns = adv + old_values[:, start:]
                    seq_, msk = e["input_ids"], e["attention_mask"]
                    lp = gather_log_probs(actor(seq_, attention_mask=msk).logits[:, :-1], seq_[:, 1:])[:, start:]
                    am = action_mask[:, start:]
                    ratio = torch.exp((lp - e["logprobs"][:, start:]) * am)
                    pg = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP))
                    a_losses.append(torch.sum(pg * am) / am.sum())
                    v = critic.forward_value(seq_, msk, return_value_only=True)[:, :-1][:, start:]
                    vc = torch.clamp(v, old_values[:, start:] - CLIP_V, old_values[:, start:] + CLIP_V)
                    c_losses.append(0.5 * torch.sum(torch.max((v - returns) ** 2, (vc - returns) ** 2) * am) / am.sum())
                    avg += e["rewards"].mean() / world
                # engine.backward scales by 1 / gradient_accumulation_steps; engine.step steps at the boundary
                (sum(a_losses) / world / aga).backward()
                (sum(c_losses) / world / ga).backward()
                if unsup:  # train_unsupervised: the actor's causal LM loss times unsup_coef, another actor micro-step
                    u_losses = [actor(umini[r][i], attention_mask=torch.ones_like(umini[r][i]), labels=umini[r][i]).loss
                                for r in range(world)]
                    (sum(u_losses) / world * UNSUP_COEF / aga).backward()
                    u_sum += sum(x.item() for x in u_losses) / world
                micro_steps += 1
                if micro_steps % ga == 0:
                    step(actor, a_opt, a_sched)
                    step(critic, c_opt, c_sched)
                a_sum += sum(x.item() for x in a_losses) / world
                c_sum += sum(x.item() for x in c_losses) / world
                inner += 1
                with torch.no_grad():  # moving_average
                    for p_, pe in zip(actor.parameters(), ema.parameters()):
                        pe.data.copy_(torch.lerp(p_.data, pe.data, 0.992))
            idx = list(range(len(minis[0])))  # every rank's random.shuffle draws the same permutation
            random.shuffle(idx)
            minis = [[m[k] for k in idx] for m in minis]
            uidx = list(range(len(umini[0])))
            random.shuffle(uidx)
            umini = [[m[k] for k in uidx] for m in umini]
        avg = avg.item()
        step_average_reward += avg / aga
        if (stp + 1) % aga == 0:
            ema_reward = 0.9 * (step_average_reward if ema_reward is None else ema_reward) + 0.1 * step_average_reward
            step_average_reward = 0.0
        rounds.append((0, stp, a_sum / inner, c_sum / inner, u_sum / inner))
        rewards.append((avg / inner, 0.0 if ema_reward is None else ema_reward))
    return rounds, rewards, actor, critic, ema


def weights_match(what, got, want, tol=2e-3):
    check(sorted(got) == sorted(want), f"{what}: names {sorted(set(got) ^ set(want))[:6]}")
    worst = max(((got[k].float() - want[k].float()).abs().max().item() / (want[k].abs().max().item() + 1e-6), k)
                for k in want if k in got and not k.endswith(NULL_DIRECTIONS))
    check(worst[0] < tol, f"{what}: weights differ by {worst}")


# Weights the losses do not depend on: a key bias shifts every score of a query row (softmax ignores it); its
# gradient is rounding noise, which Adam turns into steps of about lr in either direction.
NULL_DIRECTIONS = ("k_proj.bias",)
RUNS = [("gpt2", 1, 1, False, [dschat, "ppo"]), ("opt", 1, 1, False, [dschat, "ppo"]),
        # OPT-350m's blocks (post-LayerNorm, project_in / project_out) in the actor, its generation and the critic
        ("opt350m", 1, 1, False, [dschat, "ppo"]),
        # gradient accumulation over 3 mini-batches: 8 per round, so the groups span rounds
        ("gpt2", 1, 3, False, [dschat, "ppo"]),
        # the unsupervised term (the actor accumulates 2 x 2 micro-batches per step), OPT's tokenizer adding a bos
        ("opt", 1, 2, True, [dschat, "ppo"]),
        # two ranks: the actor under ZeRO-3 (generation keeps the ranks in step), the critic under ZeRO-2
        ("opt", 2, 1, False, [dsrun, "--num_gpus", "2", "--master_port", "29614", dschat, "ppo", "--actor_zero_stage",
                              "3", "--critic_zero_stage", "2"])]
for family, world, ga, unsup, cmd in RUNS:
    tag = f"{family}{world}{ga}{'u' if unsup else ''}"
    critic_dir, tok, rm_config = make_reward_model(family, os.path.join(work, tag), shared)
    actor_dir = os.path.join(work, tag, "step1_" + family)
    flags = flags_for(actor_dir, critic_dir) + ["--gradient_accumulation_steps", str(ga)]
    if unsup:
        flags += ["--unsupervised_dataset_name", UNSUP_DIR, "--unsupervised_dataset_config_name", "default",
                  "--unsup_coef", str(UNSUP_COEF)]
    out_dir = os.path.join(work, "out_" + tag)
    got_rounds, got_rewards, stdout = run(cmd, flags, out_dir)
    ref_rounds, ref_rewards, ref_actor, ref_critic, ref_ema = reference(actor_dir, critic_dir, rm_config, tok, world,
                                                                        ga, unsup)
    family = f"{family} world {world} gradient accumulation {ga}{' unsupervised' if unsup else ''}"
    print(f"{family}: {len(got_rounds)} PPO rounds; actor/critic losses {got_rounds} (reference {ref_rounds}); "
          f"rewards {got_rewards} (reference {ref_rewards})")
    check(len(got_rounds) == len(ref_rounds) > 0 and len(got_rewards) == len(ref_rewards),
          f"{family}: {len(got_rounds)} rounds, {len(got_rewards)} reward lines (reference {len(ref_rounds)})")
    for g, r in zip(got_rounds, ref_rounds):
        check(g[:2] == r[:2] and close(g[2], r[2], 1e-3, 1e-4) and close(g[3], r[3], 1e-3, 1e-4)
              and close(g[4], r[4], 1e-4, 1e-5) and (g[4] > 0) == unsup,
              f"{family} round {g[:2]}: actor/critic/unsupervised loss {g[2:]} vs {r[2:]}")
    for g, r in zip(got_rewards, ref_rewards):
        check(close(g[0], r[0], 1e-4, 1e-5) and close(g[1], r[1], 1e-4, 1e-5), f"{family}: rewards {g} vs {r}")
    # The exports: the actor as a causal LM, the critic in RewardModel's names (step 3 writes both as it saves
    # them), actor_ema; each the reference's weights.
    actor = AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, "actor"))
    weights_match(f"{family} actor", actor.state_dict(), ref_actor.state_dict())
    ema = AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, "actor_ema"))
    weights_match(f"{family} actor_ema", ema.state_dict(), ref_ema.state_dict())
    got = torch.load(os.path.join(out_dir, "critic", "pytorch_model.bin"), weights_only=True)
    critic = RewardModel(AutoModel.from_config(AutoConfig.from_pretrained(os.path.join(out_dir, "critic"))))
    critic.load_state_dict(got, strict=True)
    weights_match(f"{family} critic", got, ref_critic.state_dict())

# Inputs a user can get wrong: one error line, exit 1.
for extra, want in [(["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps 0"),
                    (["--max_prompt_seq_len", "1"], "--max_prompt_seq_len 1"),
                    (["--max_prompt_seq_len", "60", "--max_answer_seq_len", "10"], "longer than the model's 64"),
                    (["--unsupervised_dataset_name", "x", "--unsupervised_dataset_config_name", "y"], "unsupervised"),
                    (["--data_split", "10,0,0"], "leaves no prompts")]:
    p = subprocess.run([dschat, "ppo"] + flags + extra, cwd=step_dir, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    check(p.returncode == 1 and len(lines) == 1 and lines[0].startswith("dschat: error: ") and want in lines[0],
          f"{extra}: rc {p.returncode}, stderr {p.stderr!r}")

shutil.rmtree(work, ignore_errors=True)
if check.failures:
    print(f"{len(check.failures)} check(s) failed")
    sys.exit(1)
print("dschat ppo matches DeepSpeed-Chat's step 3 (transformers + PyTorch)")

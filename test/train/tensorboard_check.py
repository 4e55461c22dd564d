#!/usr/bin/env python3
"""Trains a tiny model with dstrain writing TensorBoard events (Megatron's
--tensorboard-dir and the --log-*-to-tensorboard flags, then a resumed run into
the same directory) and reads the events back with TensorBoard's own
EventAccumulator: the tags Megatron-DeepSpeed writes are there, the losses and
learning rates equal the CSV monitor's, validation and optimizer-state scalars
are present, and the resumed run continues the same curves.
Exit 77 (skip) when the tensorboard package is not importable."""
import csv, json, math, os, subprocess, sys, tempfile

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except Exception as e:  # pragma: no cover - environment dependent
    print(f"SKIP: tensorboard not importable ({e}); scripts/setup.sh installs it into .deps/tensorboard")
    sys.exit(77)

bindir = sys.argv[1]
dstrain, dsprep = f"{bindir}/apps/dstrain/dstrain", f"{bindir}/apps/dsprep/dsprep"
failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    failures += 0 if cond else 1


def scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


with tempfile.TemporaryDirectory() as d:
    q = lambda *a: subprocess.run(list(a), check=True, stdout=subprocess.DEVNULL)
    q(dsprep, "--generate-corpus", f"{d}/corpus.txt", "--size-mb", "0.2", "--seed", "3")
    q(dsprep, "--train-tokenizer", "--input", f"{d}/corpus.txt", "--vocab-size", "300", "--output-dir", f"{d}/tok")
    q(dsprep, "--input", f"{d}/corpus.txt", "--output-prefix", f"{d}/data", "--vocab-file", f"{d}/tok/vocab.json",
      "--merge-file", f"{d}/tok/merges.txt")
    with open(f"{d}/ds.json", "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                   "csv_monitor": {"enabled": True, "output_path": f"{d}/csv", "job_name": "run"}}, f)
    tb = f"{d}/tb"
    common = [dstrain, "--deepspeed_config", f"{d}/ds.json", "--num-layers", "2", "--hidden-size", "32",
              "--num-attention-heads", "2", "--seq-length", "32", "--max-position-embeddings", "32",
              "--train-iters", "12", "--lr", "3e-3", "--min-lr", "3e-4", "--lr-warmup-iters", "2",
              "--log-interval", "4", "--eval-interval", "4", "--eval-iters", "1", "--data-path", f"{d}/data",
              "--vocab-file", f"{d}/tok/vocab.json", "--merge-file", f"{d}/tok/merges.txt",
              "--tensorboard-dir", tb, "--tensorboard-queue-size", "1", "--log-timers-to-tensorboard",
              "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
              "--log-optimizer-states-to-tensorboard", "--save", f"{d}/ckpt", "--save-interval", "6"]
    subprocess.run(common + ["--exit-interval", "6"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(common + ["--load", f"{d}/ckpt"], check=True, stdout=subprocess.DEVNULL)
    files = sorted(os.listdir(tb))
    check(len(files) == 2 and all(".tfevents." in f for f in files), f"two event files (one per run): {files}")

    acc = EventAccumulator(tb, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = {"lm-loss-training/lm loss", "lm-loss-training/lm loss vs samples", "lm-loss-training/lm loss vs tokens",
            "learning-rate/learning-rate", "batch-size/batch-size", "grad-norm/grad-norm",
            "iteration-time/iteration-time", "lm-loss-validation/lm loss validation",
            "lm-loss-validation/lm loss validation ppl", "steps-vs-samples/y=steps,x=samples",
            "steps-vs-tokens/y=tokens,x=steps", "seqlen/actual_seq_length", "optimizer/variance_l2",
            "optimizer/momentum_l1", "optimizer/weight_abs_max", "optimizer/variance_sqrt_l2 vs tokens"}
    check(want <= tags, f"Megatron's tags present (missing: {sorted(want - tags)})")
    check("loss-scale/loss-scale" not in tags, "no loss scale without fp16")

    with open(f"{d}/csv/run/train.csv") as f:
        rows = list(csv.DictReader(f))
    loss = dict(scalars(acc, "lm-loss-training/lm loss"))
    lr = dict(scalars(acc, "learning-rate/learning-rate"))
    check(sorted(loss) == list(range(1, 13)), f"a loss per iteration 1..12 across both runs: {sorted(loss)}")
    # The CSV monitor logs every log interval; TensorBoard every iteration.
    matched = [abs(loss[int(r["iteration"])] - float(r["loss"])) <= 1e-6 * abs(float(r["loss"])) +
               1e-7 for r in rows]
    check(len(rows) >= 3 and all(matched), f"losses equal the CSV monitor's at {len(rows)} logged iterations")
    check(all(abs(lr[int(r["iteration"])] - float(r["lr"])) <= 1e-6 * float(r["lr"]) for r in rows),
          "learning rates equal the CSV monitor's")
    samples = dict(scalars(acc, "lm-loss-training/lm loss vs samples"))
    check(sorted(samples) == [8 * i for i in range(1, 13)], "the 'vs samples' steps are consumed samples")
    check(dict(scalars(acc, "batch-size/batch-size")).get(5) == 8.0, "batch size 8")
    val = dict(scalars(acc, "lm-loss-validation/lm loss validation"))
    ppl = dict(scalars(acc, "lm-loss-validation/lm loss validation ppl"))
    check(sorted(val) == [4, 8, 12], f"validation at 4, 8 and 12: {sorted(val)}")
    check(all(abs(ppl[k] - math.exp(v)) <= 1e-4 * ppl[k] for k, v in val.items()), "ppl = exp(validation loss)")
    v_l2 = dict(scalars(acc, "optimizer/variance_l2"))
    w_max = dict(scalars(acc, "optimizer/weight_abs_max"))
    check(sorted(v_l2) == list(range(1, 13)) and all(x > 0 for x in v_l2.values()), "optimizer states every iteration")
    check(all(0 < x < 10 for x in w_max.values()), "weight abs max is plausible")
    first_loss, last_loss = loss[1], loss[12]
    check(last_loss < first_loss, f"loss falls: {first_loss:.3f} -> {last_loss:.3f}")

print(f"tensorboard: {'FAILED' if failures else 'all passed'} ({failures} failures)")
sys.exit(1 if failures else 0)

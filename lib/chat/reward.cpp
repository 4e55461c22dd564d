// dschat reward: DeepSpeed-Chat's step 2 (reward.h).
#include "lib/chat/reward.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "lib/chat/chat_args.h"
#include "lib/chat/chat_common.h"
#include "lib/chat/data_split.h"
#include "lib/chat/phase_data.h"
#include "lib/chat/reward_loss.h"
#include "lib/chat/torch_sampler.h"
#include "lib/ckpt/file_io.h"
#include "lib/comm/communicator.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/core/mem_tag.h"
#include "lib/parallel/comms.h"
#include "lib/parallel/rank_grid.h"
#include "lib/train/batch_source.h"
#include "lib/train/trainer.h"

namespace fs = std::filesystem;

namespace ds::chat {

namespace {

constexpr const char* kProg = "dschat reward";
constexpr const char* kEndOfConversation = "<|endoftext|>";  // step 2's, whatever the tokenizer's eos

// step2_reward_model_finetuning/main.py's arguments, defaults included, and
// deepspeed.add_config_arguments'.
std::vector<ArgSpec> step2_specs() {
  using K = ArgKind;
  std::vector<ArgSpec> v = {
      {"--data_path", K::List, {}, {}, false, {"Dahoas/rm-static"}},
      {"--data_split", K::Str, "2,4,4"},
      {"--data_output_path", K::Str, "/tmp/data_files/"},
      {"--model_name_or_path", K::Str, std::nullopt, {}, true},
      {"--num_padding_at_beginning", K::Int, "1"},
  };
  for (auto part : {training_arg_specs("5e-5"), lora_arg_specs()}) v.insert(v.end(), part.begin(), part.end());
  const std::vector<ArgSpec> tail = {
      {"--eval_interval", K::Int, "0"},
      {"--eval_iters", K::Int, "100"},
      {"--compute_fp32_loss", K::Flag},
      {"--enable_tensorboard", K::Flag},
      {"--tensorboard_path", K::Str, "step2_tensorboard"},
      {"--add_eot_token", K::Flag},
      {"--checkpoint_dir", K::Str, std::nullopt},  // dschat's: a resumable checkpoint (EpochCheckpoint)
  };
  v.insert(v.end(), tail.begin(), tail.end());
  const std::vector<ArgSpec> ds = deepspeed_arg_specs();
  v.insert(v.end(), ds.begin(), ds.end());
  return v;
}

// A phase-2 pair as PromptDataset gives it: both texts tokenized, padded,
// with their attention masks' lengths.
struct PairSample {
  PaddedIds chosen, rejected;
};

// create_prompt_dataset for phase 2: each --data_path dataset's phase-2
// part (blended when several), the examples with a prompt, a chosen and a
// rejected answer.
PhaseExamples step2_examples(const ParsedArgs& a, uint32_t seed) {
  const std::vector<double> split = parse_data_split(*a.str("--data_split"), "--data_split");
  DS_USER_CHECK(!a.list("--data_path").empty(), "--data_path: give at least one dataset");
  auto usable = [](std::vector<ChatExample> v) {
    std::erase_if(v, [](const ChatExample& e) { return !prompt_and_chosen(e) || !prompt_and_rejected(e); });
    return v;
  };
  std::vector<PhaseExamples> parts;
  for (const std::string& p : a.list("--data_path")) {
    const RawDataset d = read_dataset(p, "--data_path");
    PhaseExamples pe = phase_examples(d.train, d.eval, split, 2, seed);
    parts.push_back({usable(std::move(pe.train)), usable(std::move(pe.eval))});
  }
  return blend(parts, seed);
}

// This rank's pairs of `examples`, in the order its DistributedSampler visits them.
std::vector<PairSample> rank_pairs(const std::vector<ChatExample>& examples, int world, int rank,
                                   const ChatTokenizer& tok, int64_t T) {
  std::vector<PairSample> out;
  for (int64_t i : distributed_sampler_indices(static_cast<int64_t>(examples.size()), world, rank)) {
    const ChatExample& e = examples[static_cast<size_t>(i)];
    out.push_back({padded_ids(tok, *prompt_and_chosen(e) + kEndOfConversation, T),
                   padded_ids(tok, *prompt_and_rejected(e) + kEndOfConversation, T)});
  }
  return out;
}

// DataCollatorReward's batch of pairs [first, first + n): the n chosen rows,
// then the n rejected rows, with their attention masks as lengths. Its loss
// is the batch's mean over pairs: loss_weight_scale turns the trainer's
// per-token weight (1 / (B x T x ...)) into that of the batch.
MicroBatch pair_batch(const std::vector<PairSample>& pairs, size_t first, size_t n, int64_t B, int64_t T) {
  const int64_t rows = 2 * static_cast<int64_t>(n);
  Tensor tok = Tensor::empty({rows, T}, DType::I32), tgt = Tensor::empty({rows, T}, DType::I32);
  std::fill(tgt.data<int32_t>(), tgt.data<int32_t>() + rows * T, -1);  // no token targets: the head's loss
  Tensor len = Tensor::empty({rows}, DType::I32);
  for (size_t i = 0; i < n; ++i)
    for (int half = 0; half < 2; ++half) {
      const PaddedIds& p = half == 0 ? pairs[first + i].chosen : pairs[first + i].rejected;
      const int64_t r = static_cast<int64_t>(i) + half * static_cast<int64_t>(n);
      std::copy(p.ids.begin(), p.ids.end(), tok.data<int32_t>() + r * T);
      len.data<int32_t>()[r] = static_cast<int32_t>(p.length);
    }
  return {.tokens = tok,
          .targets = tgt,
          .first_sample = 0,
          .step_key = {},
          .loss_weight_scale = static_cast<float>(B * T),
          .lengths = len};
}

// The training micro-batches: this rank's pairs in sampler order, B at a
// time, the last batch of an epoch shorter; every epoch in the same order.
class PairBatches final : public BatchSource {
 public:
  PairBatches(Device dev, std::vector<PairSample> pairs, int64_t B, int64_t T, int64_t total, int rank, int world)
      : BatchSource(dev), pairs_(std::move(pairs)), B_(B), T_(T), total_(total), rank_(rank), world_(world) {}
  int64_t batches_per_epoch() const { return ceil_div(static_cast<int64_t>(pairs_.size()), B_); }
  MicroBatch train_batch(int64_t consumed, int micro, int dp_rank, int dp, int64_t seqlen) override {
    DS_CHECK(seqlen == 0 || seqlen == T_, "dschat: no sequence-length curriculum (seqlen {})", seqlen);
    DS_CHECK(dp_rank == rank_ && dp == world_, "dschat: batches of rank {} of {} asked for rank {} of {}", rank_,
             world_, dp_rank, dp);
    const int64_t k = consumed / (B_ * dp) + micro;  // the global micro-step
    const size_t first = static_cast<size_t>((k % batches_per_epoch()) * B_);
    return pair_batch(pairs_, first, std::min(pairs_.size() - first, static_cast<size_t>(B_)), B_, T_);
  }
  MicroBatch valid_batch(int64_t, int, int) override {
    DS_CHECK(false, "dschat: evaluation does not go through valid_batch");
    return {};
  }
  bool has_valid() const override { return false; }
  int64_t train_samples_per_epoch() const override { return total_; }

 private:
  std::vector<PairSample> pairs_;
  int64_t B_, T_, total_;
  int rank_, world_;
};

// RewardModel.forward on the value head's outputs: the first half of the
// rows chosen, the second rejected; keeps the last batch's end scores.
class RewardHead final : public HeadLoss {
 public:
  RewardHead(int32_t pad, int num_padding_at_beginning) : pad_(pad), npad_(num_padding_at_beginning) {}
  double apply(const Tensor& out, const Tensor& tokens, const Tensor&, float weight, bool backward) override {
    DS_CHECK(out.device().is_cpu() && tokens.device().is_cpu(), "dschat reward runs on the CPU backend");
    const int64_t rows = tokens.size(0), T = tokens.size(1), bs = rows / 2;
    std::vector<float> v(static_cast<size_t>(rows * T));
    load_f32(out, 0, rows * T, v.data());
    const int32_t* ids = tokens.data<int32_t>();
    RewardLoss r = reward_pair_loss({.chosen_ids = ids,
                                     .rejected_ids = ids + bs * T,
                                     .chosen_rewards = v.data(),
                                     .rejected_rewards = v.data() + bs * T,
                                     .bs = bs,
                                     .T = T,
                                     .pad_id = pad_,
                                     .num_padding_at_beginning = npad_});
    if (backward) {
      for (float& g : r.dchosen) g *= weight;
      for (float& g : r.drejected) g *= weight;
      store_f32(out, 0, bs * T, r.dchosen.data());
      store_f32(out, bs * T, bs * T, r.drejected.data());
    }
    chosen_ = std::move(r.chosen_scores);
    rejected_ = std::move(r.rejected_scores);
    return r.loss;
  }
  const std::vector<float>& chosen() const { return chosen_; }
  const std::vector<float>& rejected() const { return rejected_; }

 private:
  int32_t pad_;
  int npad_;
  std::vector<float> chosen_, rejected_;
};

struct RewardEval {
  double chosen = 0, rejected = 0, acc = 0;
};

// evaluation_reward: at most eval_iters batches of eval_b pairs; accuracy =
// chosen end score > rejected over the pairs seen, scores the mean of each
// batch's means; each averaged over the ranks (get_all_reduce_mean).
RewardEval evaluate(Trainer& t, const RewardHead& head, const std::vector<PairSample>& pairs, int64_t eval_b,
                    int64_t eval_iters, int64_t T) {
  const int64_t n = static_cast<int64_t>(pairs.size()), batches = ceil_div(n, eval_b);
  double correct = 0, total = 0, chosen = 0, rejected = 0;
  int64_t steps = 0;
  for (int64_t j = 0; j < batches; ++j) {
    const int64_t first = j * eval_b, count = std::min(eval_b, n - first);
    t.forward_loss(pair_batch(pairs, static_cast<size_t>(first), static_cast<size_t>(count), eval_b, T));
    float sc = 0, sr = 0;  // torch's float32 means
    for (int64_t i = 0; i < count; ++i) {
      const float c = head.chosen()[static_cast<size_t>(i)], r = head.rejected()[static_cast<size_t>(i)];
      correct += c > r ? 1 : 0;
      sc += c;
      sr += r;
    }
    chosen += sc / static_cast<float>(count);
    rejected += sr / static_cast<float>(count);
    total += static_cast<double>(count);
    ++steps;
    if (steps == eval_iters) break;
  }
  const float acc = static_cast<float>(correct / total);
  const float cs = static_cast<float>(chosen / static_cast<double>(steps));
  const float rs = static_cast<float>(rejected / static_cast<double>(steps));
  return {static_cast<float>(t.dp_mean(cs)), static_cast<float>(t.dp_mean(rs)), static_cast<float>(t.dp_mean(acc))};
}

}  // namespace

int run_reward(const std::vector<std::string>& argv) {
  if (wants_help(argv)) {
    std::printf("%s", usage(step2_specs(), kProg).c_str());
    return 0;
  }
  const ParsedArgs a = parse_args(step2_specs(), argv, kProg);
  refuse_deepspeed_config(a, kProg);
  const CommonArgs c = common_args(a, kProg);
  const int64_t npad = *a.integer("--num_padding_at_beginning"), eval_iters = *a.integer("--eval_iters");
  const int64_t eval_interval = *a.integer("--eval_interval");
  DS_USER_CHECK(npad >= 0 && npad < c.T, "{}: --num_padding_at_beginning {} must be in [0, --max_seq_len)", kProg,
                npad);
  DS_USER_CHECK(eval_iters >= 1 && eval_interval >= 0, "{}: --eval_iters {} must be >= 1 and --eval_interval {} >= 0",
                kProg, eval_iters, eval_interval);

  const RendezvousInfo rv = RendezvousInfo::from_env();
  log_set_rank(rv.rank);
  const std::optional<std::string> eot =
      a.flag("--add_eot_token") ? std::optional<std::string>(kEndOfConversation) : std::nullopt;
  ChatModel cm = load_chat_model(a, kProg, eot);
  cm.model.value_head = true;  // AutoModel + RewardModel's v_head
  apply_lora(a, cm.model, kProg);

  const PhaseExamples ex = step2_examples(a, static_cast<uint32_t>(c.seed));
  DS_USER_CHECK(!ex.train.empty(), "{}: phase 2 of --data_split {} leaves no training pairs", kProg,
                *a.str("--data_split"));
  DS_USER_CHECK(!ex.eval.empty(), "{}: phase 2 of --data_split {} leaves no evaluation pairs (DeepSpeed-Chat "
                "evaluates before training)", kProg, *a.str("--data_split"));
  const int world = rv.world_size;
  std::vector<PairSample> train = rank_pairs(ex.train, world, rv.rank, cm.tok, c.T);
  const std::vector<PairSample> eval = rank_pairs(ex.eval, world, rv.rank, cm.tok, c.T);
  const int64_t per_epoch = ceil_div(static_cast<int64_t>(train.size()), c.B);  // micro-batches
  const int64_t steps = c.epochs * per_epoch / c.ga, sched_total = c.epochs * ceil_div(per_epoch, c.ga);
  TrainConfig cfg = chat_train_config(a, cm, c, world, steps, sched_total, "step2_model", kProg);
  EpochCheckpoint ckpt(a.str("--checkpoint_dir"), "reward", kProg);
  ckpt.configure(cfg);

  auto world_comm = make_world_communicator(Backend::Gloo, rv);
  RankGrid grid = make_rank_grid(cfg.layout, rv.rank);
  Comms comms = build_comms(*world_comm, grid);
  const std::optional<std::string> out = a.str("--output_dir");
  if (out) check_output_dir(*out, "--output_dir");  // may hold other files (the scripts log into it)
  Trainer trainer(cfg, comms, rv.local_rank,
                  std::make_unique<PairBatches>(Device::cpu(), std::move(train), c.B, c.T,
                                                static_cast<int64_t>(ex.train.size()), rv.rank, world));
  RewardHead head(cm.tok.pad_id(), static_cast<int>(npad));
  trainer.model().set_head_loss(&head);
  auto scores_line = [](const RewardEval& e) {
    return fmt::format("chosen_last_scores (higher is better) : {}, rejected_last_scores (lower is better) : {}, "
                       "acc (higher is better) : {}",
                       python_repr(e.chosen), python_repr(e.rejected), python_repr(e.acc));
  };
  say("***** Running training *****");
  const int64_t first_epoch = ckpt.resume(trainer);
  if (first_epoch == 0) {
    say(fmt::format("***** Evaluating reward, Epoch 0/{} *****", c.epochs));
    say(scores_line(evaluate(trainer, head, eval, c.eval_b, eval_iters, c.T)));
  }
  int64_t done = trainer.state().iteration;
  for (int64_t e = first_epoch; e < c.epochs; ++e) {
    say(fmt::format("Beginning of Epoch {}/{}, Total Micro Batches {}", e + 1, c.epochs, per_epoch));
    double loss_sum = 0;
    int64_t losses = 0;
    for (const int64_t end = (e + 1) * per_epoch / c.ga; done < end; ++done) {
      loss_sum += static_cast<double>(trainer.iterate()) * static_cast<double>(c.ga);
      losses += c.ga;
      if (eval_interval > 0 && (done + 1) % eval_interval == 0) {
        say(fmt::format("Iter {}: Evaluating reward", done + 1));
        const RewardEval r = evaluate(trainer, head, eval, c.eval_b, eval_iters, c.T);
        say(fmt::format("Iter {}: c_scores: {}, r_scores: {}, diff: {}, acc: {}", done + 1, python_repr(r.chosen),
                        python_repr(r.rejected), python_repr(r.chosen - r.rejected), python_repr(r.acc)));
      }
    }
    // The epoch's mean micro-batch loss (the ranks' mean; upstream prints rank 0's own).
    say(fmt::format("Epoch {}/{} with loss {}", e + 1, c.epochs,
                    python_repr(losses > 0 ? loss_sum / static_cast<double>(losses) : NAN)));
    say(fmt::format("***** Evaluating reward, Epoch {}/{} *****", e + 1, c.epochs));
    say(scores_line(evaluate(trainer, head, eval, c.eval_b, eval_iters, c.T)));
    if (ckpt.end_of_epoch(trainer, e + 1, *world_comm)) return 0;
  }
  if (out) {
    say("saving model ...");
    export_into(trainer, *out, cm.dir, rv.rank);
  }
  DS_LOG("peak resident memory of this rank: {} bytes (getrusage; start-up, training, evaluation and export)",
         peak_rss_bytes());
  world_comm->barrier();
  return 0;
}

}  // namespace ds::chat

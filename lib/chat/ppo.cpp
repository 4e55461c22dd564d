// dschat ppo: DeepSpeed-Chat's step 3 (ppo.h).
//
// Layouts. DeepSpeed-Chat keeps a batch of experience as B rows of L tokens:
// the prompt left-padded to P = --max_prompt_seq_len, the answer after it,
// right-padded; every per-token array has L - 1 entries (ppo_math.h). The
// models here take right-padded micro-batches (MicroBatch::lengths), so each
// row is packed to the left for a forward: the real tokens [s_b, s_b + n_b)
// of the padded row become positions [0, n_b), padded to the longest row. Only the
// real tokens' outputs enter the formulas, and they are unchanged by the
// move: a query sees the same keys (the padding is masked either way), OPT
// derives positions from the attention mask, rotary positions enter the
// scores only as differences, and GPT-2's absolute positions (transformers'
// forward numbers the padded row 0..L-1) are kept by a per-row shift of the
// position table (MicroBatch::shifts).
#include "lib/chat/ppo.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <tuple>
#include <nlohmann/json.hpp>

#include "lib/chat/chat_args.h"
#include "lib/chat/chat_common.h"
#include "lib/chat/data_split.h"
#include "lib/chat/phase_data.h"
#include "lib/chat/ppo_math.h"
#include "lib/chat/py_random.h"
#include "lib/chat/torch_sampler.h"
#include "lib/chat/unsup_data.h"
#include "lib/ckpt/safetensors.h"
#include "lib/core/atomic_file.h"
#include "lib/train/exit_signal.h"
#include "lib/ckpt/file_io.h"
#include "lib/ckpt/hf.h"
#include "lib/comm/communicator.h"
#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_config.h"
#include "lib/core/log.h"
#include "lib/core/mem_tag.h"
#include "lib/gen/generator.h"
#include "lib/model/param_init.h"
#include "lib/parallel/comms.h"
#include "lib/parallel/rank_grid.h"
#include "lib/train/batch_source.h"
#include "lib/train/tensorboard.h"
#include "lib/train/trainer.h"

namespace fs = std::filesystem;

namespace ds::chat {

namespace {

constexpr const char* kProg = "dschat ppo";
constexpr const char* kEndOfConversation = "<|endoftext|>";
constexpr float kEmaBeta = 0.992f;  // moving_average's beta

// step3_rlhf_finetuning/main.py's arguments, defaults included, and
// deepspeed.add_config_arguments'.
std::vector<ArgSpec> step3_specs() {
  using K = ArgKind;
  std::vector<ArgSpec> v = {
      {"--data_path", K::List, {}, {}, false, {"Dahoas/rm-static"}},
      {"--data_split", K::Str, "2,4,4"},
      {"--data_output_path", K::Str, "/tmp/data_files"},
      {"--unsupervised_dataset_name", K::Str, std::nullopt},
      {"--unsupervised_dataset_config_name", K::Str, std::nullopt},
      {"--unsup_coef", K::Float, "27.8"},
      {"--actor_model_name_or_path", K::Str, std::nullopt, {}, true},
      {"--critic_model_name_or_path", K::Str, std::nullopt, {}, true},
      {"--num_padding_at_beginning", K::Int, "1"},
      {"--per_device_generation_batch_size", K::Int, "16"},
      {"--per_device_training_batch_size", K::Int, "16"},
      {"--generation_batches", K::Int, "1"},
      {"--ppo_epochs", K::Int, "1"},
      {"--max_prompt_seq_len", K::Int, "256"},
      {"--max_answer_seq_len", K::Int, "256"},
      {"--actor_learning_rate", K::Float, "9.65e-6"},
      {"--critic_learning_rate", K::Float, "5e-6"},
      {"--actor_weight_decay", K::Float, "0."},
      {"--critic_weight_decay", K::Float, "0."},
      {"--num_train_epochs", K::Int, "1"},
      {"--lr_scheduler_type", K::Str, "cosine",
       {"linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"}},
      {"--gradient_accumulation_steps", K::Int, "1"},
      {"--num_warmup_steps", K::Int, "100"},
      {"--output_dir", K::Str, std::nullopt},
      {"--seed", K::Int, std::nullopt},
      {"--preprocessing_num_workers", K::Int, std::nullopt},
      {"--local_rank", K::Int, "-1"},
      {"--enable_hybrid_engine", K::Flag},
      {"--unpin_actor_parameters", K::Flag},
      {"--release_inference_cache", K::Flag},
      {"--inference_tp_size", K::Int, "1"},
      {"--tp_gather_partition_size", K::Int, "8"},
      {"--offload", K::Flag},
      {"--dtype", K::Str, "fp16", {"fp16", "bf16", "fp32"}},  // fp32: dschat's own (no mixed precision)
      {"--offload_reference_model", K::Flag},
      {"--offload_reward_model", K::Flag},
      {"--actor_zero_stage", K::Int, "0"},
      {"--critic_zero_stage", K::Int, "0"},
      {"--actor_gradient_checkpointing", K::Flag},
      {"--critic_gradient_checkpointing", K::Flag},
      {"--actor_dropout", K::Float, std::nullopt},
      {"--critic_dropout", K::Float, std::nullopt},
      {"--actor_lora_dim", K::Int, "0"},
      {"--actor_lora_module_name", K::Str, "decoder.layers."},
      {"--critic_lora_dim", K::Int, "0"},
      {"--critic_lora_module_name", K::Str, "decoder.layers."},
      {"--only_optimize_lora", K::Flag},
      {"--actor_lora_learning_rate", K::Float, "5e-4"},
      {"--critic_lora_learning_rate", K::Float, "5e-4"},
      {"--enable_ema", K::Flag},
      {"--enable_mixed_precision_lora", K::Flag},
      {"--compute_fp32_loss", K::Flag},
      {"--enable_tensorboard", K::Flag},
      {"--tensorboard_path", K::Str, "step3_tensorboard"},
      {"--add_eot_token", K::Flag},
      {"--align_overflow", K::Flag},
      {"--print_answers", K::Flag},
      {"--print_answers_interval", K::Int, "1"},
      {"--enable_test_mode", K::Flag},
      {"--test_stop_step", K::Int, "0"},
      // dschat's: a resumable checkpoint every --checkpoint_interval PPO rounds (PpoRun::save_round)
      {"--checkpoint_dir", K::Str, std::nullopt},
      {"--checkpoint_interval", K::Int, "1"},
  };
  const std::vector<ArgSpec> ds = deepspeed_arg_specs();
  v.insert(v.end(), ds.begin(), ds.end());
  return v;
}

// The flags checked before anything is loaded.
struct Step3Args {
  int64_t G = 0, S = 0, gen_batches = 0, ppo_epochs = 0, P = 0, A = 0, epochs = 0, ga = 0, warmup = 0;
  int64_t seed = 1234, actor_stage = 0, critic_stage = 0, print_interval = 1, test_stop = 0;
  bool seeded = false;
  // The unsupervised term (both --unsupervised_dataset_name and _config_name given, as upstream).
  bool unsup = false;
  double unsup_coef = 0;
  // main.py's gradient_accumulation_steps_actor: the actor also steps on
  // every unsupervised mini-batch, so its engine accumulates twice as many.
  int64_t actor_ga() const { return unsup ? 2 * ga : ga; }
};

Step3Args check_args(const ParsedArgs& a) {
  Step3Args s;
  auto i = [&](const char* f) { return *a.integer(f); };
  s.G = i("--per_device_generation_batch_size");
  s.S = i("--per_device_training_batch_size");
  s.gen_batches = i("--generation_batches");
  s.ppo_epochs = i("--ppo_epochs");
  s.P = i("--max_prompt_seq_len");
  s.A = i("--max_answer_seq_len");
  s.epochs = i("--num_train_epochs");
  s.ga = i("--gradient_accumulation_steps");
  s.warmup = i("--num_warmup_steps");
  s.actor_stage = i("--actor_zero_stage");
  s.critic_stage = i("--critic_zero_stage");
  s.print_interval = i("--print_answers_interval");
  s.test_stop = i("--test_stop_step");
  DS_USER_CHECK(s.G >= 1 && s.S >= 1 && s.gen_batches >= 1 && s.ppo_epochs >= 1,
                "{}: --per_device_generation_batch_size {}, --per_device_training_batch_size {}, --generation_batches "
                "{} and --ppo_epochs {} must be at least 1", kProg, s.G, s.S, s.gen_batches, s.ppo_epochs);
  DS_USER_CHECK(s.P >= 2 && s.A >= 1, "{}: --max_prompt_seq_len {} must be at least 2 (the reward model's end score "
                "needs prompt_length > 1) and --max_answer_seq_len {} at least 1", kProg, s.P, s.A);
  DS_USER_CHECK(s.epochs >= 0 && s.warmup >= 0 && s.ga >= 1, "{}: --num_train_epochs {} and --num_warmup_steps {} "
                "must be >= 0 and --gradient_accumulation_steps {} >= 1", kProg, s.epochs, s.warmup, s.ga);
  for (const auto& [flag, v] : {std::pair{"--actor_zero_stage", s.actor_stage}, {"--critic_zero_stage", s.critic_stage}})
    DS_USER_CHECK(v >= 0 && v <= 3, "{}: {} {} must be 0, 1, 2 or 3", kProg, flag, v);
  DS_USER_CHECK(s.print_interval >= 1, "{}: --print_answers_interval {} must be at least 1", kProg, s.print_interval);
  DS_USER_CHECK(i("--checkpoint_interval") >= 1, "{}: --checkpoint_interval {} must be at least 1 (PPO rounds)", kProg,
                i("--checkpoint_interval"));
  if (a.integer("--seed")) {
    s.seed = *a.integer("--seed");
    s.seeded = true;
    DS_USER_CHECK(s.seed >= 0 && s.seed <= 0xffffffffLL, "{}: --seed {} must be between 0 and 2**32 - 1 (numpy's "
                  "RandomState splits the data with it)", kProg, s.seed);
  }
  const int64_t tp = i("--inference_tp_size");
  DS_USER_CHECK(tp >= 1, "{}: --inference_tp_size {} must be at least 1", kProg, tp);
  DS_USER_CHECK(tp == 1 || s.actor_stage == 3, "{}: --inference_tp_size {} needs --actor_zero_stage 3 (\"Zero stage "
                "3 must be used to do Tensor sharding in the hybrid engine\")", kProg, tp);
  DS_USER_CHECK(!(s.actor_stage == 2 && s.critic_stage == 2 && a.flag("--enable_hybrid_engine") &&
                  a.flag("--offload") && *a.integer("--actor_lora_dim") == 0),
                "{}: the combination of [actor_zero_stage==2, critic_zero_stage==2, enable_hybrid_engine=True, "
                "offload=True, lora=False] is currently unsupported due to training instability! (DeepSpeed-Chat's "
                "own check)", kProg);
  s.unsup = a.str("--unsupervised_dataset_name") && a.str("--unsupervised_dataset_config_name");
  s.unsup_coef = *a.real("--unsup_coef");
  DS_USER_CHECK(std::isfinite(s.unsup_coef), "{}: --unsup_coef {} must be a finite number", kProg, s.unsup_coef);
  DS_USER_CHECK(!a.flag("--enable_mixed_precision_lora"), "{}: --enable_mixed_precision_lora (ZeRO++'s quantized "
                "frozen weights) is not implemented", kProg);
  // Upstream's align_overflow path calls optimizer.check_overflow(external=True) and sets skip_step, which no
  // DeepSpeed 0.16 optimizer has (FP16_Optimizer and BF16_Optimizer: no check_overflow; ZeRO's: no `external`)
  // and none reads: it stops with an AttributeError or TypeError there. Without fp16 there is no overflow to align.
  DS_USER_CHECK(!a.flag("--align_overflow") || *a.str("--dtype") != "fp16", "{}: --align_overflow with --dtype fp16 "
                "is refused: DeepSpeed-Chat's train_rlhf calls optimizer.check_overflow(external=True), which "
                "DeepSpeed's fp16 optimizers do not provide (it fails there), so there is no upstream behaviour to "
                "reproduce", kProg);
  refuse_deepspeed_config(a, kProg);
  return s;
}

// The phase-3 prompts: each --data_path dataset's phase-3 part, the
// examples with a prompt of at most P tokens (create_dataset_split's
// filter), blended when several; tokenized (the bos first where the
// tokenizer adds one).
std::vector<std::vector<int32_t>> step3_prompts(const ParsedArgs& a, const ChatTokenizer& tok, int64_t P,
                                                uint32_t seed) {
  const std::vector<double> split = parse_data_split(*a.str("--data_split"), "--data_split");
  DS_USER_CHECK(!a.list("--data_path").empty(), "--data_path: give at least one dataset");
  std::vector<PhaseExamples> parts;
  int64_t filtered = 0;
  for (const std::string& p : a.list("--data_path")) {
    const RawDataset d = read_dataset(p, "--data_path");
    PhaseExamples pe = phase_examples(d.train, d.eval, split, 3, seed);
    std::erase_if(pe.train, [&](const ChatExample& e) {
      const std::optional<std::string> text = prompt_text(e);
      if (!text) return true;
      const bool longer = static_cast<int64_t>(tok.encode(*text).size()) > P;
      filtered += longer ? 1 : 0;
      return longer;
    });
    parts.push_back({std::move(pe.train), {}});
  }
  const PhaseExamples all = blend(parts, seed);
  if (filtered > 0)
    DS_LOG("{} phase-3 prompt(s) longer than --max_prompt_seq_len {} tokens left out (as DeepSpeed-Chat filters "
           "them)", filtered, P);
  std::vector<std::vector<int32_t>> out;
  for (const ChatExample& e : all.train) out.push_back(tok.encode(*prompt_text(e)));
  return out;
}

// Generation's end: the model's generation_config.json eos_token_id (its
// first, when a list), else config.json's, else the tokenizer's eos.
int32_t generation_eos(const fs::path& dir, const ChatTokenizer& tok) {
  std::error_code ec;
  for (const char* name : {"generation_config.json", "config.json"}) {
    const fs::path f = dir / name;
    if (!fs::is_regular_file(f, ec)) continue;
    const nlohmann::json j =
        parse_json_text(read_small_file(f.string(), size_t(64) << 20, "'" + f.string() + "'"), "'" + f.string() + "'");
    if (!j.is_object() || !j.contains("eos_token_id")) continue;
    const nlohmann::json& e = j["eos_token_id"];
    if (e.is_number_integer()) return e.get<int32_t>();
    if (e.is_array() && !e.empty() && e[0].is_number_integer()) return e[0].get<int32_t>();
  }
  return tok.eos_id();
}

DType compute_dtype(const std::string& dtype) {
  return dtype == "fp16" ? DType::F16 : dtype == "bf16" ? DType::BF16 : DType::F32;
}

// One experience batch packed for a forward (the file's header comment):
// the host micro-batch, and per row its first real position s and count n.
struct Packed {
  int64_t B = 0, T = 0;
  std::vector<int64_t> s, n;
  MicroBatch mb;
};

// Tcfg: the models' configured sequence length (P + A), which the loss
// weight is relative to; the micro-batch itself is as wide as its longest
// packed row, so that short answers cost no attention or products over
// padding.
Packed pack(const Experience& e, int64_t Tcfg, bool absolute_positions, int32_t pad, int64_t Bcfg) {
  Packed p;
  p.B = e.B;
  for (int64_t b = 0; b < e.B; ++b) {
    const uint8_t* m = e.mask.data() + b * e.L;
    const int64_t s = std::find(m, m + e.L, uint8_t{1}) - m;
    int64_t n = 0;
    while (s + n < e.L && m[s + n]) ++n;
    DS_CHECK(n >= 1 && n <= Tcfg, "dschat ppo: row {} holds {} real tokens of {}", b, n, Tcfg);
    p.s.push_back(s);
    p.n.push_back(n);
  }
  const int64_t T = p.T = *std::max_element(p.n.begin(), p.n.end());
  Tensor tok = Tensor::empty({e.B, T}, DType::I32), tgt = Tensor::empty({e.B, T}, DType::I32);
  Tensor len = Tensor::empty({e.B}, DType::I32), shift = Tensor::empty({e.B}, DType::I32);
  std::fill(tok.data<int32_t>(), tok.data<int32_t>() + e.B * T, pad);
  std::fill(tgt.data<int32_t>(), tgt.data<int32_t>() + e.B * T, -1);  // no token targets: the head's loss
  for (int64_t b = 0; b < e.B; ++b) {
    std::copy_n(e.seq.data() + b * e.L + p.s[static_cast<size_t>(b)], p.n[static_cast<size_t>(b)],
                tok.data<int32_t>() + b * T);
    len.data<int32_t>()[b] = static_cast<int32_t>(p.n[static_cast<size_t>(b)]);
    shift.data<int32_t>()[b] = static_cast<int32_t>(p.s[static_cast<size_t>(b)]);
  }
  p.mb = {.tokens = tok,
          .targets = tgt,
          .first_sample = 0,
          .step_key = {},
          .loss_weight_scale = static_cast<float>(Bcfg * Tcfg),
          .lengths = len,
          .shifts = absolute_positions ? shift : Tensor()};
  return p;
}

// log_softmax of a row of logits at `target`; with g != 0, overwrites the
// row with g times the gradient of that log-probability (onehot - softmax).
float row_logprob(float* row, int64_t V, int32_t target, float g, bool backward) {
  float mx = row[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, row[v]);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  const float lp = row[target] - lse;
  if (backward) {
    for (int64_t v = 0; v < V; ++v) row[v] = -g * std::exp(row[v] - lse);
    row[target] += g;
  }
  return lp;
}

// The heads of the actor and the critic (and the frozen models' outputs):
// what each forward of a packed batch yields or trains on.
class PpoHead final : public HeadLoss {
 public:
  enum class Mode { LogProbs, Values, ActorLoss, CriticLoss };
  explicit PpoHead(PpoConstants k) : k_(k) {}
  // One forward's batch; for the losses also their targets.
  struct Item {
    const Experience* e = nullptr;
    const Packed* p = nullptr;
    const PpoTargets* t = nullptr;
    // The unsupervised term's forward instead: the causal LM loss of the
    // micro-batch's targets (transformers' loss with labels: the mean over
    // the predicted tokens), whatever the mode.
    bool lm = false;
  };
  // The next forwards' batches, one per forward in this order (a training
  // step's accumulated micro-batches).
  void set(Mode m, std::vector<Item> items) {
    mode_ = m;
    items_ = std::move(items);
    next_ = 0;
    losses_.clear();
  }
  void set(Mode m, const Experience* e, const Packed* p, const PpoTargets* t = nullptr) { set(m, {{e, p, t}}); }
  // LogProbs / Values: per padded entry (B x (L - 1)), from start on (zero
  // before it and where the row's position is padding).
  const std::vector<float>& captured() const { return captured_; }
  // ActorLoss / CriticLoss: each forward's loss since set().
  const std::vector<double>& losses() const { return losses_; }

  double apply(const Tensor& out, const Tensor& tokens, const Tensor& targets, float weight, bool backward) override {
    DS_CHECK(out.device().is_cpu() && tokens.device().is_cpu(), "dschat ppo runs on the CPU backend");
    DS_CHECK(next_ < items_.size(), "dschat ppo: a forward without its batch");
    const Item& it = items_[next_++];
    if (it.lm) {
      losses_.push_back(lm_loss(out, targets, weight, backward));
      return losses_.back();
    }
    e_ = it.e;
    p_ = it.p;
    t_ = it.t;
    DS_CHECK(e_ && p_ && tokens.size(0) == p_->B && tokens.size(1) == p_->T, "dschat ppo: head without its batch");
    const double loss = run(out, weight, backward);
    losses_.push_back(loss);
    return loss;
  }
  // A frozen model's outputs (no backward).
  void capture(Mode m, const Experience& e, const Packed& p, const Tensor& out) {
    set(m, &e, &p);
    e_ = &e;
    p_ = &p;
    run(out, 0.f, false);
  }

 private:
  double run(const Tensor& out, float weight, bool backward) {
    const Experience& e = *e_;
    const Packed& p = *p_;
    const int64_t L1 = e.L - 1, start = e.start(), W = e.W(), V = out.size(1), rows = p.B * p.T;
    const bool values = mode_ == Mode::Values || mode_ == Mode::CriticLoss;
    const bool loss = mode_ == Mode::ActorLoss || mode_ == Mode::CriticLoss;
    // Row r = b T + j (packed position j < n of sample b) is padded entry i = s + j; only the entries from
    // start on enter the formulas (compute_rewards' KL terms before it are never used).
    std::vector<float> x(static_cast<size_t>(loss ? e.B * W : e.B * L1), 0.f);
    auto entry = [&](int64_t r) -> int64_t {  // index into x, or -1
      const int64_t b = r / p.T, j = r % p.T, i = p.s[static_cast<size_t>(b)] + j;
      if (j >= p.n[static_cast<size_t>(b)] || i > L1 - 1 || i < start) return -1;
      return loss ? b * W + (i - start) : b * L1 + i;
    };
    auto target = [&](int64_t r) {  // the token row r predicts
      const int64_t b = r / p.T;
      return e.seq[static_cast<size_t>(b * e.L + p.s[static_cast<size_t>(b)] + r % p.T + 1)];
    };
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(values ? 1 : V));
#pragma omp for schedule(dynamic, 4)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = entry(r);
        if (o < 0) continue;
        if (values) {
          load_f32(out, r, 1, &x[static_cast<size_t>(o)]);
        } else {
          load_f32(out, r * V, V, row.data());
          x[static_cast<size_t>(o)] = row_logprob(row.data(), V, target(r), 0.f, false);
        }
      }
    }
    if (!loss) {
      captured_ = std::move(x);
      return 0.0;
    }
    const LossGrad g = mode_ == Mode::ActorLoss ? actor_loss(x, *t_, k_) : critic_loss(x, *t_, k_);
    if (!backward) return g.loss;
    // Every row of out is overwritten: the gradient where an entry has one, zeros elsewhere.
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(values ? 1 : V));
#pragma omp for schedule(dynamic, 4)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t o = entry(r);
        const float d = o < 0 ? 0.f : weight * g.grad[static_cast<size_t>(o)];
        if (values) {
          store_f32(out, r, 1, &d);
        } else if (d == 0.f) {
          std::fill(row.begin(), row.end(), 0.f);
          store_f32(out, r * V, V, row.data());
        } else {
          load_f32(out, r * V, V, row.data());
          row_logprob(row.data(), V, target(r), d, true);
          store_f32(out, r * V, V, row.data());
        }
      }
    }
    return g.loss;
  }

  // The mean of -log p(target) over the rows whose target is >= 0; with
  // backward every row of out becomes weight times its gradient.
  static double lm_loss(const Tensor& out, const Tensor& targets, float weight, bool backward) {
    const Tensor t = targets.device().is_cpu() ? targets : targets.to(Device::cpu());
    const int64_t rows = out.size(0), V = out.size(1);
    DS_CHECK(t.numel() == rows, "dschat ppo: {} targets for {} rows", t.numel(), rows);
    const int32_t* tg = t.data<int32_t>();
    int64_t count = 0;
    for (int64_t r = 0; r < rows; ++r) {
      DS_CHECK(tg[r] < V, "dschat ppo: target {} outside the vocabulary of {}", tg[r], V);
      count += tg[r] >= 0 ? 1 : 0;
    }
    if (count == 0) return 0.0;
    const float g = -weight / static_cast<float>(count);
    double sum = 0;
#pragma omp parallel reduction(+ : sum)
    {
      std::vector<float> row(static_cast<size_t>(V));
#pragma omp for schedule(dynamic, 4)
      for (int64_t r = 0; r < rows; ++r) {
        if (tg[r] < 0) {
          if (!backward) continue;
          std::fill(row.begin(), row.end(), 0.f);
          store_f32(out, r * V, V, row.data());
          continue;
        }
        load_f32(out, r * V, V, row.data());
        sum -= row_logprob(row.data(), V, tg[r], g, backward);
        if (backward) store_f32(out, r * V, V, row.data());
      }
    }
    return sum / static_cast<double>(count);
  }

  PpoConstants k_;
  Mode mode_ = Mode::LogProbs;
  std::vector<Item> items_;
  size_t next_ = 0;
  std::vector<double> losses_;
  const Experience* e_ = nullptr;  // the running forward's
  const Packed* p_ = nullptr;
  const PpoTargets* t_ = nullptr;
  std::vector<float> captured_;
};

// The micro-batches the next iterate() trains on: the mini-batches of one
// --gradient_accumulation_steps group, micro-batch m the m-th.
class CurrentBatch final : public BatchSource {
 public:
  CurrentBatch(int64_t samples) : BatchSource(Device::cpu()), samples_(samples) {}
  void set(std::vector<MicroBatch> mbs) { mbs_ = std::move(mbs); }
  MicroBatch train_batch(int64_t, int m, int, int, int64_t) override {
    DS_CHECK(m >= 0 && static_cast<size_t>(m) < mbs_.size(), "dschat ppo: a step without its mini-batch {}", m);
    return mbs_[static_cast<size_t>(m)];
  }
  MicroBatch valid_batch(int64_t, int, int) override {
    DS_CHECK(false, "dschat ppo: evaluation does not go through valid_batch");
    return {};
  }
  bool has_valid() const override { return false; }
  int64_t train_samples_per_epoch() const override { return samples_; }

 private:
  int64_t samples_;
  std::vector<MicroBatch> mbs_;
};

// Rows of the unsupervised term's blocks (group_texts' blocks, all of one
// length L), and the micro-batch the actor trains on: the tokens, each
// predicting the next (transformers' labels = input_ids), weighted so that
// the step multiplies the mean loss by unsup_coef as train_unsupervised does.
struct UnsupBatch {
  int64_t B = 0, L = 0;
  std::vector<int32_t> ids;  // B x L
  UnsupBatch rows(int64_t first, int64_t n) const {
    return {n, L, std::vector<int32_t>(ids.begin() + first * L, ids.begin() + (first + n) * L)};
  }
  MicroBatch micro_batch(int64_t Bcfg, int64_t Tcfg, double coef) const {
    Tensor tok = Tensor::empty({B, L}, DType::I32), tgt = Tensor::empty({B, L}, DType::I32);
    std::copy(ids.begin(), ids.end(), tok.data<int32_t>());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < L; ++j)
        tgt.data<int32_t>()[b * L + j] = j + 1 < L ? ids[static_cast<size_t>(b * L + j + 1)] : -1;
    return {.tokens = tok,
            .targets = tgt,
            .first_sample = 0,
            .step_key = {},
            .loss_weight_scale = static_cast<float>(static_cast<double>(Bcfg * Tcfg) * coef),
            .lengths = {},
            .shifts = {}};
  }
};

// Experiences and unsupervised batches in a checkpoint record (JSON numbers:
// a float's value survives the trip through double exactly).
nlohmann::json to_json(const Experience& e) {
  return {{"B", e.B}, {"L", e.L}, {"P", e.P}, {"seq", e.seq}, {"mask", e.mask}, {"logprobs", e.logprobs},
          {"ref_logprobs", e.ref_logprobs}, {"values", e.values}, {"rewards", e.rewards}};
}
nlohmann::json to_json(const UnsupBatch& u) { return {{"B", u.B}, {"L", u.L}, {"ids", u.ids}}; }

Experience experience_from(const nlohmann::json& j, const std::string& what) {
  Experience e;
  try {
    e.B = j.at("B").get<int64_t>();
    e.L = j.at("L").get<int64_t>();
    e.P = j.at("P").get<int64_t>();
    e.seq = j.at("seq").get<std::vector<int32_t>>();
    e.mask = j.at("mask").get<std::vector<uint8_t>>();
    e.logprobs = j.at("logprobs").get<std::vector<float>>();
    e.ref_logprobs = j.at("ref_logprobs").get<std::vector<float>>();
    e.values = j.at("values").get<std::vector<float>>();
    e.rewards = j.at("rewards").get<std::vector<float>>();
  } catch (const nlohmann::json::exception& x) {
    DS_USER_ERROR("{}: a saved experience is malformed ({})", what, x.what());
  }
  // The mask and scores are empty in the last generation batch kept for a batch of too-short answers
  // (recomputed then).
  const size_t n = static_cast<size_t>(e.B * e.L), n1 = static_cast<size_t>(e.B * (e.L - 1));
  auto fits = [](size_t got, size_t want) { return got == want || got == 0; };
  DS_USER_CHECK(e.B >= 1 && e.L >= 2 && e.P >= 1 && e.P < e.L && e.seq.size() == n && fits(e.mask.size(), n) &&
                    fits(e.logprobs.size(), n1) && fits(e.ref_logprobs.size(), n1) && fits(e.values.size(), n1) &&
                    fits(e.rewards.size(), static_cast<size_t>(e.B)),
                "{}: a saved experience's sizes do not fit together", what);
  return e;
}

UnsupBatch unsup_from(const nlohmann::json& j, const std::string& what) {
  UnsupBatch u;
  try {
    u.B = j.at("B").get<int64_t>();
    u.L = j.at("L").get<int64_t>();
    u.ids = j.at("ids").get<std::vector<int32_t>>();
  } catch (const nlohmann::json::exception& x) {
    DS_USER_ERROR("{}: a saved unsupervised batch is malformed ({})", what, x.what());
  }
  DS_USER_CHECK(u.B >= 0 && u.L >= 0 && u.ids.size() == static_cast<size_t>(u.B * u.L),
                "{}: a saved unsupervised batch's sizes do not fit together", what);
  return u;
}

// A model that only runs forwards (the reference and the reward model):
// weights read from its Hugging Face directory once, no gradients, no
// optimizer state.
class FrozenModel {
  static FlatStoreOptions frozen_store() {
    FlatStoreOptions o;
    o.forward_only = true;
    return o;
  }

 public:
  FrozenModel(const ModelConfig& cfg, const fs::path& dir, int64_t file_vocab, DType compute, uint64_t seed)
      : model_(cfg, Device::cpu(), 0, {}, {}, compute, frozen_store()) {
    const ModelLayout full = build_layout(cfg);
    const HfShardReader reader(cfg, full, dir.string(), file_vocab,
                               [&](const ModelLayout& l, int64_t begin, int64_t end, float* out) {
                                 init_params(cfg, l, seed, cfg.init_method_std, out, begin, end);
                               });
    model_.store().init_params(full.total, [&](int64_t begin, int64_t end, float* out) {
      reader.read(full, begin, end, out);
    });
    model_.store().params_updated();
  }
  const Tensor& forward(const Packed& p) {
    model_.set_lengths(p.mb.lengths);
    model_.set_shifts(p.mb.shifts);
    return model_.forward_logits(p.mb.tokens);
  }

 private:
  GptModel model_;
};

bool absolute_positions(const ModelConfig& m) {
  return m.position == PositionKind::Learned && m.position_offset == 0;
}

void log_init(const std::string& name, double seconds) {  // rlhf_engine's log_init
  const std::string msg = seconds < 0 ? "[start] Initializing " + name + " Model [start] "
                                      : fmt::format("[end] Initialized {} Model [end] (duration: {:.2f}s)", name,
                                                    seconds);
  const int64_t pad = std::max<int64_t>(0, 90 - static_cast<int64_t>(msg.size()));
  say(std::string(static_cast<size_t>(pad / 2), '*') + msg + std::string(static_cast<size_t>(pad / 2), '*') +
      (pad % 2 == 1 ? "*" : ""));
}

// Python's repr of a list of strings (batch_decode's output as print shows it).
std::string repr_list(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    const bool dq = v[i].find('\'') != std::string::npos && v[i].find('"') == std::string::npos;
    const char q = dq ? '"' : '\'';
    out += q;
    for (char c : v[i]) {
      if (c == '\\') out += "\\\\";
      else if (c == '\n') out += "\\n";
      else if (c == q) out += std::string("\\") + q;
      else out += c;
    }
    out += q;
  }
  return out + "]";
}

class PpoRun {
 public:
  PpoRun(const ParsedArgs& a, const Step3Args& s) : a_(a), s_(s), rng_(static_cast<uint64_t>(s.seed)) {}
  int run();

 private:
  void load_models();
  std::unique_ptr<Trainer> trained_model(const char* role, const ChatModel& cm, int64_t stage, CurrentBatch*& src,
                                         int64_t max_steps, int64_t total_iters, int64_t samples);
  Experience generate_experience(const std::vector<std::vector<int32_t>>& prompts, int64_t step);
  // The actor's, the critic's and the unsupervised losses of one mini-batch (this rank's).
  struct MiniLoss {
    double actor = 0, critic = 0, unsup = 0;
  };
  // Trains the full accumulation group (one actor step, one critic step);
  // returns each of its mini-batches' losses, in order.
  std::vector<MiniLoss> train_group();
  // Mini-batch k of the open group's losses, forward-only.
  MiniLoss evaluate_losses(size_t k);
  // The unsupervised term's generation batch `step` of this rank (G blocks
  // in DistributedSampler order); nothing when the term is off.
  UnsupBatch unsup_batch(int64_t step) const;
  void train_round(int64_t epoch, int64_t step, std::vector<Experience>& pending, std::vector<UnsupBatch>& unsup,
                   EventFileWriter& tb);
  void ema_update();
  void export_ema(const fs::path& out);

  const ParsedArgs& a_;
  Step3Args s_;
  PpoConstants k_;
  RendezvousInfo rv_;
  std::unique_ptr<Communicator> world_;
  std::optional<ChatModel> actor_cm_, critic_cm_;
  ModelConfig ref_cfg_, reward_cfg_;  // the actor's and critic's models without LoRA
  int32_t pad_ = 0, eos_ = 0;
  int64_t T_ = 0;
  DType compute_ = DType::F32;
  std::unique_ptr<Trainer> actor_, critic_;
  CurrentBatch* actor_src_ = nullptr;
  CurrentBatch* critic_src_ = nullptr;
  std::unique_ptr<FrozenModel> ref_, reward_;
  PpoHead actor_head_{PpoConstants{}}, critic_head_{PpoConstants{}}, frozen_head_{PpoConstants{}};
  std::optional<Experience> last_experience_;
  // The open --gradient_accumulation_steps group (docs/dschat.md): DeepSpeed's
  // engine steps at every ga-th train_rlhf call, counted across PPO rounds, and
  // until then the weights (so every forward in between, generation included)
  // do not change. dschat runs a group's passes when it is full, which gives the
  // same gradients and updates.
  std::vector<Experience> group_;
  std::vector<UnsupBatch> group_unsup_;  // its unsupervised mini-batches (with the term on)
  std::vector<std::vector<int32_t>> unsup_blocks_;  // this rank's blocks in DistributedSampler order
  // The resumable checkpoint (--checkpoint_dir; save_round): the record this
  // run resumes from (the newest matching the trainers' loaded iterations),
  // and this rank's newest saved one.
  std::string ckpt_dir_;
  std::vector<nlohmann::json> records_;  // read from this rank's file when resuming
  nlohmann::json saved_;                 // the last record written (null: none)
  int64_t rounds_ = 0;                   // PPO rounds trained in this run
  // The PPO state at a round's end: what a resumed run needs besides the trainers' checkpoints.
  nlohmann::json round_record(int64_t epoch, int64_t step, int64_t non_overflow, const std::string& ema_file) const;
  // Saves at the end of a round when due (every --checkpoint_interval rounds, or on SIGTERM); returns
  // true when SIGTERM asks every rank to stop.
  bool save_round(int64_t epoch, int64_t step, int64_t non_overflow);
  // The record to resume from, restored (rng, rewards, open group, EMA); its (epoch, next step, non_overflow).
  std::tuple<int64_t, int64_t, int64_t> resume();
  fs::path record_file() const { return fs::path(ckpt_dir_) / fmt::format("dschat_state_rank{}.json", rv_.rank); }
  std::vector<float> ema_;  // rank 0: the actor's moving average (its full layout)
  RankGrid grid_;
  std::unique_ptr<Comms> comms_;
  double generate_s_ = 0, experience_s_ = 0;  // the last generation batch's generation and scoring
  PythonRandom rng_;                     // set_random_seed's random.seed(seed)
  double step_average_reward_ = 0;       // main.py's reward bookkeeping
  std::optional<double> ema_reward_;     // ExponentialMovingAverage(alpha 0.9)
};

nlohmann::json PpoRun::round_record(int64_t epoch, int64_t step, int64_t non_overflow,
                                    const std::string& ema_file) const {
  nlohmann::json group = nlohmann::json::array(), unsup = nlohmann::json::array();
  for (const Experience& e : group_) group.push_back(to_json(e));
  for (const UnsupBatch& u : group_unsup_) unsup.push_back(to_json(u));
  return {{"epoch", epoch},
          {"next_step", step + 1},
          {"actor_iteration", actor_->state().iteration},
          {"critic_iteration", critic_->state().iteration},
          {"world_size", rv_.world_size},
          {"random", rng_.state()},
          {"step_average_reward", step_average_reward_},
          {"ema_reward", ema_reward_ ? nlohmann::json(*ema_reward_) : nlohmann::json()},
          {"non_overflow", non_overflow},
          {"ema_file", ema_file},
          {"group", group},
          {"group_unsup", unsup},
          {"last_experience", last_experience_ ? to_json(*last_experience_) : nlohmann::json()}};
}

// Order: the EMA file (rank 0, a new name), then every rank's record file
// naming the checkpoint on disk and the new one, then the trainers' saves;
// only then are the older trainer steps and EMA file removed. A save cut
// short at any point leaves a record that matches the trainers' 'latest'.
bool PpoRun::save_round(int64_t epoch, int64_t step, int64_t non_overflow) {
  if (ckpt_dir_.empty()) return false;
  ++rounds_;
  const bool stop =
      world_->all_reduce_scalar(exit_signal_received() ? 1.0 : 0.0, Device::cpu(), ReduceOp::Max) > 0;
  if (!stop && rounds_ % *a_.integer("--checkpoint_interval") != 0) return false;
  const fs::path dir(ckpt_dir_);
  std::string ema_file;
  if (a_.flag("--enable_ema")) {
    ema_file = fmt::format("actor_ema_e{}_s{}.safetensors", epoch, step);
    if (rv_.rank == 0) {
      SafetensorsWriter w;
      const Tensor t = Tensor::from_blob(ema_.data(), {static_cast<int64_t>(ema_.size())}, DType::F32);
      w.add("ema", t);
      w.write((dir / ema_file).string());
    }
  }
  const nlohmann::json rec = round_record(epoch, step, non_overflow, ema_file);
  nlohmann::json file = {{"step", "ppo"}, {"records", nlohmann::json::array()}};
  if (!saved_.is_null()) file["records"].push_back(saved_);
  file["records"].push_back(rec);
  write_file_atomic(record_file().string(), file.dump() + "\n");
  world_->barrier();
  if (saved_.is_null() || saved_["actor_iteration"] != rec["actor_iteration"]) actor_->save_checkpoint();
  if (saved_.is_null() || saved_["critic_iteration"] != rec["critic_iteration"]) critic_->save_checkpoint();
  world_->barrier();
  if (rv_.rank == 0) {  // only the newest checkpoint is kept
    std::error_code ec;
    keep_newest_checkpoint(dir / "actor", rec["actor_iteration"].get<int64_t>());
    keep_newest_checkpoint(dir / "critic", rec["critic_iteration"].get<int64_t>());
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("actor_ema_") && name != ema_file) fs::remove(e.path(), ec);
    }
  }
  saved_ = rec;
  DS_LOG("saved the PPO state after epoch {} step {} to {}", epoch, step, ckpt_dir_);
  if (stop)
    say(fmt::format("SIGTERM: stopping after the PPO round of epoch {} step {}, its checkpoint in {}; run the same "
                    "command again to continue", epoch, step, ckpt_dir_));
  return stop;
}

std::tuple<int64_t, int64_t, int64_t> PpoRun::resume() {
  if (records_.empty()) return {0, 0, 0};
  const std::string what = "--checkpoint_dir '" + record_file().string() + "'";
  const int64_t ai = actor_->state().iteration, ci = critic_->state().iteration;
  const nlohmann::json* rec = nullptr;
  for (const nlohmann::json& r : records_)  // the newest that matches the trainers' checkpoints
    if (r.value("actor_iteration", int64_t{-1}) == ai && r.value("critic_iteration", int64_t{-1}) == ci) rec = &r;
  DS_USER_CHECK(rec, "{}: no saved PPO state matches the actor's and critic's checkpoints (iterations {} and {})", what,
                ai, ci);
  try {
    DS_USER_CHECK((*rec)["world_size"].get<int>() == rv_.world_size, "{}: written by {} ranks, this run has {}", what,
                  (*rec)["world_size"].get<int>(), rv_.world_size);
    rng_.set_state((*rec)["random"].get<std::string>());
    step_average_reward_ = (*rec)["step_average_reward"].get<double>();
    if (!(*rec)["ema_reward"].is_null()) ema_reward_ = (*rec)["ema_reward"].get<double>();
    for (const nlohmann::json& e : (*rec)["group"]) group_.push_back(experience_from(e, what));
    for (const nlohmann::json& u : (*rec)["group_unsup"]) group_unsup_.push_back(unsup_from(u, what));
    if (!(*rec)["last_experience"].is_null()) last_experience_ = experience_from((*rec)["last_experience"], what);
    const std::string ema_file = (*rec)["ema_file"].get<std::string>();
    DS_USER_CHECK(ema_file.empty() == !a_.flag("--enable_ema"), "{}: saved {} --enable_ema; give the same flags", what,
                  ema_file.empty() ? "without" : "with");
    if (!ema_file.empty() && rv_.rank == 0) {
      const SafetensorsFile f = SafetensorsFile::open((fs::path(ckpt_dir_) / ema_file).string());
      const Tensor t = f.get("ema");
      DS_USER_CHECK(static_cast<size_t>(t.numel()) == ema_.size() || ema_.empty(), "{}: the saved EMA holds {} "
                    "values for a model of {}", what, t.numel(), ema_.size());
      ema_.assign(t.data<float>(), t.data<float>() + t.numel());
    }
    saved_ = *rec;
    const int64_t epoch = (*rec)["epoch"].get<int64_t>(), next = (*rec)["next_step"].get<int64_t>();
    say(fmt::format("resuming from --checkpoint_dir {}: after epoch {} step {} (actor iteration {}, critic iteration "
                    "{})", ckpt_dir_, epoch, next - 1, ai, ci));
    return {epoch, next, (*rec)["non_overflow"].get<int64_t>()};
  } catch (const nlohmann::json::exception& x) {
    DS_USER_ERROR("{}: a saved PPO state is malformed ({})", what, x.what());
  }
}

Experience PpoRun::generate_experience(const std::vector<std::vector<int32_t>>& prompts, int64_t step) {
  const int64_t P = s_.P, B = static_cast<int64_t>(prompts.size());
  const auto t0 = std::chrono::steady_clock::now();
  gen::GenOptions opt;
  opt.max_new_tokens = static_cast<int>(s_.A);
  opt.sampling.greedy = true;
  opt.stop_ids = {eos_};
  if (pad_ != eos_) opt.stop_ids.push_back(pad_);  // a generated padding token ends the answer (docs/dschat.md)
  if (rv_.world_size > 1 && s_.actor_stage == 3)  // every rank gathers each step's weights: transformers' synced_gpus
    opt.synced = [&](bool done) {
      return world_->all_reduce_scalar(done ? 0.0 : 1.0, Device::cpu()) == 0.0;
    };
  // The actor's weights (LoRA fused, ZeRO-3 gathered) are prepared once for the whole call.
  struct Held {
    GptModel& m;
    explicit Held(GptModel& model) : m(model) { m.hold_params(true); }
    ~Held() { m.hold_params(false); }
  };
  std::vector<gen::GenResult> res;
  {
    const Held held(actor_->model());
    res = gen::generate(actor_->model(), prompts, opt);
  }
  generate_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // seq: the left-padded prompt, the answer (with the eos that ended it, unless that is the padding id), padding.
  std::vector<std::vector<int32_t>> answers(static_cast<size_t>(B));
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> ans = res[static_cast<size_t>(b)].tokens;
    int64_t steps = static_cast<int64_t>(ans.size());
    if (res[static_cast<size_t>(b)].reason == gen::StopReason::EndOfDocument) {
      ++steps;  // the stop token took a step
      if (eos_ != pad_ && static_cast<int64_t>(ans.size()) < s_.A) ans.push_back(eos_);
    }
    longest = std::max(longest, std::min(steps, s_.A));
    answers[static_cast<size_t>(b)] = std::move(ans);
  }
  const int64_t L = P + longest;
  std::vector<int64_t> keep;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t valid = static_cast<int64_t>(answers[static_cast<size_t>(b)].size());  // ans != pad
    if (valid <= 1) {
      std::printf("Dropping too short generated answer: step=%ld: \nprompts: %s\nanswers: %s\n",
                  static_cast<long>(step), repr_list({actor_cm_->tok.decode(prompts[static_cast<size_t>(b)])}).c_str(),
                  repr_list({actor_cm_->tok.decode(answers[static_cast<size_t>(b)])}).c_str());
      continue;
    }
    keep.push_back(b);
  }
  if (a_.flag("--print_answers") && step % s_.print_interval == 0) {
    std::vector<std::string> ps, as;
    for (int64_t b = 0; b < B; ++b) {
      ps.push_back(actor_cm_->tok.decode(prompts[static_cast<size_t>(b)]));
      as.push_back(actor_cm_->tok.decode(answers[static_cast<size_t>(b)]));
    }
    std::printf("--- prompt --> step=%ld, rank=%d, %s\n", static_cast<long>(step), rv_.rank, repr_list(ps).c_str());
    std::printf("--- ans    --> step=%ld, rank=%d, %s\n", static_cast<long>(step), rv_.rank, repr_list(as).c_str());
    std::fflush(stdout);
  }
  Experience e;
  if (keep.empty()) {
    std::printf("All generated results are too short for rank=%d step=%ld\n", rv_.rank, static_cast<long>(step));
    DS_USER_CHECK(last_experience_.has_value(), "{}: every answer of the first generation batch is shorter than 2 "
                  "tokens (DeepSpeed-Chat: 'Invalid generated experience at step={}'); start from a step-1 model",
                  kProg, step);
    e = *last_experience_;
  } else {
    e.B = static_cast<int64_t>(keep.size());
    e.L = L;
    e.P = P;
    e.seq.assign(static_cast<size_t>(e.B * L), pad_);
    for (int64_t r = 0; r < e.B; ++r) {
      const auto& pr = prompts[static_cast<size_t>(keep[static_cast<size_t>(r)])];
      const auto& an = answers[static_cast<size_t>(keep[static_cast<size_t>(r)])];
      std::copy(pr.begin(), pr.end(), e.seq.begin() + r * L + (P - static_cast<int64_t>(pr.size())));
      std::copy(an.begin(), an.end(), e.seq.begin() + r * L + P);
    }
    last_experience_ = e;  // prompts and sequences; the scores are recomputed with today's weights
  }
  e.mask.resize(e.seq.size());
  for (size_t i = 0; i < e.seq.size(); ++i) e.mask[i] = e.seq[i] != pad_;
  // The scores: actor and reference log-probabilities, the reward model's end score, the critic's values.
  const Packed p = pack(e, T_, absolute_positions(actor_cm_->model), pad_, s_.S);
  actor_head_.set(PpoHead::Mode::LogProbs, &e, &p);
  actor_->forward_loss(p.mb);
  e.logprobs = actor_head_.captured();
  frozen_head_.capture(PpoHead::Mode::LogProbs, e, p, ref_->forward(p));
  e.ref_logprobs = frozen_head_.captured();
  // forward_value's chosen_end_scores: the reward model's value at the last real token.
  const Tensor& scores = reward_->forward(p);
  e.rewards.resize(static_cast<size_t>(e.B));
  for (int64_t b = 0; b < e.B; ++b)
    load_f32(scores, b * p.T + p.n[static_cast<size_t>(b)] - 1, 1, &e.rewards[static_cast<size_t>(b)]);
  critic_head_.set(PpoHead::Mode::Values, &e, &p);
  critic_->forward_loss(p.mb);
  e.values = critic_head_.captured();
  experience_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - generate_s_;
  return e;
}

// The actor's micro-batches in train_rlhf's and train_unsupervised's order:
// each mini-batch's PPO loss, then (with the term on) its unsupervised one.
std::vector<PpoRun::MiniLoss> PpoRun::train_group() {
  const size_t n = group_.size();
  std::vector<PpoTargets> t;
  std::vector<Packed> pa, pc;  // sized first: the heads keep pointers into them
  t.reserve(n);
  pa.reserve(n);
  pc.reserve(n);
  std::vector<PpoHead::Item> ia, ic;
  std::vector<MicroBatch> ma, mc;
  for (size_t k = 0; k < n; ++k) {
    const Experience& e = group_[k];
    t.push_back(ppo_targets(e, k_));
    pa.push_back(pack(e, T_, absolute_positions(actor_cm_->model), pad_, s_.S));
    pc.push_back(pack(e, T_, absolute_positions(critic_cm_->model), pad_, s_.S));
    ia.push_back({&e, &pa.back(), &t.back()});
    ic.push_back({&e, &pc.back(), &t.back()});
    ma.push_back(pa.back().mb);
    mc.push_back(pc.back().mb);
    if (s_.unsup) {
      ia.push_back({.lm = true});
      ma.push_back(group_unsup_[k].micro_batch(s_.S, T_, s_.unsup_coef));
    }
  }
  actor_head_.set(PpoHead::Mode::ActorLoss, std::move(ia));
  actor_src_->set(std::move(ma));
  actor_->iterate();
  critic_head_.set(PpoHead::Mode::CriticLoss, std::move(ic));
  critic_src_->set(std::move(mc));
  critic_->iterate();
  const size_t per = s_.unsup ? 2 : 1;
  DS_CHECK(actor_head_.losses().size() == per * n && critic_head_.losses().size() == n,
           "dschat ppo: {} mini-batches trained {} / {} times", n, actor_head_.losses().size(),
           critic_head_.losses().size());
  std::vector<MiniLoss> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back({actor_head_.losses()[per * i], critic_head_.losses()[i],
                   s_.unsup ? actor_head_.losses()[per * i + 1] : 0.0});
  return out;
}

PpoRun::MiniLoss PpoRun::evaluate_losses(size_t k) {
  const Experience& e = group_[k];
  const PpoTargets t = ppo_targets(e, k_);
  const Packed pa = pack(e, T_, absolute_positions(actor_cm_->model), pad_, s_.S);
  actor_head_.set(PpoHead::Mode::ActorLoss, &e, &pa, &t);
  actor_->forward_loss(pa.mb);
  MiniLoss l{.actor = actor_head_.losses().at(0)};
  if (s_.unsup) {
    actor_head_.set(PpoHead::Mode::ActorLoss, {{.lm = true}});
    actor_->forward_loss(group_unsup_[k].micro_batch(s_.S, T_, s_.unsup_coef));
    l.unsup = actor_head_.losses().at(0);
  }
  const Packed pc = pack(e, T_, absolute_positions(critic_cm_->model), pad_, s_.S);
  critic_head_.set(PpoHead::Mode::CriticLoss, &e, &pc, &t);
  critic_->forward_loss(pc.mb);
  l.critic = critic_head_.losses().at(0);
  return l;
}

UnsupBatch PpoRun::unsup_batch(int64_t step) const {
  if (!s_.unsup) return {};
  const int64_t n = static_cast<int64_t>(unsup_blocks_.size()), first = step * s_.G, B = std::min(s_.G, n - first);
  UnsupBatch u{B, static_cast<int64_t>(unsup_blocks_[static_cast<size_t>(first)].size()), {}};
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& blk = unsup_blocks_[static_cast<size_t>(first + b)];
    DS_USER_CHECK(static_cast<int64_t>(blk.size()) == u.L, "--unsupervised_dataset_name: a generation batch mixes "
                  "blocks of {} and {} tokens (a 1000-example batch of the data held fewer than --max_prompt_seq_len + "
                  "--max_answer_seq_len tokens); DeepSpeed-Chat's default_data_collator cannot stack them", u.L,
                  blk.size());
    u.ids.insert(u.ids.end(), blk.begin(), blk.end());
  }
  return u;
}

void PpoRun::ema_update() {
  const ModelLayout& layout = actor_->model().layout();
  Tensor full = Tensor::empty({layout.total}, DType::F32);
  actor_->model().store().get_full_params(full);  // collective for a sharded store
  if (rv_.rank != 0) return;
  const float* w = full.data<float>();
  if (ema_.empty()) {
    ema_.assign(w, w + layout.total);
    return;
  }
  // torch.lerp(param, ema, beta) for beta >= 0.5: ema - (ema - param) * (1 - beta)
  const float c = 1.f - kEmaBeta;
  for (int64_t i = 0; i < layout.total; ++i) ema_[static_cast<size_t>(i)] -= (ema_[static_cast<size_t>(i)] - w[i]) * c;
}

void PpoRun::export_ema(const fs::path& out) {
  if (rv_.rank != 0) return;
  const ModelConfig& cfg = actor_cm_->model;
  const ModelLayout layout = build_layout(cfg);
  std::error_code ec;
  const fs::path tmp = out.parent_path() / ".dschat_actor_ema.tmp";
  fs::remove_all(tmp, ec);
  auto weight = [&](const std::string& name) {
    const ParamSpec& spec = layout.find(name);
    return Tensor::from_blob(ema_.data() + spec.offset, spec.full_shape, DType::F32).clone();
  };
  export_hf_streamed(cfg, layout, [&](const std::string& name) { return lora_fused_weight(cfg, name, weight); },
                     tmp.string(),
                     HfTokenIds{.bos = actor_cm_->tok.bos_id(), .eos = actor_cm_->tok.eos_id()});
  copy_tokenizer_files(actor_cm_->dir, tmp);
  fs::remove_all(out, ec);
  fs::rename(tmp, out, ec);
  DS_USER_CHECK(!ec, "--output_dir: cannot move the EMA model into '{}': {}", out.string(), ec.message());
}

// A trained model's flag: "--actor_" or "--critic_" + name.
std::string role_flag(const char* role, const char* name) { return std::string("--") + role + "_" + name; }

// rlhf_engine's log_init lines around the creation of one model.
void timed_init(const char* name, const std::function<void()>& make) {
  const auto t0 = std::chrono::steady_clock::now();
  log_init(name, -1);
  make();
  log_init(name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void PpoRun::load_models() {
  const std::optional<std::string> eot =
      a_.flag("--add_eot_token") ? std::optional<std::string>(kEndOfConversation) : std::nullopt;
  // The actor's tokenizer serves all four models (the critic's embedding is resized to it).
  actor_cm_ = load_model_dir(*a_.str("--actor_model_name_or_path"), "--actor_model_name_or_path",
                             a_.real("--actor_dropout"), T_, kProg, eot);
  critic_cm_ = load_model_dir(*a_.str("--critic_model_name_or_path"), "--critic_model_name_or_path",
                              a_.real("--critic_dropout"), T_, kProg, eot, &*actor_cm_);
  critic_cm_->model.value_head = true;
  ref_cfg_ = actor_cm_->model;  // the frozen copies have no LoRA
  reward_cfg_ = critic_cm_->model;
  for (auto [role, cm] : {std::pair{"actor", &*actor_cm_}, {"critic", &*critic_cm_}})
    apply_lora({.dim = *a_.integer(role_flag(role, "lora_dim")),
                .module = *a_.str(role_flag(role, "lora_module_name")),
                .only_lora = a_.flag("--only_optimize_lora"),
                .lr = *a_.real(role_flag(role, "lora_learning_rate")),
                .dim_flag = role_flag(role, "lora_dim"),
                .module_flag = role_flag(role, "lora_module_name")},
               *a_.real(role_flag(role, "learning_rate")), cm->model, kProg);
  pad_ = actor_cm_->tok.pad_id();
  eos_ = generation_eos(actor_cm_->dir, actor_cm_->tok);
}

std::unique_ptr<Trainer> PpoRun::trained_model(const char* role, const ChatModel& cm, int64_t stage,
                                               CurrentBatch*& src, int64_t max_steps, int64_t total_iters,
                                               int64_t samples) {
  const TrainFlags f{.lr = *a_.real(role_flag(role, "learning_rate")),
                     .weight_decay = *a_.real(role_flag(role, "weight_decay")),
                     .zero_stage = stage,
                     .B = s_.S,
                     .ga = role == std::string("actor") ? s_.actor_ga() : s_.ga,
                     .warmup = s_.warmup,
                     .seed = s_.seed,
                     .recompute = a_.flag(role_flag(role, "gradient_checkpointing")),
                     .offload = a_.flag("--offload"),
                     .tensorboard = a_.flag("--enable_tensorboard"),
                     .dtype = *a_.str("--dtype"),
                     .scheduler = *a_.str("--lr_scheduler_type"),
                     .tensorboard_path = *a_.str("--tensorboard_path") + "/ds_tensorboard_logs/"};
  TrainConfig cfg = chat_train_config(f, cm, rv_.world_size, max_steps, total_iters,
                                      role == std::string("actor") ? "step3_actor" : "step3_critic", kProg);
  if (!ckpt_dir_.empty()) {  // the resumable checkpoint: DIR/actor, DIR/critic
    cfg.ckpt.save_dir = (fs::path(ckpt_dir_) / role).string();
    if (!records_.empty()) cfg.ckpt.load_dir = cfg.ckpt.save_dir;
  }
  // Both trained models are data-parallel over every rank: one grid and one set of communicators serve
  // them (each trainer's collectives run in the same order on every rank).
  if (!comms_) {
    grid_ = make_rank_grid(cfg.layout, rv_.rank);
    comms_ = std::make_unique<Comms>(build_comms(*world_, grid_));
  }
  auto batches = std::make_unique<CurrentBatch>(samples);
  src = batches.get();
  return std::make_unique<Trainer>(cfg, *comms_, rv_.local_rank, std::move(batches));
}

// One PPO round on the generation batches in `pending` (MiniDataset.seperate, --ppo_epochs passes with
// random.shuffle after each), and its printed and logged summary.
void PpoRun::train_round(int64_t epoch, int64_t step, std::vector<Experience>& pending,
                         std::vector<UnsupBatch>& pending_unsup, EventFileWriter& tb) {
  const auto training_start = std::chrono::steady_clock::now();
  std::vector<Experience> minis;
  for (const Experience& e : pending)
    for (int64_t r = 0; r < e.B; r += s_.S) minis.push_back(e.rows(r, std::min(s_.S, e.B - r)));
  pending.clear();
  // The unsupervised MiniDataset it zips with: the term's mini-batches, or
  // upstream's placeholder list of [None] * G per generation batch.
  std::vector<UnsupBatch> unsup;
  for (const UnsupBatch& u : pending_unsup)
    for (int64_t r = 0; r < (s_.unsup ? u.B : s_.G); r += s_.S)
      unsup.push_back(s_.unsup ? u.rows(r, std::min(s_.S, u.B - r)) : UnsupBatch{});
  pending_unsup.clear();
  const size_t per_epoch = std::min(minis.size(), unsup.size());
  int64_t inner = 0;
  float average_reward = 0.f;
  // This round's mini-batches' losses, in order: from their group's training
  // (train_rlhf), or forward-only for those whose group is still open at the
  // round's end (their gradients are taken when it closes).
  std::vector<MiniLoss> losses;
  size_t earlier = group_.size();  // the open group's mini-batches of earlier rounds
  for (int64_t ep = 0; ep < s_.ppo_epochs; ++ep) {
    for (size_t i = 0; i < per_epoch; ++i) {
      group_.push_back(minis[i]);  // train_rlhf (and train_unsupervised)
      if (s_.unsup) group_unsup_.push_back(unsup[i]);
      if (static_cast<int64_t>(group_.size()) == s_.ga) {
        const std::vector<MiniLoss> g = train_group();
        losses.insert(losses.end(), g.begin() + static_cast<std::ptrdiff_t>(earlier), g.end());
        group_.clear();
        group_unsup_.clear();
        earlier = 0;
      }
      float mean = 0.f;  // exp_data["rewards"].mean() in f32
      for (float r : minis[i].rewards) mean += r;
      average_reward += mean / static_cast<float>(minis[i].B);
      ++inner;
      if (a_.flag("--enable_ema")) ema_update();
    }
    rng_.shuffle(minis);
    rng_.shuffle(unsup);
  }
  for (size_t k = earlier; k < group_.size(); ++k) losses.push_back(evaluate_losses(k));
  double actor_sum = 0, critic_sum = 0, unsup_sum = 0;
  for (const MiniLoss& l : losses) {
    actor_sum += l.actor;
    critic_sum += l.critic;
    unsup_sum += l.unsup;
  }
  // The ranks' means (upstream prints rank 0's own); the last mini-batch's own losses for TensorBoard.
  const double world = static_cast<double>(rv_.world_size);
  actor_sum = world_->all_reduce_scalar(actor_sum, Device::cpu()) / world;
  critic_sum = world_->all_reduce_scalar(critic_sum, Device::cpu()) / world;
  if (s_.unsup) unsup_sum = world_->all_reduce_scalar(unsup_sum, Device::cpu()) / world;
  const double last_actor = losses.empty() ? 0.0 : losses.back().actor;
  const double last_critic = losses.empty() ? 0.0 : losses.back().critic;
  const double training_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - training_start).count();
  const double n = static_cast<double>(inner);
  say(fmt::format("Epoch: {} | Step: {} | PPO Epoch: {} | Actor Loss: {} | Critic Loss: {} | Unsupervised Loss: {}",
                  epoch, step, s_.ppo_epochs, python_repr(actor_sum / n), python_repr(critic_sum / n),
                  python_repr(unsup_sum / n)));
  say(fmt::format("End-to-End => Latency: {:.2f}s | Generation Latency: {:.2f}s | Training Latency: {:.2f}s",
                  training_s + generate_s_ * static_cast<double>(s_.gen_batches), generate_s_, training_s));
  DS_LOG("experience latency: {:.3f}s (the actor, reference, reward and critic forwards of the last generation "
         "batch; upstream's latencies leave them out)", experience_s_);
  const double avg = static_cast<float>(world_->all_reduce_scalar(average_reward, Device::cpu()) /
                                        static_cast<double>(rv_.world_size));
  step_average_reward_ += avg / static_cast<double>(s_.actor_ga());
  if ((step + 1) % s_.actor_ga() == 0) {  // ExponentialMovingAverage(alpha 0.9)
    ema_reward_ = 0.9 * (ema_reward_ ? *ema_reward_ : step_average_reward_) + 0.1 * step_average_reward_;
    step_average_reward_ = 0;
  }
  say(fmt::format("Average reward score: {} | EMA reward score: {}", python_repr(avg / n),
                  python_repr(ema_reward_ ? *ema_reward_ : 0.0)));
  say("-------------------------------------------------------------------------------------");
  if (tb.is_open()) {
    tb.add_scalar("reward", avg / n, step);
    tb.add_scalar("actor_loss", last_actor, step);
    tb.add_scalar("actor_loss_sum", actor_sum, step);
    tb.add_scalar("critic_loss", last_critic, step);
    tb.add_scalar("critic_loss_sum", critic_sum, step);
    tb.flush();
  }
}

int PpoRun::run() {
  rv_ = RendezvousInfo::from_env();
  log_set_rank(rv_.rank);
  const int world = rv_.world_size;
  T_ = s_.P + s_.A;
  compute_ = compute_dtype(*a_.str("--dtype"));
  load_models();
  std::string no_effect;
  for (const char* f : {"--enable_hybrid_engine", "--unpin_actor_parameters", "--release_inference_cache",
                        "--offload_reference_model", "--offload_reward_model", "--compute_fp32_loss"})
    if (a_.flag(f)) no_effect += (no_effect.empty() ? "" : " ") + std::string(f);
  if (!no_effect.empty())
    DS_LOG("{}: accepted with nothing to change (generation always runs on the actor's training weights, the CPU "
           "backend keeps every model in host memory, the losses are computed in f32)", no_effect);
  if (!s_.seeded)
    DS_LOG("no --seed: DeepSpeed-Chat then splits the data at random; dschat uses 1234 (steps 1 and 2's default), "
           "so phase 3's prompts are the part steps 1 and 2 did not train on");

  // Data: this rank's prompts in DistributedSampler order, G at a time.
  const std::vector<std::vector<int32_t>> prompts =
      step3_prompts(a_, actor_cm_->tok, s_.P, static_cast<uint32_t>(s_.seed));
  DS_USER_CHECK(!prompts.empty(), "{}: phase 3 of --data_split {} leaves no prompts of at most "
                "--max_prompt_seq_len {} tokens", kProg, *a_.str("--data_split"), s_.P);
  std::vector<std::vector<int32_t>> mine;
  for (int64_t i : distributed_sampler_indices(static_cast<int64_t>(prompts.size()), world, rv_.rank))
    mine.push_back(prompts[static_cast<size_t>(i)]);
  int64_t n_gen = ceil_div(static_cast<int64_t>(mine.size()), s_.G);
  if (s_.unsup) {  // get_unsupervised_data: its own DistributedSampler; the loaders are zipped
    const std::string flag = "--unsupervised_dataset_name";
    std::vector<std::vector<int32_t>> ids;
    for (const std::string& text :
         read_unsupervised_texts(*a_.str(flag), *a_.str("--unsupervised_dataset_config_name"), flag))
      ids.push_back(actor_cm_->tok.encode(text));
    const std::vector<std::vector<int32_t>> blocks = group_texts(ids, T_);
    DS_USER_CHECK(!blocks.empty(), "{} '{}' holds no token", flag, *a_.str(flag));
    for (int64_t i : distributed_sampler_indices(static_cast<int64_t>(blocks.size()), world, rv_.rank))
      unsup_blocks_.push_back(blocks[static_cast<size_t>(i)]);
    n_gen = std::min(n_gen, ceil_div(static_cast<int64_t>(unsup_blocks_.size()), s_.G));
    DS_LOG("unsupervised term: {} blocks of {} tokens from {} texts of '{}', coefficient {}", blocks.size(), T_,
           ids.size(), *a_.str(flag), s_.unsup_coef);
  }
  // create_datasets' num_total_iters (the schedules' length), in Python's float arithmetic.
  const double per_epoch = static_cast<double>(n_gen) * (static_cast<double>(s_.G) / static_cast<double>(s_.S)) *
                           static_cast<double>(s_.ppo_epochs) / static_cast<double>(s_.ga);
  const int64_t total_iters = static_cast<int64_t>(static_cast<double>(s_.epochs) * per_epoch);
  // At most this many steps: every generation batch gives ceil(G / S) mini-batches per PPO epoch, and
  // every --gradient_accumulation_steps of them make a step.
  const int64_t max_steps =
      std::max<int64_t>(1, ceil_div(s_.epochs * n_gen * ceil_div(s_.G, s_.S) * s_.ppo_epochs, s_.ga));

  world_ = make_world_communicator(Backend::Gloo, rv_);
  const std::optional<std::string> out = a_.str("--output_dir");
  if (out) check_output_dir(*out, "--output_dir");
  if (const std::optional<std::string> d = a_.str("--checkpoint_dir")) {
    ckpt_dir_ = *d;
    std::error_code ec;
    fs::create_directories(ckpt_dir_, ec);
    DS_USER_CHECK(!ec && !ckpt_dir_.empty(), "--checkpoint_dir '{}': cannot create it: {}", ckpt_dir_, ec.message());
    const std::string what = "--checkpoint_dir '" + record_file().string() + "'";
    if (fs::exists(record_file(), ec)) {
      const nlohmann::json j = parse_json_text(read_small_file(record_file().string(), size_t(4) << 30, what), what);
      DS_USER_CHECK(j.is_object() && j.value("step", "") == "ppo" && j.contains("records") && j["records"].is_array() &&
                        !j["records"].empty(),
                    "{}: not a dschat ppo checkpoint record", what);
      for (const nlohmann::json& r : j["records"]) records_.push_back(r);
      for (const char* role : {"actor", "critic"})
        DS_USER_CHECK(fs::exists(fs::path(ckpt_dir_) / role / "latest", ec), "{}: there is no {} checkpoint beside "
                      "it ({}/latest)", what, role, role);
    }
    install_exit_signal_handler();
  }
  const int64_t samples = static_cast<int64_t>(mine.size()) * world;
  timed_init("Actor", [&] {
    actor_ = trained_model("actor", *actor_cm_, s_.actor_stage, actor_src_, max_steps, total_iters, samples);
    actor_->model().set_head_loss(&actor_head_);
  });
  timed_init("Ref", [&] {
    ref_ = std::make_unique<FrozenModel>(ref_cfg_, actor_cm_->dir, actor_cm_->file_vocab, compute_,
                                         static_cast<uint64_t>(s_.seed));
  });
  if (a_.flag("--enable_ema")) timed_init("EMA", [&] { ema_update(); });  // starts as the actor
  timed_init("Critic", [&] {
    critic_ = trained_model("critic", *critic_cm_, s_.critic_stage, critic_src_, max_steps, total_iters, samples);
    critic_->model().set_head_loss(&critic_head_);
  });
  timed_init("Reward", [&] {
    reward_ = std::make_unique<FrozenModel>(reward_cfg_, critic_cm_->dir, critic_cm_->file_vocab, compute_,
                                            static_cast<uint64_t>(s_.seed));
  });

  EventFileWriter tb;
  if (a_.flag("--enable_tensorboard") && rv_.rank == 0) {
    const std::string dir = *a_.str("--tensorboard_path") + "/step3_tensorboard_logs";
    std::printf("Tensorboard logs going to: %s\n", dir.c_str());
    tb.open(dir);
  }
  say(fmt::format("***** Running training (total_iters={}) *****", total_iters));
  auto [first_epoch, first_step, non_overflow] = resume();
  if (first_step >= n_gen) {
    ++first_epoch;
    first_step = 0;
  }
  std::vector<Experience> pending;  // MiniDataset's generation batches
  std::vector<UnsupBatch> pending_unsup;  // and the unsupervised term's
  bool stop = false;
  for (int64_t epoch = first_epoch; epoch < s_.epochs && !stop; ++epoch) {
    const int64_t begin = epoch == first_epoch ? first_step : 0;
    if (begin == 0)
      say(fmt::format("Beginning of Epoch {}/{}, Total Generation Batches {}", epoch + 1, s_.epochs, n_gen));
    for (int64_t step = begin; step < n_gen; ++step) {
      const auto first = mine.begin() + static_cast<std::ptrdiff_t>(step * s_.G);
      const std::vector<std::vector<int32_t>> batch(first, first + std::min<std::ptrdiff_t>(s_.G, mine.end() - first));
      const int64_t skipped_before = actor_->state().skipped_steps + critic_->state().skipped_steps;
      pending.push_back(generate_experience(batch, step));
      pending_unsup.push_back(unsup_batch(step));
      const bool round = static_cast<int64_t>(pending.size()) == s_.gen_batches;
      if (round) train_round(epoch, step, pending, pending_unsup, tb);
      const int64_t skipped = actor_->state().skipped_steps + critic_->state().skipped_steps - skipped_before;
      if (skipped == 0) ++non_overflow;
      if (a_.flag("--enable_test_mode") && non_overflow == s_.test_stop) {
        stop = true;
        break;
      }
      if (round && save_round(epoch, step, non_overflow)) {  // SIGTERM: the checkpoint is written; stop here
        world_->barrier();
        return 0;
      }
    }
    if (a_.flag("--enable_test_mode")) break;
  }
  if (out) {
    say("saving model ...");
    export_into(*actor_, fs::path(*out) / "actor", actor_cm_->dir, rv_.rank);
    export_into(*critic_, fs::path(*out) / "critic", actor_cm_->dir, rv_.rank);
    if (a_.flag("--enable_ema")) export_ema(fs::path(*out) / "actor_ema");
  }
  DS_LOG("peak resident memory of this rank: {} bytes (getrusage; four models, generation, training and export)",
         peak_rss_bytes());
  world_->barrier();
  return 0;
}

}  // namespace

int run_ppo(const std::vector<std::string>& argv) {
  if (wants_help(argv)) {
    std::printf("%s", usage(step3_specs(), kProg).c_str());
    return 0;
  }
  const ParsedArgs a = parse_args(step3_specs(), argv, kProg);
  const Step3Args s = check_args(a);
  PpoRun run(a, s);
  return run.run();
}

}  // namespace ds::chat

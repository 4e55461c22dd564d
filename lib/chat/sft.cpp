// dschat sft: DeepSpeed-Chat's step 1 (sft.h).
#include "lib/chat/sft.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lib/chat/chat_args.h"
#include "lib/chat/chat_common.h"
#include "lib/chat/chat_tokenizer.h"
#include "lib/chat/data_split.h"
#include "lib/chat/hf_cache.h"
#include "lib/chat/pairs.h"
#include "lib/chat/phase_data.h"
#include "lib/chat/torch_sampler.h"
#include "lib/ckpt/file_io.h"
#include "lib/ckpt/hf.h"
#include "lib/comm/communicator.h"
#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/core/file_read.h"
#include "lib/core/json_config.h"
#include "lib/core/log.h"
#include "lib/core/mem_tag.h"
#include "lib/optim/lr_schedule.h"
#include "lib/parallel/comms.h"
#include "lib/parallel/rank_grid.h"
#include "lib/train/batch_source.h"
#include "lib/train/trainer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ds::chat {

namespace {

constexpr const char* kProg = "dschat sft";

// step1_supervised_finetuning/main.py's arguments, defaults included, and
// deepspeed.add_config_arguments'.
std::vector<ArgSpec> step1_specs() {
  using K = ArgKind;
  std::vector<ArgSpec> v = {
      {"--data_path", K::List, {}, {}, false, {"Dahoas/rm-static"}},
      {"--data_split", K::Str, "2,4,4"},
      {"--sft_only_data_path", K::List},
      {"--data_output_path", K::Str, "/tmp/data_files/"},
      {"--model_name_or_path", K::Str, std::nullopt, {}, true},
  };
  for (auto part : {training_arg_specs("1e-3"), lora_arg_specs()}) v.insert(v.end(), part.begin(), part.end());
  const std::vector<ArgSpec> tail = {
      {"--compute_fp32_loss", K::Flag},
      {"--enable_tensorboard", K::Flag},
      {"--tensorboard_path", K::Str, "step1_tensorboard"},
      {"--add_eot_token", K::Flag},
      {"--eot_token", K::Str, "<|endoftext|>"},
      {"--print_loss", K::Flag},
      {"--checkpoint_dir", K::Str, std::nullopt},  // dschat's: a resumable checkpoint (EpochCheckpoint)
      {"--mask_prompt", K::Flag},                    // dschat's: the loss over the answer alone
  };
  v.insert(v.end(), tail.begin(), tail.end());
  const std::vector<ArgSpec> ds = deepspeed_arg_specs();
  v.insert(v.end(), ds.begin(), ds.end());
  return v;
}

// The examples step 1 can use (prompt and chosen present).
std::vector<ChatExample> usable(std::vector<ChatExample> v) {
  std::erase_if(v, [](const ChatExample& e) { return !prompt_and_chosen(e); });
  return v;
}


// create_prompt_dataset for phase 1: each --data_path dataset's phase-1
// part (blended when several), then the --sft_only_data_path datasets whole
// ("10,0,0"), appended and shuffled.
PhaseExamples step1_examples(const ParsedArgs& a, uint32_t seed) {
  const std::vector<double> split = parse_data_split(*a.str("--data_split"), "--data_split");
  DS_USER_CHECK(!a.list("--data_path").empty(), "--data_path: give at least one dataset");
  std::vector<PhaseExamples> parts;
  for (const std::string& p : a.list("--data_path")) {
    const RawDataset d = read_dataset(p, "--data_path");
    PhaseExamples pe = phase_examples(d.train, d.eval, split, 1, seed);
    parts.push_back({usable(std::move(pe.train)), usable(std::move(pe.eval))});
  }
  const PhaseExamples out = blend(parts, seed);
  if (a.list("--sft_only_data_path").empty()) return out;
  std::vector<PhaseExamples> sft;
  for (const std::string& p : a.list("--sft_only_data_path")) {
    const RawDataset d = read_dataset(p, "--sft_only_data_path");
    PhaseExamples pe = phase_examples(d.train, d.eval, {10, 0, 0}, 1, seed);
    sft.push_back({usable(std::move(pe.train)), usable(std::move(pe.eval))});
  }
  return append_sft_only(out, sft, seed);
}

// This rank's samples of `examples`, in the order its DistributedSampler
// visits them; with mask_prompt the prompt's ids (" " + prompt tokenized
// alone, the bos included) are not predicted.
std::vector<SftSample> rank_samples(const std::vector<ChatExample>& examples, int world, int rank,
                                    const ChatTokenizer& tok, int64_t max_seq_len, bool mask_prompt) {
  std::vector<SftSample> out;
  for (int64_t i : distributed_sampler_indices(static_cast<int64_t>(examples.size()), world, rank)) {
    const ChatExample& e = examples[static_cast<size_t>(i)];
    const int64_t prompt = mask_prompt ? static_cast<int64_t>(tok.encode(*prompt_text(e)).size()) : 0;
    out.push_back(sft_sample(tok, *prompt_and_chosen(e), max_seq_len, prompt));
  }
  return out;
}

// The targets that rows [first, first + count) count.
int64_t counted_targets(const std::vector<SftSample>& samples, size_t first, size_t count) {
  int64_t n = 0;
  for (size_t r = first; r < first + count; ++r) n += samples[r].counted;
  return n;
}

// Rows [first, first + count) of `samples` as a (B, T) host micro-batch; the
// rows past count are padding whose targets are all ignored (the mean loss
// over the batch's tokens is then that of the count rows alone).
MicroBatch rows_batch(const std::vector<SftSample>& samples, size_t first, size_t count, int64_t B, int64_t T,
                      int32_t pad) {
  Tensor tok = Tensor::empty({B, T}, DType::I32), tgt = Tensor::empty({B, T}, DType::I32);
  for (int64_t b = 0; b < B; ++b) {
    int32_t* tr = tok.data<int32_t>() + b * T;
    int32_t* gr = tgt.data<int32_t>() + b * T;
    if (static_cast<size_t>(b) < count) {
      const SftSample& s = samples[first + static_cast<size_t>(b)];
      std::copy(s.tokens.begin(), s.tokens.end(), tr);
      std::copy(s.targets.begin(), s.targets.end(), gr);
    } else {
      std::fill(tr, tr + T, pad);
      std::fill(gr, gr + T, -1);
    }
  }
  // The gradient of this batch's mean loss over the tokens it counts (HF's).
  const int64_t counted = counted_targets(samples, first, count);
  const float scale = counted > 0 ? static_cast<float>(static_cast<double>(B * T) / static_cast<double>(counted)) : 1.f;
  return {.tokens = tok, .targets = tgt, .first_sample = 0, .step_key = {}, .loss_weight_scale = scale};
}

// The training micro-batches: this rank's samples in sampler order, B at a
// time, the last batch of an epoch shorter (DataLoader's drop_last=False);
// every epoch in the same order (DeepSpeed-Chat never calls set_epoch).
class SftBatches final : public BatchSource {
 public:
  // samples: those of data-parallel rank `rank` of `world`.
  SftBatches(Device dev, std::vector<SftSample> samples, int64_t B, int64_t T, int32_t pad, int64_t total, int rank,
             int world)
      : BatchSource(dev), samples_(std::move(samples)), B_(B), T_(T), pad_(pad), total_(total), rank_(rank),
        world_(world) {}
  int64_t batches_per_epoch() const { return ceil_div(static_cast<int64_t>(samples_.size()), B_); }
  MicroBatch train_batch(int64_t consumed, int micro, int dp_rank, int dp, int64_t seqlen) override {
    DS_CHECK(seqlen == 0 || seqlen == T_, "dschat: no sequence-length curriculum (seqlen {})", seqlen);
    DS_CHECK(dp_rank == rank_ && dp == world_, "dschat: batches of rank {} of {} asked for rank {} of {}", rank_,
             world_, dp_rank, dp);
    const int64_t k = consumed / (B_ * dp) + micro;  // the global micro-step
    const int64_t i = k % batches_per_epoch();
    const size_t first = static_cast<size_t>(i * B_);
    const size_t count = std::min(samples_.size() - first, static_cast<size_t>(B_));
    return rows_batch(samples_, first, count, B_, T_, pad_);
  }
  MicroBatch valid_batch(int64_t, int, int) override {
    DS_CHECK(false, "dschat: evaluation does not go through valid_batch");
    return {};
  }
  bool has_valid() const override { return false; }
  int64_t train_samples_per_epoch() const override { return total_; }

 private:
  std::vector<SftSample> samples_;
  int64_t B_, T_;
  int32_t pad_;
  int64_t total_;
  int rank_, world_;
};

// DeepSpeed-Chat's evaluation(): the mean of each eval batch's loss (over its
// non-pad tokens), averaged over the batches and then over the ranks.
// Batches of eval_b rows run as micro-batches of B rows; their means are
// combined by token counts.
double eval_loss(Trainer& t, const std::vector<SftSample>& samples, int64_t eval_b, int64_t B, int64_t T,
                 int32_t pad) {
  const int64_t n = static_cast<int64_t>(samples.size()), batches = ceil_div(n, eval_b);
  double sum = 0;
  for (int64_t j = 0; j < batches; ++j) {
    const int64_t first = j * eval_b, rows = std::min(eval_b, n - first);
    double weighted = 0, tokens = 0;
    for (int64_t c = 0; c < rows; c += B) {
      const int64_t count = std::min(B, rows - c);
      const int64_t counted = counted_targets(samples, static_cast<size_t>(first + c), static_cast<size_t>(count));
      const double mean = t.forward_loss(rows_batch(samples, static_cast<size_t>(first + c),
                                                    static_cast<size_t>(count), B, T, pad));
      weighted += mean * static_cast<double>(counted);
      tokens += static_cast<double>(counted);
    }
    sum += tokens > 0 ? weighted / tokens : NAN;
  }
  return t.dp_mean(sum / static_cast<double>(batches));
}

}  // namespace

int run_sft(const std::vector<std::string>& argv) {
  if (wants_help(argv)) {
    std::printf("%s", usage(step1_specs(), kProg).c_str());
    return 0;
  }
  const ParsedArgs a = parse_args(step1_specs(), argv, kProg);
  // What dschat does not implement yet, or what DeepSpeed itself refuses.
  refuse_deepspeed_config(a, kProg);
  const CommonArgs c = common_args(a, kProg);
  const int64_t B = c.B, eval_b = c.eval_b, T = c.T, epochs = c.epochs, ga = c.ga, seed = c.seed;

  const RendezvousInfo rv = RendezvousInfo::from_env();
  log_set_rank(rv.rank);
  // The model, its tokenizer and the vocabulary DeepSpeed-Chat resizes to.
  const std::optional<std::string> eot =
      a.flag("--add_eot_token") ? std::optional<std::string>(*a.str("--eot_token")) : std::nullopt;
  ChatModel cm = load_chat_model(a, kProg, eot);
  apply_lora(a, cm.model, kProg);
  const ChatTokenizer& tok = cm.tok;
  const fs::path& dir = cm.dir;

  // The examples, and this rank's share of them in sampler order.
  const PhaseExamples ex = step1_examples(a, static_cast<uint32_t>(seed));
  DS_USER_CHECK(!ex.train.empty(), "{}: phase 1 of --data_split {} leaves no training examples", kProg,
                *a.str("--data_split"));
  DS_USER_CHECK(!ex.eval.empty(), "{}: phase 1 of --data_split {} leaves no evaluation examples (DeepSpeed-Chat "
                "evaluates before training)", kProg, *a.str("--data_split"));
  const int world = rv.world_size;
  const bool mask_prompt = a.flag("--mask_prompt");
  std::vector<SftSample> train = rank_samples(ex.train, world, rv.rank, tok, T, mask_prompt);
  const std::vector<SftSample> eval = rank_samples(ex.eval, world, rv.rank, tok, T, mask_prompt);
  const int64_t per_epoch = ceil_div(static_cast<int64_t>(train.size()), B);  // micro-batches
  const int64_t steps = epochs * per_epoch / ga, sched_total = epochs * ceil_div(per_epoch, ga);
  TrainConfig cfg = chat_train_config(a, cm, c, world, steps, sched_total, "step1_model", kProg);
  EpochCheckpoint ckpt(a.str("--checkpoint_dir"), "sft", kProg);
  ckpt.configure(cfg);

  auto world_comm = make_world_communicator(Backend::Gloo, rv);
  RankGrid grid = make_rank_grid(cfg.layout, rv.rank);
  Comms comms = build_comms(*world_comm, grid);
  if (!a.str("--output_dir")) DS_LOG("no --output_dir: the fine-tuned model is not saved (as DeepSpeed-Chat)");
  const std::optional<std::string> out = a.str("--output_dir");
  if (out) check_output_dir(*out, "--output_dir");  // may hold other files (the scripts log into it)
  const int32_t pad = tok.pad_id();
  Trainer trainer(cfg, comms, rv.local_rank,
                  std::make_unique<SftBatches>(Device::cpu(), std::move(train), B, T, pad,
                                               static_cast<int64_t>(ex.train.size()), rv.rank, world));
  auto evaluate = [&](int64_t epoch) {
    say(fmt::format("***** Evaluating perplexity, Epoch {}/{} *****", epoch, epochs));
    const float loss = static_cast<float>(eval_loss(trainer, eval, eval_b, B, T, pad));
    const float ppl = std::exp(loss);
    say(fmt::format("ppl: {}, loss: {}", python_repr(ppl), python_repr(loss)));
  };
  say("***** Running training *****");
  const int64_t first_epoch = ckpt.resume(trainer);
  if (first_epoch == 0) evaluate(0);
  int64_t done = trainer.state().iteration;
  for (int64_t e = first_epoch; e < epochs; ++e) {
    say(fmt::format("Beginning of Epoch {}/{}, Total Micro Batches {}", e + 1, epochs, per_epoch));
    // The optimizer steps whose last micro-batch falls in this epoch.
    for (const int64_t end = (e + 1) * per_epoch / ga; done < end; ++done) {
      const float loss = trainer.iterate();
      if (a.flag("--print_loss"))
        say(fmt::format("Epoch: {}, Step: {}, Rank: 0, loss = {}", e, ((done + 1) * ga - 1) % per_epoch,
                        python_repr(loss)));
    }
    evaluate(e + 1);
    if (ckpt.end_of_epoch(trainer, e + 1, *world_comm)) return 0;
  }
  if (out) {
    say("saving the final model ...");
    export_into(trainer, *out, dir, rv.rank);
  }
  DS_LOG("peak resident memory of this rank: {} bytes (getrusage; start-up, training, evaluation and export)",
         peak_rss_bytes());
  world_comm->barrier();
  return 0;
}

}  // namespace ds::chat

// Batched generation (generator.h): prefill per prompt into its rows of one
// cache, then one batched decode step per token. Samples that stopped keep a
// slot in the batch (fed a dummy token at position 0 of their own rows, which
// no live sample reads) so the batch shape stays fixed. Only the first
// vocab_limit logits of a row are sampled from (ids the tokenizer has).
#include "lib/gen/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "lib/core/error.h"
#include "lib/gen/prompts.h"
#include "lib/ops/ops.h"

namespace ds::gen {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Tensor device_tokens(const std::vector<int32_t>& ids, int64_t B, int64_t T, Device dev) {
  Tensor host = Tensor::from_blob(const_cast<int32_t*>(ids.data()), {B, T}, DType::I32);
  return dev.is_cpu() ? host.clone() : host.to(dev);
}

// Row `row` of the training forward's logits (rows, Vl), gathered over tp,
// as host f32 over the real vocabulary.
std::vector<float> full_row(GptModel& model, const Tensor& logits, int64_t row) {
  const TpComm& tp = model.tp();
  const int64_t Vl = logits.size(1), V = model.dims().V;
  Tensor local = logits.view(row * Vl, {Vl});
  Tensor full = local;
  if (tp.active()) {
    full = Tensor::empty({Vl * tp.size}, local.dtype(), local.device());
    tp.comm->all_gather(local.raw(), full.raw(), Vl, local.dtype());
  }
  Tensor f32 = full;
  if (full.dtype() != DType::F32) {
    f32 = Tensor::empty(full.shape(), DType::F32, full.device());
    ops::cast({.out = f32, .inp = full});
  }
  Tensor host = f32.device().is_cpu() ? f32 : f32.to(Device::cpu());
  return std::vector<float>(host.data<float>(), host.data<float>() + V);
}

}  // namespace

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::Length: return "length";
    case StopReason::EndOfDocument: return "eod";
    case StopReason::StopString: return "stop";
    case StopReason::Context: return "context";
  }
  return "?";
}

std::vector<GenResult> generate(GptModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                const GenOptions& opt, const TokenCallback& on_token, GenStats* stats) {
  validate_sampling(opt.sampling);
  DS_USER_CHECK(opt.max_new_tokens >= 0, "--max-new-tokens {} must be >= 0", opt.max_new_tokens);
  const int64_t B = static_cast<int64_t>(prompts.size()), maxT = model.dims().maxT, V = model.dims().V;
  std::vector<GenResult> out(static_cast<size_t>(B));
  if (B == 0) return out;
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    check_prompt(prompts[b], maxT, V, opt.first_prompt + static_cast<int64_t>(b) + 1);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[b].size()));
  }
  DS_USER_CHECK(opt.vocab_limit >= 0, "generation: vocabulary limit {} must be >= 0", opt.vocab_limit);
  // The ids sampling may choose: the model's real vocabulary, cut to the tokenizer's.
  const size_t Vs = static_cast<size_t>(opt.vocab_limit > 0 ? std::min(V, opt.vocab_limit) : V);
  const int64_t Tmax = std::min<int64_t>(maxT, longest + opt.max_new_tokens);
  GenStats st;
  std::vector<std::vector<int32_t>> seq = prompts;  // prompt + generated: penalty history and recompute input
  std::vector<char> done(static_cast<size_t>(B), opt.max_new_tokens == 0);
  std::vector<std::vector<float>> logits(static_cast<size_t>(B));
  const Device dev = model.device();
  KvCache cache;
  auto t0 = Clock::now();
  if (opt.use_kv_cache) cache = model.make_kv_cache(B, std::max<int64_t>(Tmax, 1));
  // Prefill: the whole prompt of each sample, into its own cache rows.
  for (int64_t b = 0; b < B && opt.max_new_tokens > 0; ++b) {
    const int64_t n = static_cast<int64_t>(prompts[b].size());
    Tensor tok = device_tokens(prompts[b], 1, n, dev);
    if (opt.use_kv_cache) {
      KvCache rows = kv_cache_rows(cache, b, 1);
      Tensor l = model.decode_forward(tok, {0}, rows);
      logits[b].assign(l.data<float>(), l.data<float>() + V);
    } else {
      logits[b] = full_row(model, model.forward_logits(tok), n - 1);
    }
    st.prefill_tokens += n;
  }
  st.prefill_s = since(t0);
  t0 = Clock::now();
  for (int step = 0;; ++step) {
    std::vector<int32_t> next(static_cast<size_t>(B), 0);
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      const float* l = logits[b].data();
      DS_USER_CHECK(std::all_of(l, l + Vs, [](float x) { return std::isfinite(x); }), "prompt {}, generated token "
                    "{}: the model's logits are not finite (NaN or inf); its weights may hold NaN/inf, or fp16 "
                    "overflowed (try --bf16 or f32)", opt.first_prompt + b + 1, step + 1);
      const int32_t t = sample_next(std::span<float>(logits[b].data(), Vs), seq[b], opt.sampling,
                                    static_cast<uint64_t>(opt.first_prompt + b), static_cast<uint64_t>(step));
      if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), t) != opt.stop_ids.end()) {
        done[b] = 1;
        out[b].reason = StopReason::EndOfDocument;
        continue;
      }
      seq[b].push_back(t);
      out[b].tokens.push_back(t);
      next[b] = t;
      if (on_token && on_token(b, t)) {
        done[b] = 1;
        out[b].reason = StopReason::StopString;
      } else if (static_cast<int>(out[b].tokens.size()) >= opt.max_new_tokens) {
        done[b] = 1;
        out[b].reason = StopReason::Length;
      } else if (static_cast<int64_t>(seq[b].size()) >= maxT) {
        done[b] = 1;
        out[b].reason = StopReason::Context;
      }
    }
    const bool local_done = std::all_of(done.begin(), done.end(), [](char d) { return d != 0; });
    if (opt.synced ? opt.synced(local_done) : local_done) break;
    if (opt.use_kv_cache) {
      std::vector<int32_t> pos(static_cast<size_t>(B), 0);
      for (int64_t b = 0; b < B; ++b) pos[b] = done[b] ? 0 : static_cast<int32_t>(seq[b].size() - 1);
      Tensor l = model.decode_forward(device_tokens(next, B, 1, dev), pos, cache);
      for (int64_t b = 0; b < B; ++b)
        if (!done[b]) logits[b].assign(l.data<float>() + b * V, l.data<float>() + (b + 1) * V);
    } else {
      for (int64_t b = 0; b < B; ++b) {
        if (done[b]) continue;
        const int64_t n = static_cast<int64_t>(seq[b].size());
        logits[b] = full_row(model, model.forward_logits(device_tokens(seq[b], 1, n, dev)), n - 1);
      }
    }
    for (int64_t b = 0; b < B; ++b) st.decode_tokens += done[b] ? 0 : 1;
  }
  st.decode_s = since(t0);
  if (stats) *stats = st;
  return out;
}

}  // namespace ds::gen

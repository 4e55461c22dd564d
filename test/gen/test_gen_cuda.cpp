// Generation on the CUDA backend against the CPU backend: KV-cache logits of
// a prefill and of decode steps (f32 within 1e-4 relative; bf16 within 5e-2
// of the f32 CPU logits), and identical greedy tokens in f32 for a batch of
// prompts of different lengths. Skipped (exit 77) without a device.
#include <catch2/catch.hpp>
#include <cmath>

#include "cuda/cuda_api.h"
#include "lib/gen/generator.h"
#include "test/gen/gen_fixture.h"
#include "test/skip.h"

using namespace ds;

namespace {

double max_rel(const Tensor& a, const Tensor& b) {
  double err = 0, mx = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
    mx = std::max(mx, static_cast<double>(std::fabs(b.data<float>()[i])));
  }
  return err / mx;
}

}  // namespace

TEST_CASE("cuda generation matches the cpu backend", "[gen][gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  cuda::init_device(0);
  for (const std::string kind : {"gpt2", "llama"}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      INFO(kind << " " << dtype_name(dt));
      auto cpu = test::gen_model(kind), gpu = test::gen_model(kind, Device::cuda(0), dt);
      const auto prompts = test::gen_prompts();
      KvCache cc = cpu->make_kv_cache(2, 32), gc = gpu->make_kv_cache(2, 32);
      std::vector<int32_t> ids(prompts[1].begin(), prompts[1].begin() + 7);
      ids.insert(ids.end(), prompts[3].begin(), prompts[3].end());  // two samples of 7
      Tensor tok = Tensor::from_blob(ids.data(), {2, 7}, DType::I32).clone();
      const double tol = dt == DType::F32 ? 1e-4 : 5e-2;
      CHECK(max_rel(gpu->decode_forward(tok.to(Device::cuda(0)), {0, 0}, gc), cpu->decode_forward(tok, {0, 0}, cc)) <
            tol);
      std::vector<int32_t> next{5, 9};
      Tensor one = Tensor::from_blob(next.data(), {2, 1}, DType::I32).clone();
      CHECK(max_rel(gpu->decode_forward(one.to(Device::cuda(0)), {7, 3}, gc), cpu->decode_forward(one, {7, 3}, cc)) <
            tol);
      if (dt != DType::F32) continue;
      gen::GenOptions opt;
      opt.max_new_tokens = 24;
      auto a = gen::generate(*cpu, prompts, opt), b = gen::generate(*gpu, prompts, opt);
      for (size_t i = 0; i < prompts.size(); ++i) CHECK(a[i].tokens == b[i].tokens);
    }
  }
}

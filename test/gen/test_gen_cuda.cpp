// Generation on the CUDA backend against the CPU backend: KV-cache logits of
// a prefill and of decode steps (f32 within 1e-4 relative; bf16 within 5e-2
// of the f32 CPU logits), and identical greedy tokens in f32 for a batch of
// prompts of different lengths. Skipped (exit 77) without a device.
#include <catch2/catch.hpp>
#include <cmath>

#include "cuda/cuda_api.h"
#include "lib/gen/generator.h"
#include "lib/ops/ops.h"
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

// Long caches: the kernel's scores of one query row live in shared memory
// beside its static arrays. Caches just under 12288 positions (where the
// static memory used to push a launch past the 48 KiB default) and above it
// (the device's opt-in limit) match the CPU op; one too long for any block
// is one clean line.
TEST_CASE("cuda kv_attention holds long caches up to the opt-in limit", "[gen][gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  cuda::init_device(0);
  const int NH = 2, HS = 16;
  for (const int64_t Tmax : {int64_t(12286), int64_t(20000)}) {
    INFO("cache of " << Tmax);
    Tensor qkv = Tensor::empty({1, 1, 3 * NH * HS}, DType::F32);
    Tensor kc = Tensor::empty({1, Tmax, NH * HS}, DType::F32), vc = Tensor::empty({1, Tmax, NH * HS}, DType::F32);
    uint32_t x = 12345;
    auto fill = [&](Tensor& t) {
      for (int64_t i = 0; i < t.numel(); ++i) {
        x = x * 1664525u + 1013904223u;
        t.data<float>()[i] = static_cast<float>(x >> 8) / 16777216.f - 0.5f;
      }
    };
    fill(qkv);
    fill(kc);
    fill(vc);
    int32_t p = static_cast<int32_t>(Tmax - 1);
    Tensor pos = Tensor::from_blob(&p, {1}, DType::I32).clone();
    Tensor want = Tensor::zeros({1, 1, NH * HS}, DType::F32);
    ops::kv_attention({.out = want, .k_cache = kc.clone(), .v_cache = vc.clone(), .qkv = qkv, .pos = pos, .NH = NH});
    const Device d = Device::cuda(0);
    Tensor got = Tensor::zeros({1, 1, NH * HS}, DType::F32, d);
    ops::kv_attention(
        {.out = got, .k_cache = kc.to(d), .v_cache = vc.to(d), .qkv = qkv.to(d), .pos = pos.to(d), .NH = NH});
    CHECK(max_rel(got.to(Device::cpu()), want) < 1e-4);
  }
  const int64_t too_long = 1 << 20;  // 4 MiB of scores
  Tensor qkv = Tensor::zeros({1, 1, 3 * NH * HS}, DType::F32, Device::cuda(0));
  Tensor kc = Tensor::zeros({1, too_long, NH * HS}, DType::F32, Device::cuda(0));
  int32_t p = 0;
  REQUIRE_THROWS_WITH(ops::kv_attention({.out = Tensor::zeros({1, 1, NH * HS}, DType::F32, Device::cuda(0)),
                                          .k_cache = kc,
                                          .v_cache = kc.clone(),
                                          .qkv = qkv,
                                          .pos = Tensor::from_blob(&p, {1}, DType::I32).to(Device::cuda(0)),
                                          .NH = NH}),
                      Catch::Contains("is too long"));
}

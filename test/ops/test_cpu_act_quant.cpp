// act_quantize (DeepSpeed Compression's activation quantization) on the CPU,
// bit for bit against test/ops/act_quant_ref.py: upstream's QuantAct and
// Sym/AsymQuantizer forward run by PyTorch (f32, bf16; f16 in numpy with
// f16 rounding per step). Static calibration over three calls (the running
// range too), dynamic per row; 4 and 8 bits; a row width that is no multiple
// of a vector. Skips when /usr/bin/python3 has no torch or numpy.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "lib/core/dtype.h"
#include "lib/ops/ops.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using namespace ds;

namespace {

std::string hex(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  char b[9];
  std::snprintf(b, sizeof b, "%08x", u);
  return b;
}

std::string hexs(const std::vector<float>& v) {
  std::string s;
  for (float x : v) s += (s.empty() ? "" : " ") + hex(x);
  return s;
}

float representable(float v, DType dt) {
  if (dt == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  if (dt == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

std::vector<float> as_f32(const Tensor& t) {
  Tensor f = Tensor::empty(t.shape(), DType::F32);
  ops::cast({.out = f, .inp = t}, Stream{});
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

}  // namespace

TEST_CASE("act_quantize equals DeepSpeed's quantizers run by PyTorch, bit for bit") {
  const int64_t N = 6, C = 37;
  const int calls = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::string cases_text;
  std::vector<std::string> ours;
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const char* mode : {"static_asym", "static_sym", "dynamic_sym", "dynamic_asym"})
      for (int bits : {4, 8}) {
        const bool stat = std::string(mode).starts_with("static"), sym = std::string(mode).ends_with("_sym");
        if (stat && sym && dt != DType::F32) continue;  // upstream returns f32 there (dstrain refuses it)
        Tensor range = stat ? Tensor::zeros({2}, DType::F32) : Tensor();
        const int n_calls = stat ? calls : 1;  // dynamic: one call says it all
        std::string line = std::string(dtype_name(dt)) + " " + mode + " " + std::to_string(bits) + " " +
                           std::to_string(n_calls) + " " + std::to_string(N) + " " + std::to_string(C);
        std::string result;
        for (int k = 0; k < n_calls; ++k) {
          std::vector<float> x(N * C);
          const float shift = 0.3f * static_cast<float>(k), spread = 1.f + static_cast<float>(k);
          for (float& v : x) v = representable(nd(rng) * spread + shift, dt);
          for (float v : x) line += " " + hex(v);
          Tensor t = Tensor::empty({N, C}, dt);
          Tensor src = Tensor::from_blob(x.data(), {N, C}, DType::F32);
          ops::cast({.out = t, .inp = src}, Stream{});
          ops::act_quantize({.x = t, .range = range, .bits = bits, .symmetric = sym, .update = true}, Stream{});
          result += (k ? " | " : "") + hexs(as_f32(t));
          if (stat) result += " range " + hexs(as_f32(range));
        }
        cases_text += line + "\n";
        ours.push_back(result);
      }
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/ds_act_quant_cases." + std::to_string(::getpid());
  std::ofstream(path) << cases_text;
  const char* src = std::getenv("DS_SOURCE_DIR");
  std::vector<std::string> ref;
  const int rc = test::popen_lines("/usr/bin/python3 " + std::string(src ? src : ".") + "/test/ops/act_quant_ref.py " +
                                       path + " 2>&1",
                                   ref);
  std::remove(path.c_str());
  if (rc == 77) DS_SKIP(ref.empty() ? std::string("torch or numpy not importable") : ref[0]);
  REQUIRE(rc == 0);
  REQUIRE(ref.size() == ours.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    INFO("case " << i);
    CHECK(ours[i] == ref[i]);
  }
}

// Random-LTD probe: builds a small random GPT-2 model, exports it in Hugging
// Face format to DIR, runs one training forward and backward with two of its
// four layers dropping tokens, and writes DIR/ltd.json (the tokens, targets,
// dropping layers, kept positions, the loss and each parameter's gradient
// norm) for ltd_check.py to recompute with transformers and PyTorch's
// autograd as upstream's GatherTokens / ScatterTokens do.
//   ltd_probe DIR
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "lib/ckpt/hf.h"
#include "lib/core/rng.h"
#include "lib/model/gpt.h"
#include "test/interop/probe_util.h"

using namespace ds;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ltd_probe DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  ModelConfig m;
  m.num_layers = 4;
  m.hidden_size = 64;
  m.num_heads = 4;
  m.seq_length = 32;
  m.max_position_embeddings = 64;
  m.vocab_size = 300;
  m.padded_vocab_size = 384;
  m.hidden_dropout = m.attention_dropout = 0.f;
  GptModel model(m, Device::cpu());
  model.init_weights(23, 0.15f);
  test::vary_norms_and_biases(model);
  export_hf(m, model.layout(), model.params(), dir);
  const int64_t B = 3, T = m.seq_length, R = 12;
  const std::vector<int> layers = {1, 2};
  model.set_random_ltd({.layers = layers, .reserved = R});
  Tensor tok = Tensor::empty({B, T}, DType::I32), tgt = Tensor::empty({B, T}, DType::I32);
  Rng rng(5);
  for (int64_t i = 0; i < B * T; ++i) tok.data<int32_t>()[i] = static_cast<int32_t>(rng.below(m.vocab_size));
  for (int64_t i = 0; i < B * T; ++i) tgt.data<int32_t>()[i] = i % 7 == 3 ? -1 : static_cast<int32_t>(rng.below(m.vocab_size));
  model.grads().zero_();
  const DropoutKey key{.train = true, .seed = 9, .iteration = 4, .first_sample = 6, .step = {}};
  const float loss = model.forward_backward(tok, tgt, 1.0f / static_cast<float>(B * T - (B * T + 3) / 7), key);
  const Tensor& ix = model.random_ltd_index();
  nlohmann::json out;
  auto ints = [](const Tensor& t) {
    return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  };
  out["B"] = B, out["T"] = T, out["R"] = R, out["layers"] = layers;
  out["tokens"] = ints(tok), out["targets"] = ints(tgt), out["index"] = ints(ix);
  out["loss"] = loss;
  for (const ParamSpec& p : model.layout().params) {
    const float* g = model.grads().data<float>() + p.offset;
    double s = 0;
    for (int64_t i = 0; i < p.numel; ++i) s += static_cast<double>(g[i]) * g[i];
    out["grad_norms"][p.name] = std::sqrt(s);
  }
  std::ofstream(dir + "/ltd.json") << out.dump();
  return 0;
}

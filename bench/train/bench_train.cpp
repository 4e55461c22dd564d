// CPU training-step benchmark: forward + backward + AdamW of a GPT model on
// random tokens, through the same model and optimizer code dstrain uses.
// Prints one JSON line with ms/step and tokens/s (median of the timed steps).
//   bench_train --layers 12 --hidden 768 --heads 12 --vocab 50304 --seq 128 --batch 4 --steps 5
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "lib/core/rng.h"
#include "lib/model/gpt.h"
#include "lib/optim/adamw.h"

using namespace ds;

int main(int argc, char** argv) {
  CLI::App app{"dstrain CPU training-step benchmark"};
  int L = 2, C = 128, NH = 4, V = 512, T = 64, B = 4, steps = 5, warmup = 1;
  std::string family = "gpt2";
  app.add_option("--layers", L);
  app.add_option("--hidden", C);
  app.add_option("--heads", NH);
  app.add_option("--vocab", V);
  app.add_option("--seq", T);
  app.add_option("--batch", B);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--family", family)->check(CLI::IsMember({"gpt2", "llama"}));
  CLI11_PARSE(app, argc, argv);

  ModelConfig m;
  m.num_layers = L;
  m.hidden_size = C;
  m.num_heads = NH;
  m.seq_length = T;
  m.max_position_embeddings = std::max(T, 1024);
  m.vocab_size = V;
  m.padded_vocab_size = V;
  if (family == "llama") {
    set_model_family(m, ModelFamily::LLaMA);
  }
  GptModel model(m, Device::cpu());
  model.init_weights(1, 0.02f);
  AdamW opt(model.layout(), Device::cpu(), 0, model.layout().total);
  Tensor tok = Tensor::empty({B, T}, DType::I32), tgt = Tensor::empty({B, T}, DType::I32);
  Rng r(1);
  for (int64_t i = 0; i < tok.numel(); ++i) {
    tok.data<int32_t>()[i] = static_cast<int32_t>(r.below(V));
    tgt.data<int32_t>()[i] = static_cast<int32_t>(r.below(V));
  }
  AdamWHyper h;
  h.lr = 1e-4f;
  h.weight_decay = 0.1f;
  std::vector<double> ms;
  for (int s = 0; s < warmup + steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    model.grads().zero_();
    model.forward_backward(tok, tgt, 1.0f / (B * T));  // no DropoutKey: dropout-free, as torch_ref.py
    opt.step(model.params(), model.grads(), h, 1.0f);
    double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) ms.push_back(dt);
  }
  std::sort(ms.begin(), ms.end());
  double med = ms[ms.size() / 2];
  std::printf("{\"impl\": \"dstrain\", \"family\": \"%s\", \"params\": %lld, \"B\": %d, \"T\": %d, "
              "\"ms_per_step\": %.2f, \"tokens_per_s\": %.1f}\n",
              family.c_str(), static_cast<long long>(model.layout().total), B, T, med, B * T / (med / 1000.0));
  return 0;
}

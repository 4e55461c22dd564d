// The steady-state training step on the GPU synchronises the host once: the
// packed read of the step's losses, gradient norm and fp16 overflow flag
// (docs/distributed.md, host synchronisations per step). A single-process
// dstrain step with --profile in bf16 and fp16 must report exactly that one;
// an fp32 run on the GPU must follow the CPU's loss curve (each micro-batch's
// mean loss is taken on the device by ops::masked_mean and reaches the host
// through the packed read), also without dropout, where each layer's closing
// residual add is fused with the next norm1 (GPT-2 and LLaMA blocks), and a
// full recomputation (which re-runs those norms unfused) must repeat that
// run's losses bit for bit. The bf16/fp16 steps must run the MLP's GELU in
// the cuBLASLt epilogues (fp32 runs the separate kernels). A GPU run with
// the optimizer offloaded to the host saves (its checkpoint check reads
// Adam's moments in host memory) and resumes bit for bit; with the state on
// NVMe (ZeRO-3, sub-groups through pinned buffers) it trains the bits of the
// cpu offload and resumes bit for bit too, and so does offload_param (cpu,
// nvme). 1-bit Adam and 0/1 Adam (one rank: no compression, but the
// initialising step and every phase) follow the CPU's curve. Skipped (exit 77)
// without a device.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>

#include "cuda/blas/lt_gemm.h"
#include "cuda/cuda_api.h"
#include "lib/io/aio.h"
#include "test/skip.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;

namespace {

// The fewest host synchronisations a GPU step can have: the loss scaler's
// skip decision and the clip coefficient are taken on the host.
constexpr int64_t kStepSyncs = 1;

}  // namespace

TEST_CASE("a GPU training step synchronises the host once", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  const std::string dir = (fixture().dir / "profile").string();
  fs::create_directories(dir);
  cuda::set_gemm_epilogues(cuda::GemmEpilogues::Fused);  // whatever DS_GEMM_EPILOGUES says
  for (const char* precision : {"--bf16", "--fp16"}) {
    INFO(precision);
    Trainer t(make_config({"--device", "cuda", precision, "--train-iters", "4", "--profile", "--profile-dir", dir}),
              single_process());
    const cuda::EpiloguePathCounts before = cuda::epilogue_path_counts();
    const std::vector<float> losses = t.run();
    const cuda::EpiloguePathCounts after = cuda::epilogue_path_counts();
    REQUIRE(losses.size() == 4);
    for (float l : losses) CHECK(std::isfinite(l));
    // The GPT-2 MLP ran its GELU in the cuBLASLt epilogues, every call.
    CHECK(after.fused_fwd > before.fused_fwd);
    CHECK(after.fused_bwd > before.fused_bwd);
    CHECK(after.unfused_fwd == before.unfused_fwd);
    CHECK(after.unfused_bwd == before.unfused_bwd);
    CHECK(t.profiled_host_syncs() == kStepSyncs);
  }
}

TEST_CASE("the GPU loss curve in fp32 follows the CPU's", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  const std::vector<float> cpu = train({"--train-iters", "6"});
  const std::vector<float> gpu = train({"--device", "cuda", "--train-iters", "6"});
  REQUIRE(cpu.size() == 6);
  REQUIRE(gpu.size() == 6);
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO("iteration " << i + 1 << ": cpu " << cpu[i] << ", cuda " << gpu[i]);
    CHECK(std::fabs(gpu[i] - cpu[i]) <= 1e-3 * std::fabs(cpu[i]));
  }
}

TEST_CASE("OneBitAdam, ZeroOneAdam and OneBitLamb on the GPU follow the CPU's curve through their phases", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  for (const char* opt : {R"("OneBitAdam", "params": {"lr": 0.001, "freeze_step": 3})",
                          R"("ZeroOneAdam", "params": {"lr": 0.001, "var_freeze_step": 3, "local_step_clipper": 2})",
                          R"("OneBitLamb", "params": {"lr": 0.001, "freeze_step": 3, "weight_decay": 0.01})"}) {
    INFO(opt);
    const fs::path cfg = fixture().dir / "onebit_gpu.json";
    std::ofstream(cfg) << R"({"optimizer": {"type": )" << opt << R"(}, "zero_optimization": {"stage": 0}})";
    const std::vector<float> cpu = train({"--config", cfg.string(), "--train-iters", "7"});
    const std::vector<float> gpu = train({"--device", "cuda", "--config", cfg.string(), "--train-iters", "7"});
    REQUIRE(cpu.size() == 7);
    REQUIRE(gpu.size() == 7);
    for (size_t i = 0; i < cpu.size(); ++i) {
      INFO("iteration " << i + 1 << ": cpu " << cpu[i] << ", cuda " << gpu[i]);
      CHECK(std::fabs(gpu[i] - cpu[i]) <= 1e-3 * std::fabs(cpu[i]));
    }
    CHECK(cpu.back() != cpu[1]);  // the weights moved after the initialising step
  }
}

TEST_CASE("without dropout (norm1 fused across layers) the GPU follows the CPU; full recompute repeats it", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  for (bool llama : {false, true}) {
    INFO((llama ? "llama blocks" : "gpt-2 blocks"));
    std::vector<std::string> flags = {"--train-iters", "5", "--hidden-dropout", "0", "--attention-dropout", "0"};
    if (llama)
      for (const std::string& f : llama_flags()) flags.push_back(f);
    auto with = [&](std::vector<std::string> extra) {
      std::vector<std::string> f = flags;
      f.insert(f.end(), extra.begin(), extra.end());
      return train(f);
    };
    const std::vector<float> cpu = with({}), gpu = with({"--device", "cuda"});
    const std::vector<float> gpu_rc = with({"--device", "cuda", "--recompute-granularity", "full"});
    REQUIRE(cpu.size() == 5);
    REQUIRE(gpu.size() == 5);
    REQUIRE(gpu_rc.size() == 5);
    for (size_t i = 0; i < cpu.size(); ++i) {
      INFO("iteration " << i + 1 << ": cpu " << cpu[i] << ", cuda " << gpu[i] << ", cuda recompute " << gpu_rc[i]);
      CHECK(std::fabs(gpu[i] - cpu[i]) <= 1e-3 * std::fabs(cpu[i]));
    }
    CHECK(std::memcmp(gpu.data(), gpu_rc.data(), gpu.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("offload_optimizer on a GPU run: N steps + save + resume + N steps equal 2N steps", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  const fs::path cfg = fixture().dir / "offload_gpu.json";
  std::ofstream(cfg) << R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})";
  const fs::path ck = fixture().dir / "offload_gpu_ckpt";
  fs::remove_all(ck);
  const std::vector<std::string> base = {"--device", "cuda", "--bf16", "--config", cfg.string(), "--train-iters", "6"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> f = base;
    f.insert(f.end(), extra.begin(), extra.end());
    return train(f);
  };
  const std::vector<float> full = with({});
  const std::vector<float> first = with({"--exit-interval", "3", "--save", ck.string(), "--save-interval", "3"});
  const std::vector<float> second = with({"--load", ck.string()});
  REQUIRE(full.size() == 6);
  REQUIRE(first.size() == 3);
  REQUIRE(second.size() == 3);
  std::vector<float> joined = first;
  joined.insert(joined.end(), second.begin(), second.end());
  for (float l : full) CHECK(std::isfinite(l));
  CHECK(std::memcmp(joined.data(), full.data(), full.size() * sizeof(float)) == 0);
}

TEST_CASE("offload_optimizer nvme and offload_param on a GPU run: the cpu offload's bits, resume bit for bit",
          "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  if (const std::string why = aio_unavailable_reason(); !why.empty()) DS_SKIP(why);
  const fs::path swap = fixture().dir / "nvme_gpu_swap";
  fs::create_directories(swap);
  const fs::path nvme = fixture().dir / "nvme_gpu.json", cpu = fixture().dir / "nvme_gpu_cpu.json";
  std::ofstream(nvme) << R"({"zero_optimization": {"stage": 3, "sub_group_size": 5000, "offload_optimizer": )"
                      << R"({"device": "nvme", "nvme_path": ")" << swap.string()
                      << R"(", "pin_memory": true, "pipeline_read": true, "pipeline_write": true, "buffer_count": 4}}})";
  std::ofstream(cpu) << R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})";
  const fs::path ck = fixture().dir / "nvme_gpu_ckpt";
  fs::remove_all(ck);
  auto run = [&](const fs::path& cfg, std::vector<std::string> extra) {
    std::vector<std::string> f = {"--device", "cuda", "--bf16", "--config", cfg.string(), "--train-iters", "6"};
    f.insert(f.end(), extra.begin(), extra.end());
    return train(f);
  };
  const std::vector<float> full = run(nvme, {});
  const std::vector<float> host = run(cpu, {});
  const std::vector<float> first = run(nvme, {"--exit-interval", "3", "--save", ck.string(), "--save-interval", "3"});
  const std::vector<float> second = run(nvme, {"--load", ck.string()});
  REQUIRE(full.size() == 6);
  REQUIRE(host.size() == 6);
  REQUIRE(first.size() == 3);
  REQUIRE(second.size() == 3);
  for (float l : full) CHECK(std::isfinite(l));
  CHECK(std::memcmp(full.data(), host.data(), full.size() * sizeof(float)) == 0);
  std::vector<float> joined = first;
  joined.insert(joined.end(), second.begin(), second.end());
  CHECK(std::memcmp(joined.data(), full.data(), full.size() * sizeof(float)) == 0);
  // offload_param: the parameter shard in host memory (with either optimizer
  // tier) or in the swap file; the gathers copy it up, the same bits.
  const std::string nvme_opt = R"("offload_optimizer": {"device": "nvme", "nvme_path": ")" + swap.string() +
                               R"(", "pin_memory": true, "pipeline_read": true, "pipeline_write": true, "buffer_count": 6})";
  for (const std::string& offload :
       {std::string(R"("offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})"),
        nvme_opt + R"(, "offload_param": {"device": "cpu"})", nvme_opt + R"(, "offload_param": {"device": "nvme"})"}) {
    INFO(offload);
    const fs::path pc = fixture().dir / "offload_param_gpu.json";
    std::ofstream(pc) << R"({"zero_optimization": {"stage": 3, "sub_group_size": 5000, )" << offload << "}}";
    const std::vector<float> p = run(pc, {});
    REQUIRE(p.size() == 6);
    CHECK(std::memcmp(p.data(), host.data(), p.size() * sizeof(float)) == 0);
  }
  CHECK(fs::is_empty(swap));  // the swap files are unlinked
}

// --estimate-memory: the numbers behind the report for the GPT-2 124M preset
// and the report text itself (lib/train/memory_estimate.h).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/runtime/zero_optimizer.h"
#include "lib/train/memory_estimate.h"

using namespace ds;
using Catch::Matchers::Contains;

namespace {

TrainConfig parse(std::vector<std::string> args, int world = 1) {
  args.insert(args.begin(), "dstrain");
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  return parse_train_config(static_cast<int>(args.size()), argv.data(), world);
}

std::string source_dir() {
  const char* s = std::getenv("DS_SOURCE_DIR");
  return s ? s : ".";
}

TrainConfig gpt2_124m() { return parse({"--config", source_dir() + "/configs/gpt2-124m.json"}); }

const MemoryEstimateRow& row(const MemoryEstimate& e, int stage, bool offload) {
  for (const auto& r : e.rows)
    if (r.stage == stage && r.offload_optimizer == offload) return r;
  FAIL("no row");
  return e.rows.front();
}

constexpr int64_t kN = 124475904;  // GPT-2 124M with the vocab padded to 50304

}  // namespace

TEST_CASE("memory estimate: GPT-2 124M on one node of 8 GPUs", "[zero][estimate]") {
  TrainConfig cfg = gpt2_124m();
  REQUIRE(cfg.model.vocab_size == 0);  // resolved from the vocab file at run time
  REQUIRE(cfg.precision.precision == Precision::BF16);
  REQUIRE(cfg.batch.micro_batch_size == 8);
  cfg.device = DeviceType::CUDA;
  MemoryEstimate e = estimate_memory(cfg, 1, 8);
  CHECK(e.vocab_assumed);
  CHECK(e.n_params == kN);
  CHECK(e.n_params_rank == kN);
  CHECK(e.dp == 8);
  CHECK_FALSE(e.approximate);
  CHECK(e.precision == StatePrecision::Mixed);
  REQUIRE(e.rows.size() == 9);
  CHECK(e.rows.back().supported);  // nvme at stage 3 (f32 gradient accumulation: the host optimizer reads them)

  // kN is a multiple of 8 * 64: shard = kN / 8 exactly.
  const int64_t shard = kN / 8;
  // Mixed precision as we hold it (docs/zero.md): bf16 copy + fp32 master (the rank's range from stage 1
  // on), fp32 grads by default.
  CHECK(row(e, 0, false).states.total() == 18 * kN);
  CHECK(row(e, 1, false).states.total() == 6 * kN + 12 * shard);
  CHECK(row(e, 2, false).states.total() == 2 * kN + 16 * shard);  // f32 master sharded
  CHECK(row(e, 3, false).states.total() == 16 * shard);
  CHECK(row(e, 2, true).states.total() == 2 * kN + 8 * shard);
  CHECK_FALSE(row(e, 0, true).supported);
  CHECK(row(e, 1, false).configured);  // the preset asks for stage 1, no offload
  int configured = 0;
  for (const auto& r : e.rows) configured += r.configured;
  CHECK(configured == 1);

  // Activations (B=8, T=1024, bf16): per layer per token 2*(3C+C+F+F) + 2*4C + 4*(NH+4) bytes;
  // head: 2*2C + 4*2 (final norm), 2*Vp + 4 (logits, loss); backward: 2*(2C + 3C+C+F+F).
  const int64_t N = 8 * 1024;
  const int64_t saved = 12 * N * (2 * 9216 + 2 * 3072 + 4 * 16) + N * (2 * 1536 + 8) + N * (2 * 50304 + 4);
  CHECK(e.activations.saved == saved);
  CHECK(e.activations.workspace == N * 2 * (1536 + 9216));
  // The CPU backend's emulation copies (f32) of the largest emulated op: the
  // attention backward's qkv, dqkv, out and dout in bf16, the logits in fp16.
  TrainConfig on_cpu = cfg;
  on_cpu.device = DeviceType::CPU;
  const MemoryEstimate ec = estimate_memory(on_cpu, 1, 8);
  CHECK(ec.activations.saved == saved);
  CHECK(ec.activations.workspace == e.activations.workspace + N * 4 * (2 * 2304 + 2 * 768));
  on_cpu.precision.precision = Precision::FP16;
  CHECK(estimate_memory(on_cpu, 1, 8).activations.workspace == e.activations.workspace + N * 4 * 50304);
  CHECK(e.activations.total() > 3LL << 30);  // ~3.2 GiB: logits dominate at this size
  CHECK(e.activations.total() < 4LL << 30);

  // Device totals shrink with each stage; offload moves the optimizer to the host.
  for (int s = 1; s <= 2; ++s) CHECK(row(e, s, false).device_total < row(e, s - 1, false).device_total);
  CHECK(row(e, 3, false).zero3_live > 0);
  CHECK(row(e, 2, false).zero3_live == 0);
  CHECK(row(e, 2, false).host_per_rank == 4 * kInitChunk);  // the start-up staging chunk only
  // Adam m, v (8 per element) + the host master copy (4) + the gradient
  // buckets: the 15.6M-element shard fits one bucket of the 16M cap (4).
  REQUIRE(shard < ZeroOptimizer::kOffloadBucketMax);
  CHECK(row(e, 2, true).host_per_rank == 4 * kInitChunk + 16 * shard);
  CHECK(row(e, 2, true).host_per_node == 8 * row(e, 2, true).host_per_rank);
  CHECK(row(e, 1, true).device_total < row(e, 1, false).device_total);

  // ZeRO-3 plan over 14 units (embeddings, 12 layers, final norm): the final
  // norm (1536 < 100000) stays resident. 50M prefetch bucket over 7.09M layers:
  // 7 queued layers hold 49.6M < 50M, so an 8th is still fetched (the last may overshoot).
  REQUIRE(e.zero3.persistent.size() == 14);
  CHECK(e.zero3.persistent.back());
  CHECK_FALSE(e.zero3.persistent.front());
  CHECK(e.zero3.prefetch_depth == 8);  // 39.4M embedding + 8 layers = 96M, far under 1e9 live
  CHECK(e.zero3.peak_live == 39419904 + 8 * 7087872 + 1536);
}

TEST_CASE("memory estimate: gradients accumulated in the compute dtype", "[zero][estimate]") {
  TrainConfig cfg = gpt2_124m();
  cfg.device = DeviceType::CUDA;
  cfg.precision.grad_accum = DType::BF16;  // data_types.grad_accum_dtype "bf16"
  MemoryEstimate e = estimate_memory(cfg, 1, 8);
  CHECK(e.precision == StatePrecision::MixedLowp);
  const int64_t shard = kN / 8;
  CHECK(row(e, 0, false).states.total() == 16 * kN);
  CHECK(row(e, 1, false).states.total() == 4 * kN + 12 * shard);  // DeepSpeed's 4 + 12/DP
  CHECK(row(e, 2, false).states.total() == 2 * kN + 14 * shard);  // DeepSpeed's 2 + 14/DP
  CHECK(row(e, 3, false).states.total() == 14 * shard);
  CHECK(row(e, 2, false).states.grads == 2 * shard);
  CHECK_THAT(estimate_memory_report(cfg, 1, 8), Contains("grads 2 (accumulated in the compute dtype)"));
  CHECK_FALSE(row(e, 2, true).supported);  // the host AdamW of a GPU run reads f32 gradients
  CHECK_THAT(estimate_memory_report(cfg, 1, 8),
             Contains("offload_optimizer on a GPU needs fp32 gradient accumulation"));
  // On the CPU backend the step reads the compute-dtype shard where it is
  // (cpu: in memory; nvme: the tier's sub-groups).
  cfg.device = DeviceType::CPU;
  e = estimate_memory(cfg, 1, 8);
  CHECK(row(e, 2, true).supported);
  CHECK(row(e, 2, true).states.grads == 2 * shard);
}

TEST_CASE("memory estimate: report text", "[zero][estimate]") {
  TrainConfig cfg = gpt2_124m();
  const std::string rep = estimate_memory_report(cfg, 2, 4);
  CAPTURE(rep);
  for (int s = 0; s <= 3; ++s) CHECK_THAT(rep, Contains("ZeRO " + std::to_string(s)));
  CHECK_THAT(rep, Contains("124.48M parameters (124475904)"));
  CHECK_THAT(rep, Contains("assumed GPT-2's 50257"));
  CHECK_THAT(rep, Contains("2 node(s) x 4 GPU(s) = 8; TP=1 PP=1 DP=8"));
  CHECK_THAT(rep, Contains("not supported: offload_optimizer needs ZeRO stage >= 1"));
  CHECK_THAT(rep, Contains("* ZeRO 1"));
  CHECK_THAT(rep, Contains("bf16"));
  CHECK_THAT(rep, Contains("per-node host"));
  CHECK_THAT(rep, Contains("CPU backend"));  // the preset leaves device at cpu
}

TEST_CASE("memory estimate: parallel shapes, recompute, errors", "[zero][estimate]") {
  TrainConfig cfg = gpt2_124m();
  cfg.device = DeviceType::CUDA;
  cfg.model.vocab_size = 50257;
  cfg.model.padded_vocab_size = 50304;
  MemoryEstimate base = estimate_memory(cfg, 1, 8);
  CHECK_FALSE(base.vocab_assumed);
  CHECK(base.n_params == kN);
  CHECK_THAT(estimate_memory_report(cfg, 1, 8), !Contains("assumed"));

  SECTION("TP and PP divide the model approximately") {
    cfg.parallel.tp = 2;
    cfg.parallel.pp = 2;
    cfg.model.padded_vocab_size = 0;  // re-padded for TP 2: 50432
    MemoryEstimate e = estimate_memory(cfg, 1, 8);
    CHECK(e.dp == 2);
    CHECK(e.approximate);
    CHECK(e.n_params_rank == (e.n_params + 3) / 4);
    CHECK_THAT(estimate_memory_report(cfg, 1, 8), Contains("approximate"));
  }
  SECTION("offload: two gradient buckets of reduce_bucket_size, not the whole gradient range") {
    cfg.zero.reduce_bucket_size = 1 << 20;
    const MemoryEstimate e = estimate_memory(cfg, 1, 8);
    const int64_t shard = kN / 8;
    CHECK(row(e, 2, true).host_per_rank == 4 * kInitChunk + 12 * shard + 2 * 4 * (1 << 20));
    CHECK(row(e, 2, true).device_total == row(base, 2, true).device_total);  // host memory only
  }
  SECTION("pipeline messages count in the device total") {
    cfg.parallel.pp = 2;
    const MemoryEstimate e = estimate_memory(cfg, 1, 8);  // DP 4: 512 / (8 x 4) = 16 micro-batches
    // 1F1B, no overlap: the last stage holds a received activation and, while
    // its batch [SendBackward, RecvForward] is in flight, the input gradient
    // it sends; the first stage only the gradient it receives.
    CHECK(e.pipeline_buffers == 2);
    CHECK(e.pipeline_buffer_bytes == 8 * 1024 * 768 * 2);  // B x T x C in bf16
    CHECK(row(e, 1, false).device_total ==
          row(e, 1, false).states.total() + e.activations.total() + 2 * e.pipeline_buffer_bytes);
    CHECK_THAT(estimate_memory_report(cfg, 1, 8), Contains("pipeline messages per rank: up to 2 buffers of 12582912 bytes"));
    CHECK(base.pipeline_bytes() == 0);
    // Interleaved (2 chunks of 3 layers per stage) with 3 micro-batches:
    // dstrain refuses to start it, the estimate still answers (1F1B's count).
    cfg.parallel.num_layers_per_virtual_stage = 3;
    cfg.batch.train_batch_size = 8 * 4 * 3;
    MemoryEstimate odd;
    REQUIRE_NOTHROW(odd = estimate_memory(cfg, 1, 8));
    CHECK(odd.pipeline_buffers == pipeline_message_buffers_max(2, 3, 1, false));
  }
  SECTION("ZB-H1: the copies the waiting weight passes keep count in the device total") {
    cfg.parallel.pp = 2;
    const MemoryEstimate one = estimate_memory(cfg, 1, 8);
    cfg.parallel.zbh1_pipeline = true;
    const MemoryEstimate e = estimate_memory(cfg, 1, 8);  // 16 micro-batches
    // Stage 1 of 2: one input pass waits, and a second while each later one
    // runs before its weight pass. Per layer and row (bf16): qkv 3 x 768 out
    // + 768 in, attention proj 768 + 768, fc 3072 + 768, mlp proj 768 + 3072;
    // 6 layers, 8 x 1024 rows.
    CHECK(e.weight_passes == 2);
    const int64_t per_set = int64_t{(2304 + 768) + (768 + 768) + (3072 + 768) + (768 + 3072)} * 6 * 8 * 1024 * 2;
    CHECK(e.weight_pass_bytes == 2 * per_set);
    CHECK(e.pipeline_buffers == one.pipeline_buffers);
    CHECK(row(e, 1, false).device_total == row(one, 1, false).device_total + 2 * per_set);
    CHECK_THAT(estimate_memory_report(cfg, 1, 8), Contains("ZB-H1 weight passes: up to 2 micro-batches wait"));
  }
  SECTION("Ulysses: DP is world / (TP x PP x U), ZeRO partitions over U x DP, each rank holds T/U positions") {
    cfg.parallel.sp = 2;
    const MemoryEstimate e = estimate_memory(cfg, 1, 8);
    CHECK(e.dp == 4);
    CHECK(e.ulysses == 2);
    CHECK(e.sdp == 8);
    for (int stage = 0; stage <= 3; ++stage)  // the same 8 ZeRO shards as DP 8
      CHECK(row(e, stage, false).states.total() == row(base, stage, false).states.total());
    CHECK(2 * e.activations.saved == base.activations.saved);
    CHECK(2 * e.activations.workspace == base.activations.workspace);
    const std::string rep = estimate_memory_report(cfg, 1, 8);
    CHECK_THAT(rep, Contains("TP=1 PP=1 DP=4 Ulysses=2 (ZeRO partitions over Ulysses x DP = 8 ranks)"));
    CHECK_THAT(rep, Contains("x seq 512 of 1024"));
    // MoE layers run on the whole sequence on each Ulysses rank: their
    // buffers are those of one process's T positions, plus the four whole
    // (B T, C) buffers of the gathers.
    TrainConfig moe = cfg, moe1 = cfg;
    moe.model.moe.num_experts = {8};
    moe1.model.moe.num_experts = {8};
    moe1.parallel.sp = 1;
    const MemoryEstimate mu = estimate_memory(moe, 1, 8), m1 = estimate_memory(moe1, 1, 8);
    const int64_t BTC2 = int64_t{8} * 1024 * 768 * 2;  // B T C in bf16
    CHECK(mu.activations.workspace == m1.activations.workspace / 2 + 4 * BTC2);
    CHECK(mu.activations.saved > m1.activations.saved / 2);  // the MoE buffers are not halved
    cfg.parallel.sp = 3;
    CHECK_THROWS_WITH(estimate_memory(cfg, 1, 8), Contains("not divisible by TP 1 * PP 1 * Ulysses 3"));
  }
  SECTION("expert parallelism: a rank holds E / EP of each MoE layer's experts") {
    cfg.model.moe.num_experts = {8};  // MoE on layers 2, 4, ..., 12
    cfg.model.moe.expert_parallel_size = 2;
    cfg.zero.stage = 0;
    const MemoryEstimate e = estimate_memory(cfg, 1, 8);
    CHECK(e.layout.ep == 2);
    CHECK(e.dp == 8);
    const int64_t per_expert = 2 * 768 * 3072 + 3072;  // fc weight and bias, proj weight (no bias)
    CHECK(e.n_params_rank == e.n_params - 6 * 4 * per_expert);
    CHECK(row(e, 0, false).supported);
    CHECK(row(e, 2, false).supported);
    CHECK_FALSE(row(e, 1, true).supported);
    // Stage 1 partitions as DeepSpeed: the dense weights' state over all 8
    // data-parallel ranks, the experts' over the DP / EP = 4 ranks that hold
    // the same experts (a rank's experts: 6 MoE layers x 4 experts).
    const int64_t experts = 6 * 4 * per_expert, dense = e.n_params_rank - experts;
    CHECK(e.n_experts_rank == experts);
    CHECK(row(e, 1, false).states.optimizer ==
          zero_model_state_bytes(dense, 8, 1, e.precision, false).optimizer +
              zero_model_state_bytes(experts, 4, 1, e.precision, false).optimizer);
    CHECK(row(e, 1, false).states.params == zero_model_state_bytes(dense, 8, 1, e.precision, false).params +
                                                zero_model_state_bytes(experts, 4, 1, e.precision, false).params);
    // Stages 2 and 3 the same way (gradient and parameter shards too).
    CHECK(row(e, 2, false).states.grads == zero_model_state_bytes(dense, 8, 2, e.precision, false).grads +
                                               zero_model_state_bytes(experts, 4, 2, e.precision, false).grads);
    CHECK(row(e, 2, false).states.optimizer ==
          zero_model_state_bytes(dense, 8, 2, e.precision, false).optimizer +
              zero_model_state_bytes(experts, 4, 2, e.precision, false).optimizer);
    CHECK(row(e, 3, false).states.params == zero_model_state_bytes(dense, 8, 3, e.precision, false).params +
                                                zero_model_state_bytes(experts, 4, 3, e.precision, false).params);
    const std::string rep = estimate_memory_report(cfg, 1, 8);
    CHECK_THAT(rep, Contains("TP=1 PP=1 DP=8 EP=2 (each rank holds 1/2 of every MoE layer's experts)"));
    CHECK_THAT(rep, Contains("not supported: expert parallelism on a GPU runs without optimizer offload so far"));
    // On the CPU backend offload_optimizer cpu moves nothing: supported, the
    // host holding each group's state shard.
    cfg.device = DeviceType::CPU;
    const MemoryEstimate c = estimate_memory(cfg, 1, 8);
    REQUIRE(row(c, 1, true).supported);
    CHECK(row(c, 1, true).states.optimizer == 0);
    CHECK(row(c, 1, true).host_per_rank - row(c, 1, true).device_total ==
          row(c, 1, false).host_per_rank - row(c, 1, false).device_total + row(c, 1, false).states.optimizer);
  }
  SECTION("OneBitAdam at stage 0: its compression errors beside the moments") {
    const MemoryEstimate adam = estimate_memory(cfg, 1, 8);
    cfg.optim.spec.type = "OneBitAdam";
    const MemoryEstimate ob = estimate_memory(cfg, 1, 8);
    CHECK(row(ob, 0, false).states.optimizer == row(adam, 0, false).states.optimizer + 4 * kN + 4 * kN / 8);
    CHECK(row(ob, 1, false).states.optimizer == row(adam, 1, false).states.optimizer);  // (refused with ZeRO)
    // 0/1 Adam: its update accumulator too; 1-bit Lamb: a third state
    // (exp_avg_sq_fresh) and the momentum's copy during a compressed step.
    cfg.optim.spec.type = "ZeroOneAdam";
    CHECK(row(estimate_memory(cfg, 1, 8), 0, false).states.optimizer == row(ob, 0, false).states.optimizer + 4 * kN);
    cfg.optim.spec.type = "OneBitLamb";
    CHECK(row(estimate_memory(cfg, 1, 8), 0, false).states.optimizer ==
          row(ob, 0, false).states.optimizer + 4 * kN + 4 * kN);
    cfg.optim.spec.type = "OneBitAdam";  // fp16's group units: the gather buffer
    cfg.optim.spec.compress_param_groups = true;
    CHECK(row(estimate_memory(cfg, 1, 8), 0, false).states.optimizer == row(ob, 0, false).states.optimizer + 4 * kN);
  }
  SECTION("full recomputation keeps only layer inputs") {
    cfg.parallel.recompute = RecomputeKind::Full;
    MemoryEstimate e = estimate_memory(cfg, 1, 8);
    CHECK(e.activations.saved < base.activations.saved);
    CHECK(e.activations.workspace == base.activations.workspace);
  }
  SECTION("fp32 doubles activation bytes and uses the fp32 state formulas") {
    cfg.precision.precision = Precision::FP32;
    MemoryEstimate e = estimate_memory(cfg, 1, 8);
    CHECK(e.activations.workspace == 2 * base.activations.workspace);
    CHECK(row(e, 0, false).states.total() == 16 * kN);
    CHECK(row(e, 1, false).states.total() == 8 * kN + 8 * (kN / 8));
  }
  SECTION("world not divisible by TP*PP is a user error") {
    cfg.parallel.tp = 3;
    CHECK_THROWS_AS(estimate_memory(cfg, 1, 8), UserError);
    CHECK_THROWS_AS(estimate_memory(cfg, 0, 8), UserError);
  }
}

TEST_CASE("pipeline message buffers per stage follow the p2p plan", "[zero][estimate]") {
  // 1F1B over 2 stages, 4 micro-batches, without overlap:
  //   stage 0: F0 [SF0] F1 [SF1 RB0] B0 F2 [SF2 RB1] B1 ... [RB3] B3: one
  //            received gradient at a time, and the first stage sends none.
  //   stage 1: [RF0] F0 B0 [SB0 RF1] F1 B1 ...: B0's input gradient is still
  //            being sent while RF1's buffer receives: 2.
  CHECK(pipeline_message_buffers(2, 0, 4, 1, false) == 1);
  CHECK(pipeline_message_buffers(2, 1, 4, 1, false) == 2);
  // overlap_comm: each receive is posted one compute earlier, so stage 0
  // holds RB(i+1) while RB(i) waits for its backward, and the last stage
  // receives RF(i+1) before B(i) writes its input gradient.
  CHECK(pipeline_message_buffers(2, 0, 4, 1, true) == 2);
  CHECK(pipeline_message_buffers(2, 1, 4, 1, true) == 2);
  CHECK(pipeline_message_buffers_max(2, 4, 1, false) == 2);
  CHECK(pipeline_message_buffers(1, 0, 4, 1, true) == 0);  // no pipeline, no messages
  // More stages never need fewer buffers than a message in each direction
  // on a middle stage; and more micro-batches than stages do not grow the
  // steady state's count (1F1B bounds what is in flight).
  for (int pp : {3, 4})
    for (bool overlap : {false, true}) {
      INFO("pp " << pp << " overlap " << overlap);
      CHECK(pipeline_message_buffers(pp, 1, 2 * pp, 1, overlap) >= 2);
      CHECK(pipeline_message_buffers_max(pp, 4 * pp, 1, overlap) == pipeline_message_buffers_max(pp, 2 * pp, 1, overlap));
    }
}

TEST_CASE("memory estimate: each optimizer's state bytes", "[zero][estimate]") {
  struct Want {
    OptimizerSpec spec;
    int64_t bytes;  // per element of the optimizer's range
  };
  for (const Want& w : {Want{{.type = "AdamW"}, 8}, Want{{.type = "Adam", .adam_w_mode = false}, 8},
                        Want{{.type = "Lamb"}, 8}, Want{{.type = "Lion"}, 4}, Want{{.type = "Adagrad"}, 4},
                        Want{{.type = "SGD", .momentum = 0.9f}, 4}, Want{{.type = "SGD"}, 0}}) {
    INFO(w.spec.type << " momentum " << w.spec.momentum);
    TrainConfig cfg = gpt2_124m();
    cfg.device = DeviceType::CUDA;
    cfg.optim.spec = w.spec;
    const MemoryEstimate e = estimate_memory(cfg, 1, 8);
    CHECK(row(e, 0, false).states.optimizer == w.bytes * kN);
    CHECK(row(e, 3, false).states.optimizer == w.bytes * (kN / 8));
    CHECK(row(e, 2, true).states.optimizer == 0);  // offloaded: host memory
  }
}

TEST_CASE("memory estimate: a distillation teacher on every rank", "[zero][estimate]") {
  TrainConfig plain = gpt2_124m();
  plain.device = DeviceType::CUDA;
  const MemoryEstimate base = estimate_memory(plain, 1, 8);
  TrainConfig kd = plain;
  kd.distill.enabled = true;
  kd.distill.load_teacher = "teacher";
  SECTION("sized from the flags: 24 layers of the student's width") {
    kd.distill.num_layers = 24;
    const MemoryEstimate e = estimate_memory(kd, 1, 8);
    TrainConfig t = kd;
    t.model.num_layers = 24;
    t.model.vocab_size = 50257;
    t.model.padded_vocab_size = 50304;
    const int64_t n = count_parameters(t.model);
    CHECK(e.teacher_params == n);
    CHECK(e.teacher_bytes > 6 * n);  // bf16: f32 weights + the bf16 copy, plus activations
    for (size_t i = 0; i < e.rows.size(); ++i)
      if (e.rows[i].supported) CHECK(e.rows[i].device_total == base.rows[i].device_total + e.teacher_bytes);
    CHECK_THAT(estimate_memory_report(kd, 1, 8), Contains("distillation teacher on every rank"));
  }
  SECTION("not given: not counted, and the report says so") {
    const MemoryEstimate e = estimate_memory(kd, 1, 8);
    CHECK(e.teacher_params == 0);
    CHECK(e.rows[0].device_total == base.rows[0].device_total);
    CHECK_THAT(estimate_memory_report(kd, 1, 8), Contains("teacher not counted"));
  }
}

namespace {

// GPT-2 124M at ZeRO-3 with the optimizer state on NVMe: sub-groups of 1e6
// elements, buffer_count 4.
TrainConfig nvme_config(DeviceType device) {
  TrainConfig cfg = gpt2_124m();
  cfg.device = device;
  cfg.zero.stage = 3;
  cfg.zero.offload_optimizer = OffloadDevice::NVMe;
  cfg.zero.nvme.nvme_path = "/nvme";
  cfg.zero.sub_group_size = 1000000;
  cfg.zero.nvme.buffer_count = 4;
  return cfg;
}

}  // namespace

TEST_CASE("memory estimate: the optimizer state on NVMe with a GPU model", "[zero][estimate]") {
  TrainConfig cfg = nvme_config(DeviceType::CUDA);
  const MemoryEstimate e = estimate_memory(cfg, 1, 8);
  const MemoryEstimateRow& nv = e.rows.back();
  REQUIRE(nv.nvme);
  CHECK(nv.supported);
  CHECK(nv.configured);
  // The device holds what it holds with offload_optimizer cpu: the f32
  // parameter shard (the master) and the f32 gradient shard, which stays
  // there (its reductions run on the GPU).
  const MemoryEstimateRow& cpu = row(e, 3, true);
  CHECK_FALSE(nv.nvme_grads);
  CHECK(nv.states.params == cpu.states.params);
  CHECK(nv.states.grads == cpu.states.grads);
  CHECK(nv.states.optimizer == 0);
  CHECK(nv.device_total == cpu.device_total);
  const int64_t shard = kN / 8;
  const int64_t tile = (4 * 1000000 + 4095) / 4096 * 4096, groups = (shard + 999999) / 1000000;
  CHECK(nv.nvme_per_rank == groups * 2 * tile);  // exp_avg, exp_avg_sq
  // Host beyond the no-offload run's start-up staging: the tier's two sets of
  // two sub-group buffers and the step's two pairs of gradient and master
  // buffers of one sub-group each (OffloadPipeline::step_tier).
  CHECK(nv.host_per_rank - row(e, 3, false).host_per_rank == 2 * 2 * tile + 2 * 2 * 4 * 1000000);
  CHECK(nv.host_per_rank < cpu.host_per_rank);  // not the whole Adam state and master copy
  CHECK_THAT(estimate_memory_report(cfg, 1, 8), Contains("* ZeRO 3     | nvme"));

  // offload_param cpu: the f32 parameter shard leaves the device for host
  // memory, and the step copies only gradients down (one buffer per sub-group).
  cfg.zero.offload_param = OffloadDevice::CPU;
  const MemoryEstimate ep = estimate_memory(cfg, 1, 8);
  const MemoryEstimateRow& hp = ep.rows.back();
  CHECK(hp.host_params);
  CHECK(hp.states.params == 0);
  CHECK(hp.device_total == nv.device_total - 4 * shard);
  CHECK(hp.host_per_rank - nv.host_per_rank == 4 * shard - 2 * 4 * 1000000);
  const MemoryEstimateRow& hc = row(ep, 3, true);  // the cpu optimizer offload with host parameters
  CHECK(hc.host_params);
  CHECK(hc.host_per_rank - cpu.host_per_rank == 4 * shard - 4 * shard);  // the shard is the master: no copy
  CHECK_FALSE(row(ep, 3, false).host_params);  // offload_param needs the optimizer offloaded on a GPU
  CHECK_FALSE(row(ep, 2, true).host_params);   // and stage 3
  CHECK_THAT(estimate_memory_report(cfg, 1, 8), Contains("* ZeRO 3     | nvme, params cpu"));
  // offload_param nvme: the shard joins the swap file as a third state.
  cfg.zero.offload_param = OffloadDevice::NVMe;
  const MemoryEstimate en = estimate_memory(cfg, 1, 8);
  const MemoryEstimateRow& pn = en.rows.back();
  CHECK(pn.nvme_params);
  CHECK(pn.states.params == 0);
  CHECK(pn.nvme_per_rank == groups * 3 * tile);
}

TEST_CASE("memory estimate: the optimizer state on NVMe (ZeRO-3, CPU backend)", "[zero][estimate]") {
  TrainConfig cfg = nvme_config(DeviceType::CPU);
  const MemoryEstimate e = estimate_memory(cfg, 1, 8);
  const MemoryEstimateRow& nv = e.rows.back();
  REQUIRE(nv.nvme);
  CHECK(nv.supported);
  CHECK(nv.configured);
  const MemoryEstimateRow& mem = row(e, 3, false);
  CHECK_FALSE(mem.configured);
  const int64_t shard = kN / 8;
  // Adam's two states leave memory: exp_avg and exp_avg_sq, 8 bytes per
  // element of the shard, and so does the f32 gradient shard (4 bytes).
  CHECK(mem.states.optimizer == 8 * shard);
  CHECK(mem.states.grads == 4 * shard);
  CHECK(nv.nvme_grads);
  CHECK(nv.states.optimizer == 0);
  CHECK(nv.states.params == mem.states.params);
  CHECK(nv.states.grads == 0);
  // Sub-groups of 1e6 elements, each state's tile rounded up to 4 KiB.
  const int64_t tile = (4 * 1000000 + 4095) / 4096 * 4096, groups = (shard + 999999) / 1000000;
  CHECK(nv.nvme_per_rank == groups * 3 * tile);
  // Host: what the rank holds in memory plus one buffer set (buffer_count 4 / 3 states).
  CHECK(nv.host_per_rank - nv.device_total == mem.host_per_rank - mem.device_total + 1 * 3 * tile);
  CHECK(nv.device_total == mem.device_total - 12 * shard);
  const std::string rep = estimate_memory_report(cfg, 1, 8);
  CHECK_THAT(rep, Contains("* ZeRO 3     | nvme"));
  CHECK_THAT(rep, Contains("per-rank NVMe"));
  // offload_param nvme: the parameter shard joins the file as a fourth state.
  cfg.zero.offload_param = OffloadDevice::NVMe;
  const MemoryEstimate p = estimate_memory(cfg, 1, 8);
  const MemoryEstimateRow& np = p.rows.back();
  REQUIRE(np.nvme_params);
  CHECK(np.states.params == 0);
  CHECK(np.states.grads == 0);
  CHECK(np.nvme_per_rank == groups * 4 * tile);
  CHECK(np.device_total == nv.device_total - mem.states.params);
  CHECK_THAT(estimate_memory_report(cfg, 1, 8), Contains("* ZeRO 3     | nvme (+ params)"));
  // With bf16 accumulation the gradient shard stays in memory (bf16).
  cfg.zero.offload_param = OffloadDevice::None;
  cfg.precision.grad_accum = DType::BF16;  // (the config computes in bf16)
  const MemoryEstimateRow bn = estimate_memory(cfg, 1, 8).rows.back();
  CHECK_FALSE(bn.nvme_grads);
  CHECK(bn.states.grads == 2 * shard);
  CHECK(bn.nvme_per_rank == groups * 2 * tile);
  cfg.precision.grad_accum = DType::F32;
  // Expert parallelism: a swap file per sharding group, the dense weights'
  // shard over the 8 data-parallel ranks, the experts' over DP / EP = 4 (the
  // gradient shards, one per group, stay in memory).
  cfg.zero.offload_param = OffloadDevice::None;
  cfg.model.moe.num_experts = {8};
  cfg.model.moe.expert_parallel_size = 2;
  const MemoryEstimate x = estimate_memory(cfg, 1, 8);
  const MemoryEstimateRow& xn = x.rows.back();
  REQUIRE(xn.nvme);
  CHECK(xn.supported);
  const int64_t dense = make_zero_partition(x.n_params_rank - x.n_experts_rank, 8).shard,
                experts = make_zero_partition(x.n_experts_rank, 4).shard;
  auto file = [&](int64_t n) { return (n + 999999) / 1000000 * 2 * tile; };
  CHECK(xn.nvme_per_rank == file(dense) + file(experts));
  CHECK_FALSE(xn.nvme_grads);
  CHECK(xn.states.optimizer == 0);
  // Two tiers, each with its two buffer sets.
  CHECK(xn.host_per_rank - xn.device_total ==
        row(x, 3, false).host_per_rank - row(x, 3, false).device_total + 2 * 2 * 2 * tile);
}

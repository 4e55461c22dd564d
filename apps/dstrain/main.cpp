// dstrain: GPT pretraining (GPT-2 and LLaMA families) from a DeepSpeed JSON
// config plus Megatron-style flags. Joins the job described by the launcher's
// environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DS_JOB_TOKEN; a
// single process without them). User errors print one line and exit 1.
#include <cstdio>
#include <exception>

#include "lib/comm/communicator.h"
#include "lib/chat/instruction_data.h"
#include "lib/config/config.h"
#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/core/run_main.h"
#include "lib/parallel/comms.h"
#include "lib/parallel/rank_grid.h"
#include "lib/train/autotune_hooks.h"
#include "lib/train/memory_estimate.h"
#include "lib/train/trainer.h"

namespace {

int run(int argc, char** argv) {
  ds::RendezvousInfo rv = ds::RendezvousInfo::from_env();
  ds::TrainConfig cfg = ds::parse_train_config(argc, argv, rv.world_size);
  if (!cfg.help_text.empty()) {
    std::printf("%s\n", cfg.help_text.c_str());
    return 0;
  }
  if (cfg.estimate_memory) {
    ds::resolve_vocab(cfg);
    ds::write_estimate_json_if_asked(cfg, rv.world_size);
    std::printf("%s\n", ds::estimate_memory_report(cfg, 1, rv.world_size).c_str());
    return 0;
  }
  ds::log_set_rank(rv.rank);
  // NCCL between GPUs, Gloo between CPU processes (Megatron's --distributed-backend follows --device).
  auto world = ds::make_world_communicator(cfg.device == ds::DeviceType::CUDA ? ds::Backend::Nccl : ds::Backend::Gloo, rv);
  ds::RankGrid grid = ds::make_rank_grid(cfg.layout, rv.rank);
  ds::Comms comms = ds::build_comms(*world, grid);
  // A conversion (hf2megads_weight_converter.py's flags) reads no data.
  const ds::Device dev = cfg.device == ds::DeviceType::CUDA ? ds::Device::cuda(rv.local_rank) : ds::Device::cpu();
  std::unique_ptr<ds::BatchSource> data;
  if (cfg.ckpt.hf_convert)
    data = ds::no_training_data(dev);
  else if (ds::chat::is_instruction_data(cfg))
    data = ds::chat::make_instruction_source(cfg, dev);
  ds::Trainer trainer(cfg, comms, rv.local_rank, std::move(data));
  trainer.run();
  world->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ds::run_main("dstrain", [&] {
    return run(argc, argv);
  });
}

// dstrain: GPT pretraining (GPT-2 and LLaMA families) from a DeepSpeed JSON
// config plus Megatron-style flags. User errors print one line and exit 1.
#include <cstdio>
#include <exception>

#include "lib/core/error.h"
#include "lib/core/log.h"
#include "lib/train/config.h"
#include "lib/train/trainer.h"

int main(int argc, char** argv) {
  try {
    ds::TrainConfig cfg = ds::parse_train_config(argc, argv, /*world_size=*/1);
    ds::Trainer trainer(cfg);
    trainer.run();
    return 0;
  } catch (const ds::UserError& e) {
    std::fprintf(stderr, "dstrain: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dstrain: internal error: %s\n", e.what());
    return 2;
  }
}

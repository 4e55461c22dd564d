// dschat sft: DeepSpeed-Chat's step 1 (supervised fine-tuning), with the
// flags, defaults and meaning of its training/step1_supervised_finetuning/
// main.py: the data phases and examples (phase_data.h), the model's
// tokenizer and samples (chat_tokenizer.h), PyTorch's DistributedSampler
// order (torch_sampler.h), AdamW with betas (0.9, 0.95), gradient clipping
// 1.0, transformers' schedule per optimizer step, perplexity on the eval
// split before training and after each epoch, and the model written as a
// Hugging Face directory to --output_dir. docs/dschat.md lists what is
// implemented and what is refused.
#pragma once
#include <string>
#include <vector>

namespace ds::chat {

// argv: the flags after "dschat sft". Joins the launcher's job (RANK,
// WORLD_SIZE, ...; one process without them). Returns the exit code.
int run_sft(const std::vector<std::string>& argv);

}  // namespace ds::chat

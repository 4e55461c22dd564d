// Megatron-DeepSpeed's finetune_llama.py data (megatron/data/prompt_dataset.py,
// SupervisedDataset; docs/megatron_scripts.md, finetune_hf_llama): a JSON list
// of Stanford Alpaca records {"instruction", "input", "output"} turned into
// supervised examples. Each record's source is the Alpaca prompt (the
// "prompt_input" template when "input" is non-empty, else "prompt_no_input");
// its target is "output" followed by the tokenizer's eos token text. The
// example source + target is tokenized as the Hugging Face tokenizer does
// (a bos first, special tokens written in the text as single ids), truncated
// and padded to seq_length + 1; the labels of the source's tokens and of the
// padding are masked. A micro-batch holds tokens = ids[:-1] and the targets
// ids[1:] where not masked (-1 elsewhere), and its loss is the mean over the
// targets it counts (finetune_llama.py's loss_mask, labels != pad).
// Padding positions hold the eos id instead of upstream's "[PAD]": they come
// after every real position of their row, so under the causal mask they
// change no loss and no gradient.
// Order: Megatron's pretraining sampler without shuffling, over and over
// (--repeated-dataloader): global samples in file order, each data-parallel
// rank taking its micro-batch's slice of every group of micro x dp samples,
// the last incomplete group of an epoch dropped.
#pragma once
#include <memory>
#include <string>

#include "lib/config/config.h"
#include "lib/train/batch_source.h"

namespace ds::chat {

// Whether cfg's training data is such a file: one --data-path entry ending
// in ".json" (pretraining datasets are .bin/.idx prefixes).
bool is_instruction_data(const TrainConfig& cfg);

// The source for cfg (its data path, tokenizer directory and sizes) on `dev`.
// A missing or malformed file, a record without "instruction" or "output", a
// tokenizer that is not a Hugging Face directory, or fewer records than one
// group of micro x dp samples is one UserError.
std::unique_ptr<BatchSource> make_instruction_source(const TrainConfig& cfg, Device dev);

}  // namespace ds::chat

// DeepSpeed-Chat's unsupervised data for step 3 (get_unsupervised_data in
// dschat/utils/data/data_utils.py): the train split of
// `datasets.load_dataset(--unsupervised_dataset_name,
// --unsupervised_dataset_config_name)`, its "text" column (else its first)
// tokenized, and group_texts' blocks of --max_prompt_seq_len +
// --max_answer_seq_len tokens, each the labels of itself.
//
// dschat reads what load_dataset reads from a local folder (it downloads no
// Hub dataset): the folder's data files, the "default" configuration (the
// only one a folder has; datasets refuses any other name), .txt files with
// one example per line (the text builder: universal newlines, line breaks
// dropped) or .json / .jsonl files (the json builder: JSON Lines or one
// array of objects; dschat reads their "text" field, where datasets would
// take the first column of records without one). The train split is the files whose path names it
// (datasets' keyword patterns: "train" or "training" after the start, a
// separator or a "/", and before a separator or a "/"), or every data file
// when no file names a split; files in name order, at the folder's top.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ds::chat {

// The train split's texts, in order. One UserError naming `flag` for a path
// that is not a folder, a configuration other than "default", a folder
// without data files or without a train split, mixed text and JSON files,
// or a record whose text column is not a string.
std::vector<std::string> read_unsupervised_texts(const std::string& dir, const std::string& config,
                                                 const std::string& flag);

// group_texts as datasets' map(batched=True) runs it: over each batch of
// `map_batch` consecutive examples (1000, map's default) the ids are
// concatenated and cut into blocks of `block` tokens, the remainder dropped;
// a batch with fewer than `block` tokens in all gives one shorter block (none
// when it has no token).
std::vector<std::vector<int32_t>> group_texts(const std::vector<std::vector<int32_t>>& ids, int64_t block,
                                              int64_t map_batch = 1000);

}  // namespace ds::chat

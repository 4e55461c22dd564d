// --model_name_or_path as DeepSpeed-Chat's users give it: a directory, or a
// Hugging Face Hub name ("facebook/opt-1.3b") found in the local Hugging
// Face cache, never downloaded: HF_HUB_CACHE, else HF_HOME/hub, else
// XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; the model's
// models--ORG--NAME/snapshots/<revision>, the revision refs/main names (or
// the only snapshot).
#pragma once
#include <string>

namespace ds::chat {

// The model directory of `name_or_path`; a UserError naming `flag` and where
// it looked when there is none.
std::string resolve_model_dir(const std::string& name_or_path, const std::string& flag = "--model_name_or_path");

}  // namespace ds::chat

// DeepSpeed-Chat's `local/jsonfile` data: examples with a prompt, a chosen
// and a rejected answer (any may be null or absent), one JSON object per line
// (JSON Lines, what the `datasets` json loader reads) or one JSON array of
// them. The texts each step trains on are built as DeepSpeed-Chat's
// LocalJsonFileDataset builds them: every field with a space before it,
// prompt and answer joined by a space.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace ds::chat {

struct ChatExample {
  std::optional<std::string> prompt, chosen, rejected;
};

// The examples of `path`. Other fields are ignored; a field that is neither a
// string nor null, a line that is not a JSON object, or a file over 4 GiB is
// one UserError naming the file and line.
std::vector<ChatExample> read_pair_file(const std::string& path);

// " " + prompt; " " + chosen; " " + prompt + " " + chosen; ... (nullopt when
// a part is missing: DeepSpeed-Chat then skips the example).
std::optional<std::string> prompt_text(const ChatExample& e);
std::optional<std::string> chosen_text(const ChatExample& e);
std::optional<std::string> rejected_text(const ChatExample& e);
std::optional<std::string> prompt_and_chosen(const ChatExample& e);
std::optional<std::string> prompt_and_rejected(const ChatExample& e);

}  // namespace ds::chat

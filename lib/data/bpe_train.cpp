// Byte-level BPE training and the writer for vocab.json + merges.txt.
// Words are the corpus's GPT-2 pre-tokens with their counts. Pair counts are kept
// incrementally: merging a pair only rewrites the words that contain it (found
// through a pair -> words index), subtracting their old pairs and adding their
// new ones. A max-heap with lazy invalidation yields the most frequent pair.
#include <algorithm>
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <limits>
#include <queue>
#include <unordered_map>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/data/bpe.h"

namespace ds::data {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
}

struct Word {
  std::vector<int32_t> sym;
  int64_t count = 0;
};

struct HeapItem {
  int64_t count;
  uint64_t key;
  // Max-heap on count; among equal counts the smaller key comes first.
  bool operator<(const HeapItem& o) const {
    return count != o.count ? count < o.count : key > o.key;
  }
};

class Trainer {
 public:
  Trainer(std::vector<Word> words) : words_(std::move(words)), stamp_(words_.size(), -1) {
    for (size_t w = 0; w < words_.size(); ++w) add_pairs(static_cast<int32_t>(w), +1);
    for (auto& [key, c] : counts_) heap_.push({c, key});
  }

  // Returns false when no pair reaches min_count.
  bool merge_best(int64_t min_count, int32_t new_id, std::pair<int32_t, int32_t>* merged) {
    while (!heap_.empty()) {
      HeapItem top = heap_.top();
      heap_.pop();
      auto it = counts_.find(top.key);
      if (it == counts_.end() || it->second != top.count) continue;  // stale
      if (top.count < min_count) return false;
      apply(top.key, new_id);
      *merged = {static_cast<int32_t>(top.key >> 32), static_cast<int32_t>(top.key & 0xffffffff)};
      return true;
    }
    return false;
  }

 private:
  void add_pairs(int32_t w, int sign) {
    const Word& word = words_[w];
    for (size_t k = 0; k + 1 < word.sym.size(); ++k) {
      const uint64_t key = pair_key(word.sym[k], word.sym[k + 1]);
      int64_t& c = counts_[key];
      c += sign * word.count;
      touched_.push_back(key);
      if (sign > 0) where_[key].push_back(w);
    }
  }

  void apply(uint64_t key, int32_t new_id) {
    const auto a = static_cast<int32_t>(key >> 32), b = static_cast<int32_t>(key & 0xffffffff);
    std::vector<int32_t> ws = std::move(where_[key]);
    where_.erase(key);
    touched_.clear();
    ++generation_;
    for (int32_t w : ws) {
      if (stamp_[w] == generation_) continue;  // listed twice
      stamp_[w] = generation_;
      Word& word = words_[w];
      bool has = false;
      for (size_t k = 0; k + 1 < word.sym.size() && !has; ++k)
        has = word.sym[k] == a && word.sym[k + 1] == b;
      if (!has) continue;
      add_pairs(w, -1);
      std::vector<int32_t> next;
      next.reserve(word.sym.size());
      for (size_t k = 0; k < word.sym.size();) {
        if (k + 1 < word.sym.size() && word.sym[k] == a && word.sym[k + 1] == b) {
          next.push_back(new_id);
          k += 2;
        } else {
          next.push_back(word.sym[k++]);
        }
      }
      word.sym.swap(next);
      add_pairs(w, +1);
    }
    for (uint64_t t : touched_) {
      auto it = counts_.find(t);
      if (it == counts_.end()) continue;
      if (it->second <= 0) {
        counts_.erase(it);
        where_.erase(t);
      } else {
        heap_.push({it->second, t});  // duplicates are skipped as stale later
      }
    }
  }

  std::vector<Word> words_;
  std::vector<int64_t> stamp_;
  int64_t generation_ = 0;
  std::unordered_map<uint64_t, int64_t> counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;
  std::priority_queue<HeapItem> heap_;
  std::vector<uint64_t> touched_;
};

}  // namespace

TrainedBpe train_bpe(std::string_view corpus, int64_t vocab_size, const BpeTrainOptions& options) {
  DS_USER_CHECK(vocab_size >= 257, "--vocab-size {} is too small: a byte-level vocabulary needs "
                "256 byte tokens plus <|endoftext|> (at least 257)", vocab_size);
  DS_USER_CHECK(vocab_size <= std::numeric_limits<int32_t>::max(), "--vocab-size {} is too large",
                vocab_size);
  TrainedBpe out;
  std::array<int32_t, 256> id_of_byte{};
  for (int i = 0; i < 256; ++i) {
    const uint8_t b = gpt2_byte_order()[i];
    id_of_byte[b] = i;
    out.tokens.emplace_back(1, static_cast<char>(b));
  }

  std::unordered_map<std::string_view, int64_t> freq;
  {
    std::vector<std::string_view> pieces;
    pretokenize(corpus, pieces);
    for (std::string_view p : pieces) ++freq[p];
  }
  // Sort the distinct words so the result never depends on hash-map order.
  std::vector<std::pair<std::string_view, int64_t>> sorted(freq.begin(), freq.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (auto& [w, c] : sorted) {
    Word word;
    word.count = c;
    for (unsigned char ch : w) word.sym.push_back(id_of_byte[ch]);
    words.push_back(std::move(word));
  }

  Trainer trainer(std::move(words));
  while (static_cast<int64_t>(out.tokens.size()) + 1 < vocab_size) {
    std::pair<int32_t, int32_t> m;
    const auto new_id = static_cast<int32_t>(out.tokens.size());
    if (!trainer.merge_best(options.min_frequency, new_id, &m)) break;
    out.tokens.push_back(out.tokens[m.first] + out.tokens[m.second]);
    out.merges.push_back(m);
  }
  out.tokens.emplace_back(kEndOfText);
  return out;
}

void write_bpe_files(const TrainedBpe& bpe, const std::string& vocab_path,
                     const std::string& merges_path) {
  DS_CHECK(!bpe.tokens.empty() && bpe.tokens.back() == kEndOfText,
           "trained vocabulary must end with {}", kEndOfText);
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t id = 0; id + 1 < bpe.tokens.size(); ++id)
    vocab[bytes_to_token_name(bpe.tokens[id])] = id;
  vocab[kEndOfText] = bpe.tokens.size() - 1;
  std::string merges = "#version: 0.2\n";
  for (auto [a, b] : bpe.merges)
    merges += bytes_to_token_name(bpe.tokens[a]) + " " + bytes_to_token_name(bpe.tokens[b]) + "\n";
  for (const std::string& path : {vocab_path, merges_path}) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) DS_USER_ERROR("cannot create directory '{}' for '{}': {}", parent.string(), path, ec.message());
  }
  // Both are written in full before either replaces an old file. merges.txt
  // is renamed first: should a crash fall between the two renames, a new
  // merges.txt beside the old vocab.json fails the consistency check on load,
  // where the reverse would load and silently tokenize wrongly.
  StagedFiles files;
  files.stage(merges_path, merges);
  files.stage(vocab_path, vocab.dump(1) + "\n");
  files.commit();
}

}  // namespace ds::data

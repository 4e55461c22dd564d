// GPT pretraining samples over an indexed dataset, with Megatron-LM's semantics:
// a --split string divides the documents into train/valid/test ranges; within a
// range every epoch visits the documents in a freshly shuffled order, cuts the
// concatenated token stream into samples of seq_length+1 tokens (consecutive
// samples overlap by one token, since inputs are tokens [0, T) and targets [1, T+1)),
// and visits those samples in a shuffled order. Samples freely cross document
// boundaries. Any sample index is valid: sample s lives in epoch
// s / samples_per_epoch(), and epochs are built on demand, so training never runs
// out of data. Everything is a pure function of (dataset, range, seq_length, seed).
//
// Alternatively a GptDataset reads Megatron's own index maps (doc_idx,
// sample_idx, shuffle_idx .npy files; lib/data/index_maps.h): from_index_maps
// opens them, write_index_maps saves epoch 0 of an ordinary one in that form.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "lib/data/index_maps.h"
#include "lib/data/indexed_dataset.h"

namespace ds::data {

// Half-open range [begin, end) of sequence (document) indices.
struct DocRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const DocRange&) const = default;
};

struct SplitRanges {
  DocRange train, valid, test;
};

// Megatron's get_train_valid_test_split_: weights separated by ',' or '/' (missing
// ones are 0), normalized, boundaries b[i+1] = b[i] + round_half_even(w_i * size),
// then all boundaries shifted so the last equals size. Returns {b0, b1, b2, b3}.
// A malformed string throws UserError naming --split.
// The three weights of a --split string (missing ones 0); errors name `what`.
std::vector<double> parse_split_weights(const std::string& split, std::string_view what = "--split");
std::array<int64_t, 4> split_boundaries(const std::string& split, int64_t size);
SplitRanges split_documents(const std::string& split, int64_t num_documents);

class GptDataset;

// dstrain's default --split (data.split), which dsprep's data analysis uses too.
inline constexpr const char* kDefaultSplit = "949,50,1";

// The training dataset dstrain's data pipeline builds for one --data-path
// PREFIX (already opened as `file`): the train range of `split`, named
// "train split of 'PREFIX'". dsprep's data analysis builds it here too, so a
// sample id means the same sample in both.
GptDataset train_split_dataset(const IndexedDataset& file, const std::string& prefix, const std::string& split,
                               int64_t seq_length, uint64_t seed);

class GptDataset {
 public:
  // `ds` must outlive this object and stay where it is (it is held by pointer).
  // `name` ("train", "valid", ...) appears in errors. Movable, not copyable.
  GptDataset(const IndexedDataset& ds, DocRange range, int64_t seq_length, uint64_t seed,
             std::string name);

  // The samples of Megatron index maps over `ds` (checked when opened: see
  // index_maps.h; the maps stay memory-mapped, no per-sample heap). The maps'
  // sample count n is samples_per_epoch(), and global sample s is the maps'
  // dataset index s % n: past n the same samples repeat in the same order,
  // unlike an ordinary GptDataset, whose epochs reshuffle. locate(s).unshuffled
  // is the sample's sample_idx row, range() [smallest, largest + 1) of doc_idx's
  // sequence ids, num_tokens() the tokens of doc_idx's documents (repeats
  // counted), epoch_documents(e) doc_idx itself for every e. `name` as above.
  static GptDataset from_index_maps(const IndexedDataset& ds, const IndexMapPaths& paths, int64_t seq_length,
                                    std::string name);
  bool uses_index_maps() const { return maps_ != nullptr; }

  // Writes epoch 0 as Megatron index maps at `paths`, with Megatron's dtypes:
  // doc_idx int32, sample_idx int32 (int64 when a value does not fit),
  // shuffle_idx uint32 (int64 from 2^32 - 2 samples on, as Megatron does). The
  // three files are put in place together, or none is (ds::StagedFiles).
  // from_index_maps on them gives get(s) for every s < samples_per_epoch().
  // Holds the three files' bytes in memory while writing. Refused (UserError)
  // for a dataset without samples or one that itself reads index maps.
  void write_index_maps(const IndexMapPaths& paths) const;

  // Samples in one epoch: (tokens_in_range - 1) / seq_length; 0 when the range holds
  // fewer than seq_length + 1 tokens (get() then throws a UserError).
  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  int64_t seq_length() const { return seq_length_; }
  int64_t num_tokens() const { return num_tokens_; }  // tokens in the range
  const DocRange& range() const { return range_; }
  const std::string& name() const { return name_; }

  // Writes the seq_length + 1 tokens of global sample `sample` (>= 0) to out.
  // Thread-safe.
  void get(int64_t sample, int32_t* out) const;
  std::vector<int32_t> get(int64_t sample) const;

  // Where a global sample comes from; exposed for tests and logging.
  struct Location {
    int64_t epoch = 0;
    int64_t index_in_epoch = 0;  // position in the epoch's shuffled order
    int64_t unshuffled = 0;      // k: the sample covers epoch-stream tokens [k*T, k*T+T]
  };
  Location locate(int64_t sample) const;
  // The document (sequence) order used by an epoch.
  std::vector<int64_t> epoch_documents(int64_t epoch) const;

 private:
  struct Epoch {
    std::vector<int64_t> docs;         // sequence ids in visiting order
    std::vector<int64_t> start_doc;    // sample k starts in docs[start_doc[k]] ...
    std::vector<int32_t> start_off;    // ... at this token offset
    std::vector<int64_t> shuffle;      // shuffled position -> unshuffled sample k
  };
  GptDataset(const IndexedDataset& ds, std::shared_ptr<const IndexMaps> maps, std::string name);
  std::shared_ptr<const Epoch> epoch(int64_t e) const;
  std::shared_ptr<const Epoch> build_epoch(int64_t e) const;

  const IndexedDataset* ds_;
  DocRange range_;
  int64_t seq_length_;
  uint64_t seed_;
  std::string name_;
  int64_t num_tokens_ = 0;
  int64_t samples_per_epoch_ = 0;
  std::shared_ptr<const IndexMaps> maps_;  // set: samples come from Megatron index maps
  struct Cache {
    std::mutex mu;
    std::map<int64_t, std::shared_ptr<const Epoch>> epochs;  // at most 2
    std::vector<int64_t> order;                              // most recent last
  };
  std::unique_ptr<Cache> cache_ = std::make_unique<Cache>();  // keeps the class movable
};

}  // namespace ds::data

// Megatron's GPT index maps: the three .npy arrays Megatron's GPTDataset saves
// and reloads (--train-doc-idx-path, --train-sample-idx-path,
// --train-shuffle-idx-path in Megatron-DeepSpeed's data-efficiency scripts):
//   doc_idx     (D,)       sequence ids of the indexed dataset in visiting order;
//   sample_idx  (n + 1, 2) row k = (index into doc_idx, token offset in that
//                          document) where sample k starts; sample k runs through
//                          row k + 1's token inclusive: seq_length + 1 tokens,
//                          crossing documents, sharing its last token with k + 1;
//   shuffle_idx (n,)       dataset index -> row of sample_idx.
// Dataset index i (0 <= i < n) is the sample of row shuffle_idx[i].
//
// IndexMaps opens the three files (lib/data/npy.h: any accepted integer dtype),
// keeps them memory-mapped, and checks them against the indexed dataset and
// the sequence length in one pass, O(D + n) time and O(1) extra memory: doc ids
// inside the dataset; rows in non-decreasing document order with offsets inside
// their document (row 0 may sit at its document's end, as Megatron's row
// (0, 0) does on an empty first document); every sample exactly
// seq_length + 1 tokens (maps built for another --seq-length are refused with
// a line naming it); shuffle_idx of length n with entries in [0, n). Memory:
// the maps stay mapped (address space, paged in by the kernel as read), so
// maps of any size cost no heap. GptDataset::from_index_maps (gpt_dataset.h)
// wraps this in the interface the rest of the data pipeline uses.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lib/data/indexed_dataset.h"
#include "lib/data/npy.h"

namespace ds::data {

// Where the three arrays are (paths of .npy files).
struct IndexMapPaths {
  std::string doc_idx, sample_idx, shuffle_idx;
};

// Whether all three maps exist (true) or none does (false). Some but not all
// is a UserError naming each file when `partial_is_error`; otherwise it counts
// as none (a reader that may meet another process's write half done: the
// files are renamed into place one after another).
bool index_maps_exist(const IndexMapPaths& paths, bool partial_is_error);

class IndexMaps {
 public:
  // `ds` must outlive this object (it is held by pointer). Every problem with
  // a file is a UserError naming the file (and the row or entry at fault).
  IndexMaps(const IndexedDataset& ds, const IndexMapPaths& paths, int64_t seq_length);

  int64_t num_samples() const { return n_; }  // n: sample_idx rows - 1 (>= 1)
  int64_t seq_length() const { return seq_length_; }
  int64_t num_documents() const { return doc_.size(); }  // D, entries of doc_idx
  // Tokens of the documents doc_idx lists, a document listed twice counted twice.
  int64_t num_tokens() const { return num_tokens_; }
  // Smallest and largest + 1 of the sequence ids in doc_idx.
  int64_t min_document() const { return min_doc_; }
  int64_t end_document() const { return end_doc_; }

  int64_t document(int64_t k) const { return doc_.at(k); }  // doc_idx[k], 0 <= k < D
  int64_t row(int64_t index) const { return shuffle_.at(index); }  // shuffle_idx[index], 0 <= index < n
  // Writes the seq_length + 1 tokens of the sample starting at sample_idx row
  // `row` (0 <= row < n) to out. Thread-safe.
  void read_row(int64_t row, int32_t* out) const;

 private:
  void check_doc_idx();
  void check_sample_idx();
  void check_shuffle_idx();

  const IndexedDataset* ds_;
  int64_t seq_length_;
  NpyArray doc_, sample_, shuffle_;
  int64_t n_ = 0;
  int64_t num_tokens_ = 0;
  int64_t min_doc_ = 0, end_doc_ = 0;
};

}  // namespace ds::data

// Megatron's GPT index maps: opening, the one-pass validation, sample reads.
// A position (k, off) in the maps is token `off` of document doc_idx[k]; its
// place in the stream of doc_idx's documents laid end to end is
// tokens(doc_idx[0..k)) + off. Rows are checked in order with a cursor over
// doc_idx that only moves forward, so the whole check is O(D + n).
#include "lib/data/index_maps.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "lib/core/error.h"

namespace ds::data {

bool index_maps_exist(const IndexMapPaths& paths, bool partial_is_error) {
  namespace fs = std::filesystem;
  const bool doc = fs::exists(paths.doc_idx), sample = fs::exists(paths.sample_idx),
             shuffle = fs::exists(paths.shuffle_idx);
  if (doc && sample && shuffle) return true;
  DS_USER_CHECK(!partial_is_error || (!doc && !sample && !shuffle),
                "--train-doc-idx-path {} ({}), --train-sample-idx-path {} ({}), --train-shuffle-idx-path {} ({}): "
                "give all three of Megatron's index maps, or none of them existing (they are then written there)",
                paths.doc_idx, doc ? "exists" : "missing", paths.sample_idx, sample ? "exists" : "missing",
                paths.shuffle_idx, shuffle ? "exists" : "missing");
  return false;
}

IndexMaps::IndexMaps(const IndexedDataset& ds, const IndexMapPaths& paths, int64_t seq_length)
    : ds_(&ds), seq_length_(seq_length) {
  DS_USER_CHECK(seq_length > 0, "seq_length must be positive, got {}", seq_length);
  doc_ = NpyArray::open(paths.doc_idx, "doc_idx");
  sample_ = NpyArray::open(paths.sample_idx, "sample_idx");
  shuffle_ = NpyArray::open(paths.shuffle_idx, "shuffle_idx");
  check_doc_idx();
  check_sample_idx();
  check_shuffle_idx();
}

void IndexMaps::check_doc_idx() {
  const std::string& p = doc_.path();
  DS_USER_CHECK(doc_.ndim() == 1, "doc_idx '{}' has {} dimensions; expected a 1-d array of document ids", p,
                doc_.ndim());
  DS_USER_CHECK(doc_.size() > 0, "doc_idx '{}' is empty", p);
  const int64_t num_seq = ds_->num_sequences();
  min_doc_ = std::numeric_limits<int64_t>::max();
  int64_t max_doc = -1;
  for (int64_t k = 0; k < doc_.size(); ++k) {
    const int64_t d = doc_.at(k);
    if (d < 0 || d >= num_seq)
      DS_USER_ERROR("doc_idx '{}': entry {} = {} is not a document of dataset '{}' ({} documents; maps built for "
                    "another dataset?)", p, k, d, ds_->prefix(), num_seq);
    min_doc_ = std::min(min_doc_, d);
    max_doc = std::max(max_doc, d);
    if (__builtin_add_overflow(num_tokens_, int64_t{ds_->sequence_length(d)}, &num_tokens_))
      DS_USER_ERROR("doc_idx '{}': its documents hold more than 2^63 tokens", p);
  }
  end_doc_ = max_doc + 1;
}

void IndexMaps::check_sample_idx() {
  const std::string& p = sample_.path();
  if (sample_.ndim() != 2 || sample_.shape()[1] != 2)
    DS_USER_ERROR("sample_idx '{}' has shape {}; expected (samples + 1, 2)", p,
                  sample_.ndim() == 1 ? fmt::format("({},)", sample_.shape()[0])
                                      : fmt::format("({}, {})", sample_.shape()[0], sample_.shape()[1]));
  DS_USER_CHECK(sample_.shape()[0] >= 2, "sample_idx '{}' has {} row(s): no samples", p, sample_.shape()[0]);
  n_ = sample_.shape()[0] - 1;
  const int64_t D = doc_.size(), T = seq_length_;
  int64_t cursor = 0, cum = 0;  // cum: tokens of doc_idx[0, cursor)
  int64_t prev_k = 0, prev_pos = 0;
  int64_t step = 0;  // tokens from row 0 to row 1: the seq_length the maps were built for
  for (int64_t r = 0; r <= n_; ++r) {
    const int64_t k = sample_.at(r, 0), off = sample_.at(r, 1);
    if (k < 0 || k >= D)
      DS_USER_ERROR("sample_idx '{}': row {} = ({}, {}) points outside doc_idx '{}' ({} entries)", p, r, k, off,
                    doc_.path(), D);
    if (k < prev_k)
      DS_USER_ERROR("sample_idx '{}': row {} = ({}, {}) goes back before row {} (doc_idx entry {}); rows must "
                    "advance", p, r, k, off, r - 1, prev_k);
    for (; cursor < k; ++cursor) cum += ds_->sequence_length(doc_.at(cursor));
    const int64_t doc = doc_.at(k), len = ds_->sequence_length(doc);
    // A sample's last token must exist; only row 0 (a first token) may sit at a document's end.
    if (off < 0 || off > len || (r > 0 && off == len))
      DS_USER_ERROR("sample_idx '{}': row {} = ({}, {}) has offset {} beyond document {} of '{}' ({} tokens)", p, r,
                    k, off, off, doc, ds_->prefix(), len);
    const int64_t pos = cum + off;
    if (r > 0) {
      const int64_t d = pos - prev_pos;
      if (d <= 0)
        DS_USER_ERROR("sample_idx '{}': row {} = ({}, {}) does not advance past row {}; rows must advance", p, r, k,
                      off, r - 1);
      if (r == 1) step = d;
      if (d != step)
        DS_USER_ERROR("sample_idx '{}': sample {} spans {} tokens, but sample 0 spans {}; the map is corrupt", p,
                      r - 1, d + 1, step + 1);
    }
    prev_k = k;
    prev_pos = pos;
  }
  if (step != T)  // every sample spans step + 1 tokens
    DS_USER_ERROR("index maps built for --seq-length {}, not {}: the samples of sample_idx '{}' span {} tokens, "
                  "seq_length {} needs {}", step, T, p, step + 1, T, T + 1);
}

void IndexMaps::check_shuffle_idx() {
  const std::string& p = shuffle_.path();
  DS_USER_CHECK(shuffle_.ndim() == 1, "shuffle_idx '{}' has {} dimensions; expected a 1-d array", p,
                shuffle_.ndim());
  if (shuffle_.size() != n_)
    DS_USER_ERROR("shuffle_idx '{}' has {} entries, but sample_idx '{}' holds {} samples (the files do not belong "
                  "together)", p, shuffle_.size(), sample_.path(), n_);
  for (int64_t i = 0; i < n_; ++i) {
    const int64_t j = shuffle_.at(i);
    if (j < 0 || j >= n_)
      DS_USER_ERROR("shuffle_idx '{}': entry {} = {} is outside the {} samples of sample_idx '{}'", p, i, j, n_,
                    sample_.path());
  }
}

void IndexMaps::read_row(int64_t row, int32_t* out) const {
  DS_CHECK(row >= 0 && row < n_, "sample_idx row {} outside [0, {})", row, n_);
  int64_t k = sample_.at(row, 0), off = sample_.at(row, 1);
  int64_t need = seq_length_ + 1;
  while (need > 0) {  // the validation guarantees the sample ends at row + 1, inside doc_idx
    DS_CHECK(k < doc_.size(), "sample_idx row {} runs past the end of doc_idx", row);
    const int64_t doc = doc_.at(k);
    const int64_t take = std::min<int64_t>(need, ds_->sequence_length(doc) - off);
    if (take > 0) {
      ds_->read_tokens(doc, off, take, out);
      out += take;
      need -= take;
    }
    ++k;
    off = 0;
  }
}

}  // namespace ds::data

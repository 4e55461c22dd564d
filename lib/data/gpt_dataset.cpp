// GPT sampling: Megatron's split rounding and the per-epoch doc / sample /
// shuffle indices, built lazily and cached (two epochs at most); or the
// samples of Megatron index maps, and epoch 0 saved as such maps.
#include "lib/data/gpt_dataset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <span>

#include "lib/core/atomic_file.h"
#include "lib/core/decimal.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"

namespace ds::data {

std::vector<double> parse_split_weights(const std::string& split, std::string_view what) {
  const char sep = split.find(',') != std::string::npos ? ',' : '/';
  std::vector<double> w;
  size_t start = 0;
  while (true) {
    size_t end = split.find(sep, start);
    std::string part = split.substr(start, end == std::string::npos ? std::string::npos
                                                                    : end - start);
    const std::optional<double> v = parse_decimal(part);  // plain decimals: no hex, inf, nan or spaces
    if (!v || *v < 0)
      DS_USER_ERROR("{} '{}': '{}' is not a non-negative number (expected e.g. 949,50,1)", what, split, part);
    w.push_back(*v);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (w.size() > 3)
    DS_USER_ERROR("{} '{}' has {} parts; at most 3 (train,valid,test)", what, split, w.size());
  w.resize(3, 0.0);
  if (!(w[0] + w[1] + w[2] > 0) || !std::isfinite(w[0] + w[1] + w[2]))
    DS_USER_ERROR("{} '{}' must have a positive, finite sum", what, split);
  return w;
}

namespace {

// Python's round(): nearest integer, ties to even.
int64_t round_half_even(double x) {
  double r = std::nearbyint(x);  // default rounding mode is FE_TONEAREST
  return static_cast<int64_t>(r);
}

uint64_t stream_seed(uint64_t seed, int64_t epoch, uint64_t purpose) {
  return splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch) * 4 + purpose +
                                      0x5851f42d4c957f2dull));
}

// Fisher-Yates with our own generator: the order is identical on every platform.
template <typename T>
void shuffle_in_place(std::vector<T>& v, uint64_t seed) {
  Rng rng(seed);
  for (size_t i = v.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng.below(i));
    std::swap(v[i - 1], v[j]);
  }
}

}  // namespace

std::array<int64_t, 4> split_boundaries(const std::string& split, int64_t size) {
  std::vector<double> w = parse_split_weights(split);
  const double total = w[0] + w[1] + w[2];
  std::array<int64_t, 4> b{0, 0, 0, 0};
  for (int i = 0; i < 3; ++i)
    b[i + 1] = b[i] + round_half_even(w[i] / total * static_cast<double>(size));
  const int64_t diff = b[3] - size;
  for (int i = 1; i < 4; ++i) b[i] = std::clamp<int64_t>(b[i] - diff, 0, size);
  for (int i = 1; i < 4; ++i) b[i] = std::max(b[i], b[i - 1]);
  return b;
}

SplitRanges split_documents(const std::string& split, int64_t num_documents) {
  auto b = split_boundaries(split, num_documents);
  return {{b[0], b[1]}, {b[1], b[2]}, {b[2], b[3]}};
}

GptDataset train_split_dataset(const IndexedDataset& file, const std::string& prefix, const std::string& split,
                               int64_t seq_length, uint64_t seed) {
  const SplitRanges sr = split_documents(split, file.num_sequences());
  return GptDataset(file, sr.train, seq_length, seed, "train split of '" + prefix + "'");
}

GptDataset::GptDataset(const IndexedDataset& ds, DocRange range, int64_t seq_length,
                       uint64_t seed, std::string name)
    : ds_(&ds), range_(range), seq_length_(seq_length), seed_(seed), name_(std::move(name)) {
  DS_CHECK(range.begin >= 0 && range.begin <= range.end && range.end <= ds.num_sequences(),
           "{} range [{}, {}) outside dataset of {} sequences", name_, range.begin, range.end,
           ds.num_sequences());
  DS_USER_CHECK(seq_length > 0, "seq_length must be positive, got {}", seq_length);
  for (int64_t i = range.begin; i < range.end; ++i) num_tokens_ += ds.sequence_length(i);
  samples_per_epoch_ = num_tokens_ > 0 ? (num_tokens_ - 1) / seq_length_ : 0;
}

GptDataset::GptDataset(const IndexedDataset& ds, std::shared_ptr<const IndexMaps> maps, std::string name)
    : ds_(&ds), range_{maps->min_document(), maps->end_document()}, seq_length_(maps->seq_length()), seed_(0),
      name_(std::move(name)), num_tokens_(maps->num_tokens()), samples_per_epoch_(maps->num_samples()),
      maps_(std::move(maps)) {}

GptDataset GptDataset::from_index_maps(const IndexedDataset& ds, const IndexMapPaths& paths, int64_t seq_length,
                                       std::string name) {
  return GptDataset(ds, std::make_shared<const IndexMaps>(ds, paths, seq_length), std::move(name));
}

std::shared_ptr<const GptDataset::Epoch> GptDataset::build_epoch(int64_t e) const {
  auto ep = std::make_shared<Epoch>();
  ep->docs.resize(static_cast<size_t>(range_.size()));
  for (int64_t i = 0; i < range_.size(); ++i) ep->docs[i] = range_.begin + i;
  shuffle_in_place(ep->docs, stream_seed(seed_, e, 1));

  // Sample k starts at stream position k * seq_length. Positions are stored as
  // (index into docs, offset) with offset < that document's length, so empty
  // documents are skipped and a position never sits at a document's end.
  const int64_t n = samples_per_epoch_;
  ep->start_doc.resize(n);
  ep->start_off.resize(n);
  int64_t di = 0, off = 0;
  auto len_at = [&](int64_t d) { return static_cast<int64_t>(ds_->sequence_length(ep->docs[d])); };
  while (di < range_.size() && len_at(di) == 0) ++di;
  for (int64_t k = 0; k < n; ++k) {
    ep->start_doc[k] = di;
    ep->start_off[k] = static_cast<int32_t>(off);
    int64_t remaining = seq_length_;
    while (true) {
      const int64_t avail = len_at(di) - off;
      if (remaining < avail) {
        off += remaining;
        break;
      }
      remaining -= avail;
      off = 0;
      ++di;
      // Only reachable past the last sample's start; stop before reading past the end.
      if (di >= range_.size()) break;
      if (remaining == 0 && len_at(di) > 0) break;
    }
  }
  ep->shuffle.resize(n);
  for (int64_t k = 0; k < n; ++k) ep->shuffle[k] = k;
  shuffle_in_place(ep->shuffle, stream_seed(seed_, e, 2));
  return ep;
}

std::shared_ptr<const GptDataset::Epoch> GptDataset::epoch(int64_t e) const {
  Cache& c = *cache_;
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.epochs.find(e);
  if (it != c.epochs.end()) {
    c.order.erase(std::find(c.order.begin(), c.order.end(), e));
    c.order.push_back(e);
    return it->second;
  }
  auto ep = build_epoch(e);
  if (c.order.size() >= 2) {
    c.epochs.erase(c.order.front());
    c.order.erase(c.order.begin());
  }
  c.epochs[e] = ep;
  c.order.push_back(e);
  return ep;
}

GptDataset::Location GptDataset::locate(int64_t sample) const {
  if (samples_per_epoch_ == 0)
    DS_USER_ERROR("{} split of {} has {} tokens, fewer than seq_length+1 = {}; use more data or "
                  "change --split", name_, ds_->prefix(), num_tokens_, seq_length_ + 1);
  DS_CHECK(sample >= 0, "negative sample index {}", sample);
  Location loc;
  loc.epoch = sample / samples_per_epoch_;
  loc.index_in_epoch = sample % samples_per_epoch_;
  loc.unshuffled = maps_ ? maps_->row(loc.index_in_epoch) : epoch(loc.epoch)->shuffle[loc.index_in_epoch];
  return loc;
}

std::vector<int64_t> GptDataset::epoch_documents(int64_t e) const {
  if (!maps_) return epoch(e)->docs;
  std::vector<int64_t> docs(static_cast<size_t>(maps_->num_documents()));
  for (size_t k = 0; k < docs.size(); ++k) docs[k] = maps_->document(static_cast<int64_t>(k));
  return docs;
}

void GptDataset::get(int64_t sample, int32_t* out) const {
  const Location loc = locate(sample);
  if (maps_) {
    maps_->read_row(loc.unshuffled, out);
    return;
  }
  auto ep = epoch(loc.epoch);
  int64_t di = ep->start_doc[loc.unshuffled];
  int64_t off = ep->start_off[loc.unshuffled];
  int64_t need = seq_length_ + 1;
  while (need > 0) {
    DS_CHECK(di < static_cast<int64_t>(ep->docs.size()), "sample {} of {} runs past the epoch",
             sample, name_);
    const int64_t doc = ep->docs[di];
    const int64_t take = std::min<int64_t>(need, ds_->sequence_length(doc) - off);
    if (take > 0) ds_->read_tokens(doc, off, take, out);
    out += std::max<int64_t>(take, 0);
    need -= std::max<int64_t>(take, 0);
    ++di;
    off = 0;
  }
}

std::vector<int32_t> GptDataset::get(int64_t sample) const {
  std::vector<int32_t> v(static_cast<size_t>(seq_length_ + 1));
  get(sample, v.data());
  return v;
}

namespace {

// `values` as a .npy file of int32 when every value fits, else int64.
std::string narrowest_npy(const std::vector<int64_t>& values, std::span<const int64_t> shape) {
  const bool fits = std::all_of(values.begin(), values.end(), [](int64_t v) {
    return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
  });
  if (!fits) return npy_file_bytes(std::span<const int64_t>(values), shape);
  return npy_file_bytes(std::vector<int32_t>(values.begin(), values.end()), shape);
}

}  // namespace

void GptDataset::write_index_maps(const IndexMapPaths& paths) const {
  DS_USER_CHECK(!maps_, "{} reads index maps already; copy its .npy files instead of writing them again", name_);
  const int64_t n = samples_per_epoch_;
  DS_USER_CHECK(n > 0, "{} has {} tokens, fewer than one sample of {}: no index maps to write", name_, num_tokens_,
                seq_length_ + 1);
  auto ep = epoch(0);
  const int64_t D = static_cast<int64_t>(ep->docs.size());
  StagedFiles files;
  files.stage(paths.doc_idx, narrowest_npy(ep->docs, std::array<int64_t, 1>{D}));

  // Rows 0..n-1 are the samples' starts; row n is the last sample's last token,
  // seq_length tokens after its start (it lies inside the epoch: the stream
  // holds at least n * seq_length + 1 tokens).
  std::vector<int64_t> rows(static_cast<size_t>(2 * (n + 1)));
  for (int64_t k = 0; k < n; ++k) {
    rows[2 * k] = ep->start_doc[k];
    rows[2 * k + 1] = ep->start_off[k];
  }
  int64_t di = ep->start_doc[n - 1], off = ep->start_off[n - 1], remaining = seq_length_;
  while (true) {
    const int64_t avail = ds_->sequence_length(ep->docs[di]) - off;
    if (remaining < avail) {
      off += remaining;
      break;
    }
    remaining -= avail;
    off = 0;
    ++di;
    DS_CHECK(di < D, "the last sample of {} runs past its epoch", name_);
  }
  rows[2 * n] = di;
  rows[2 * n + 1] = off;
  files.stage(paths.sample_idx, narrowest_npy(rows, std::array<int64_t, 2>{n + 1, 2}));
  rows = {};

  // Megatron's _build_shuffle_idx: uint32 unless the count reaches uint32's max - 1.
  const std::array<int64_t, 1> shape{n};
  if (n < int64_t{std::numeric_limits<uint32_t>::max()} - 1)
    files.stage(paths.shuffle_idx,
                npy_file_bytes(std::vector<uint32_t>(ep->shuffle.begin(), ep->shuffle.end()), shape));
  else
    files.stage(paths.shuffle_idx, npy_file_bytes(std::span<const int64_t>(ep->shuffle), shape));
  files.commit();
}

}  // namespace ds::data

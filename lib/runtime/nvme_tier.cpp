// The NVMe tier of the optimizer state: sub-groups in a swap file, read
// ahead and written behind through buffer sets (nvme_tier.h).
#include "lib/runtime/nvme_tier.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "lib/core/error.h"

namespace ds {

namespace {

int64_t sub_group_of(const NvmeTierOptions& o, int64_t numel) {
  return std::max<int64_t>(1, std::min(o.sub_group_size, numel));
}

int64_t aligned_tile(int64_t sub) { return (sub * 4 + kAioAlign - 1) / kAioAlign * kAioAlign; }

int sets_of(const NvmeTierOptions& o, int states, int64_t numel) {
  const int64_t groups = (numel + sub_group_of(o, numel) - 1) / sub_group_of(o, numel);
  return static_cast<int>(std::clamp<int64_t>(o.buffer_count / std::max(states, 1), 1, std::max<int64_t>(groups, 1)));
}

}  // namespace

int64_t NvmeStateTier::host_bytes_for(const NvmeTierOptions& o, int states, int64_t numel) {
  if (states == 0 || numel == 0) return 0;
  return sets_of(o, states, numel) * states * aligned_tile(sub_group_of(o, numel));
}

int64_t NvmeStateTier::file_bytes_for(const NvmeTierOptions& o, int states, int64_t numel) {
  if (states == 0 || numel == 0) return 0;
  const int64_t sub = sub_group_of(o, numel);
  return (numel + sub - 1) / sub * states * aligned_tile(sub);
}

NvmeStateTier::NvmeStateTier(const NvmeTierOptions& o, std::vector<float> initial, int64_t numel)
    : opt_(o), initial_(std::move(initial)), numel_(numel) {
  DS_CHECK(numel > 0 && !initial_.empty() && o.sub_group_size > 0 && o.buffer_count >= 0,
           "NVMe tier of {} elements, {} states, sub-group {}", numel, initial_.size(), o.sub_group_size);
  sub_ = sub_group_of(o, numel);
  sets_ = sets_of(o, n_states(), numel);
  for (int s = 0; s < sets_; ++s) buffers_.emplace_back(stride());
  file_ = std::make_unique<SwapFile>(o.dir, o.name, o.aio);
  // Every sub-group starts at the initial values: one buffer set filled once
  // and written to each sub-group's place.
  char* b = set(0);
  for (int i = 0; i < n_states(); ++i) {
    float* t = reinterpret_cast<float*>(b + i * tile_bytes());
    std::fill(t, t + tile_bytes() / 4, initial_[i]);
  }
  for (int g = 0; g < n_sub_groups(); ++g) file_->write(offset(g), b, stride());
  file_->wait_all();
}

NvmeStateTier::~NvmeStateTier() = default;

void NvmeStateTier::set_read_only_tail(int n) {
  DS_CHECK(n >= 0 && n < n_states(), "NVMe tier: {} read-only states of {}", n, n_states());
  read_only_tail_ = n;
}

int64_t NvmeStateTier::tile_bytes() const { return aligned_tile(sub_); }

char* NvmeStateTier::set(int s) const { return static_cast<char*>(buffers_[s].data()); }

int64_t NvmeStateTier::host_bytes() const {
  int64_t b = 0;
  for (const AlignedBuffer& a : buffers_) b += a.size();
  return b;
}

void NvmeStateTier::for_each(const SubGroupFn& fn, bool write_back) {
  const int n = n_sub_groups();
  const bool ahead = pipelined_read(), behind = pipelined_write() && write_back;
  std::vector<SwapFile::Ticket> reads(n, -1);
  std::vector<std::optional<SwapFile::Ticket>> writing(sets_);  // each set's write in flight
  auto issue_read = [&](int g) {
    const int s = g % sets_;
    if (writing[s]) {  // the set's previous sub-group must be on disk before the set is refilled
      file_->wait(*writing[s]);
      writing[s].reset();
    }
    reads[g] = file_->read(offset(g), set(s), stride());
  };
  try {
    for (int g = 0; g < n; ++g) {
      if (reads[g] < 0) issue_read(g);
      if (ahead && g + 1 < n) issue_read(g + 1);
      file_->wait(reads[g]);
      const int64_t lo = g * sub_, hi = std::min(numel_, lo + sub_);
      std::vector<Tensor> states;
      for (int i = 0; i < n_states(); ++i)
        states.push_back(Tensor::from_blob(set(g % sets_) + i * tile_bytes(), {hi - lo}, DType::F32));
      fn(lo, hi, states);
      if (!write_back) continue;
      const SwapFile::Ticket w = file_->write(offset(g), set(g % sets_), stride() - read_only_tail_ * tile_bytes());
      if (behind)
        writing[g % sets_] = w;
      else
        file_->wait(w);
    }
    for (auto& w : writing)
      if (w) file_->wait(*w);
  } catch (...) {
    try {  // nothing in flight into the buffers when the error leaves
      file_->wait_all();
    } catch (...) {
    }
    throw;
  }
}

// The 4 KiB-aligned byte span of state i's tile in sub-group g that holds
// elements [a, b) of the range (inside the sub-group): its file offset, its
// length, and where element a sits in it.
NvmeStateTier::Span NvmeStateTier::span(int i, int g, int64_t a, int64_t b) const {
  const int64_t g_lo = static_cast<int64_t>(g) * sub_;
  const int64_t first = (a - g_lo) * 4, last = (b - g_lo) * 4;
  const int64_t from = first / kAioAlign * kAioAlign, to = (last + kAioAlign - 1) / kAioAlign * kAioAlign;
  return {offset(g) + i * tile_bytes() + from, to - from, first - from};
}

void NvmeStateTier::for_each_span(const char* what, int i, int64_t lo, int64_t hi, const SpanFn& fn) {
  DS_CHECK(i >= 0 && i < n_states() && 0 <= lo && lo <= hi && hi <= numel_, "NVMe tier {} of state {} [{}, {})", what,
           i, lo, hi);
  for (int64_t at = lo; at < hi;) {
    const int g = static_cast<int>(at / sub_);
    const int64_t end = std::min({hi, (g + 1) * sub_, numel_});
    const Span sp = span(i, g, at, end);
    fn(at - lo, end - at, sp, bounce(sp.bytes));
    at = end;
  }
}

void NvmeStateTier::read(int i, int64_t lo, int64_t hi, float* out) {
  for_each_span("read", i, lo, hi, [&](int64_t pos, int64_t n, const Span& sp, char* buf) {
    file_->wait(file_->read(sp.offset, buf, sp.bytes));
    std::memcpy(out + pos, buf + sp.skip, n * 4);
  });
}

void NvmeStateTier::write(int i, int64_t lo, int64_t hi, const float* in) {
  for_each_span("write", i, lo, hi, [&](int64_t pos, int64_t n, const Span& sp, char* buf) {
    if (sp.skip != 0 || n * 4 != sp.bytes)  // the span's other elements are kept: read them first
      file_->wait(file_->read(sp.offset, buf, sp.bytes));
    std::memcpy(buf + sp.skip, in + pos, n * 4);
    file_->wait(file_->write(sp.offset, buf, sp.bytes));
  });
}

// read() and write() go through buffer set 0 (at least one tile of every
// state, so any span fits); for_each is not running then.
char* NvmeStateTier::bounce(int64_t bytes) const {
  DS_CHECK(bytes <= stride(), "NVMe tier: a span of {} bytes in a buffer set of {}", bytes, stride());
  return set(0);
}

}  // namespace ds

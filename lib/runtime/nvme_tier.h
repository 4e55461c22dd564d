// The NVMe tier of a ZeRO range's optimizer state (ZeRO-Infinity's
// `offload_optimizer.device: nvme`): the state tensors (Adam's exp_avg and
// exp_avg_sq, ...) live in one swap file per rank under nvme_path, and host
// memory holds only the buffers of the sub-groups being worked on.
//
// The range is cut into sub-groups of sub_group_size elements (DeepSpeed's
// tile of the optimizer step). The file holds them one after the other,
// each sub-group's states side by side (block aligned), so a sub-group is
// one read and one write. for_each() walks the sub-groups in order: reads a
// sub-group's states into a buffer set, hands them to the update, writes
// them back. With pipeline_read the next sub-group's read is in flight
// while the update runs; with pipeline_write a sub-group's write goes on
// while the next ones are updated. Neither changes a value: the update of
// each sub-group sees exactly the state the last write put there.
//
// Buffers: buffer_count (DeepSpeed's key) counts state-tensor buffers of
// one sub-group each; a buffer set is one per state, so buffer_count /
// states sets exist (at least one). Pipelining needs two sets; with one it
// runs unpipelined (the trainer says so).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/tensor.h"
#include "lib/io/aio.h"

namespace ds {

struct NvmeTierOptions {
  std::string dir;   // nvme_path
  std::string name;  // the swap file's name (unlinked at creation)
  AioConfig aio;
  int64_t sub_group_size = 1000000000;
  int buffer_count = 4;
  bool pipeline_read = false, pipeline_write = false;
};

class NvmeStateTier {
 public:
  // initial.size() state tensors of `numel` f32 elements, every element of
  // state i starting at initial[i] (written to the file here). UserError
  // naming nvme_path when the file cannot be made or written (lib/io/aio.h).
  NvmeStateTier(const NvmeTierOptions& o, std::vector<float> initial, int64_t numel);
  ~NvmeStateTier();
  NvmeStateTier(const NvmeStateTier&) = delete;
  NvmeStateTier& operator=(const NvmeStateTier&) = delete;

  int64_t numel() const { return numel_; }
  int n_states() const { return static_cast<int>(initial_.size()); }
  int64_t sub_group() const { return sub_; }
  int n_sub_groups() const { return static_cast<int>((numel_ + sub_ - 1) / sub_); }
  int buffer_sets() const { return sets_; }
  // Whether reads run ahead / writes behind (asked for, and two buffer sets).
  bool pipelined_read() const { return opt_.pipeline_read && sets_ >= 2; }
  bool pipelined_write() const { return opt_.pipeline_write && sets_ >= 2; }

  // fn(lo, hi, states) for every sub-group [lo, hi) of the range in order,
  // with its states as host f32 tensors of hi - lo elements; written back
  // afterwards when write_back (all but the read-only last states).
  using SubGroupFn = std::function<void(int64_t lo, int64_t hi, const std::vector<Tensor>& states)>;
  void for_each(const SubGroupFn& fn, bool write_back);
  // The last n states are read by for_each but never written back by it (the
  // gradient shard: the update reads it, the reductions write it).
  void set_read_only_tail(int n);
  // Elements [lo, hi) of state i to / from caller memory (checkpoints, the
  // parameter pieces of ZeRO-3 gathers): per sub-group one read (and, for a
  // write that covers part of a 4 KiB block, one read first) of the aligned
  // span that holds them. Synchronous; not during for_each.
  void read(int i, int64_t lo, int64_t hi, float* out);
  void write(int i, int64_t lo, int64_t hi, const float* in);

  // Host bytes of the buffers; bytes of the swap file.
  int64_t host_bytes() const;
  int64_t file_bytes() const { return static_cast<int64_t>(n_sub_groups()) * stride(); }
  // What a tier of these options holds for a range of `numel` elements and
  // `states` state tensors (--estimate-memory): host buffer bytes, file bytes.
  static int64_t host_bytes_for(const NvmeTierOptions& o, int states, int64_t numel);
  static int64_t file_bytes_for(const NvmeTierOptions& o, int states, int64_t numel);

 private:
  int64_t tile_bytes() const;  // one state of one sub-group, block aligned
  int64_t stride() const { return tile_bytes() * n_states(); }
  int64_t offset(int g) const { return static_cast<int64_t>(g) * stride(); }
  char* set(int s) const;
  struct Span {
    int64_t offset, bytes, skip;
  };
  Span span(int i, int g, int64_t a, int64_t b) const;
  // fn(position in [lo, hi), elements, span, bounce buffer) for the span of
  // each sub-group [lo, hi) of state i touches.
  using SpanFn = std::function<void(int64_t pos, int64_t n, const Span& sp, char* buf)>;
  void for_each_span(const char* what, int i, int64_t lo, int64_t hi, const SpanFn& fn);
  char* bounce(int64_t bytes) const;
  NvmeTierOptions opt_;
  std::vector<float> initial_;
  int64_t numel_ = 0, sub_ = 1;
  int sets_ = 1;
  int read_only_tail_ = 0;
  std::vector<AlignedBuffer> buffers_;  // one per set; declared before the file, which drains first
  std::unique_ptr<SwapFile> file_;
};

}  // namespace ds

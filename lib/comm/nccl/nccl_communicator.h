// NcclCommunicator: the CUDA backend (built only when the CUDA toolkit is
// found; the factory in communicator.cpp refers to it under DS_WITH_NCCL).
// One ncclComm_t per group; the group's member 0 makes the ncclUniqueId and
// publishes it through the TcpStore.
// Blocking ops are stream-ordered: enqueued on the communicator's stream
// (stream(), set_stream; the compute stream) and returned from without a
// host wait, so a later kernel or copy on that stream sees the result and
// the host keeps running ahead of the GPU. A dead peer still cannot hang the
// rank: the world's NcclWatchdog (nccl_watchdog.h) tracks every op by an
// event with its DS_COMM_TIMEOUT deadline and ncclCommGetAsyncError, and on
// a failure ends the process with one line naming the op, the group and the
// rank (or, with DS_NCCL_WATCHDOG_EXIT=0, aborts the communicators and the
// training thread throws that error where it next touches a group).
// DS_NCCL_BLOCKING_WAIT=1 turns the watchdog off and restores the host poll
// after every blocking op (stream query, ncclCommGetAsyncError and the
// deadline checked in turn; an error or timeout aborts and throws): slower,
// for debugging. barrier() and synchronize() always wait on the host.
// Asynchronous ops (submit and the i* forms): the group's own communication
// stream (non-blocking, created on first use) waits on an event recorded on
// the compute stream, the op is enqueued there, and an event recorded after
// it is the handle: wait() makes the compute stream wait on it (no host
// block); wait_host() polls it. The tensors passed as `uses` are declared to
// the caching allocator (record_stream_use), so a block freed while the
// communication stream may still read it is not reused before it finished.
// A blocking op issued after async ones first makes its stream wait on the
// last async event, so NCCL sees every op of the group in issue order.
// This header stays free of CUDA/NCCL headers.
#pragma once
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/comm/nccl/nccl_watchdog.h"

namespace ds {

// Number of visible CUDA devices; 0 with `why` set when there is none or the
// CUDA runtime cannot start (no driver). For tests and the factory.
int cuda_device_count(std::string* why);

class NcclCommunicator : public Communicator {
 public:
  // The world group; `store` may be null only when size == 1. Selects device
  // local_rank % device_count (cudaSetDevice) before creating the comm.
  static std::unique_ptr<NcclCommunicator> create_world(
      std::shared_ptr<TcpStore> store, int rank, int size, int local_rank,
      std::chrono::milliseconds op_timeout = std::chrono::seconds(1800));
  ~NcclCommunicator() override;

  Backend backend() const override { return Backend::Nccl; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  const std::string& name() const override { return name_; }
  TcpStore* store() const override { return store_.get(); }
  int device() const { return device_; }

  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::all_to_all;
  using Communicator::broadcast;
  using Communicator::recv;
  using Communicator::reduce_scatter;
  using Communicator::send;
  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) override;
  void reduce_scatter(const void* input, void* output, int64_t count_per_rank, DType dtype,
                      ReduceOp op) override;
  void all_gather(const void* input, void* output, int64_t count_per_rank, DType dtype) override;
  void all_to_all(const void* input, void* output, int64_t count_per_rank, DType dtype) override;
  void broadcast(void* data, int64_t count, DType dtype, int root) override;
  void send(const void* data, int64_t count, DType dtype, int dst) override;
  void recv(void* data, int64_t count, DType dtype, int src) override;
  void barrier() override;  // an all_reduce of one float, then a host wait for it (a host barrier)
  // All sends and receives inside one ncclGroupStart/End (so matching batches
  // of two peers complete in any posting order), stream-ordered. Within a
  // batch, channel 0 messages are posted before channel 1 ones; NCCL keeps
  // one in-order stream per pair and direction, so the channels of one
  // direction are matched in that order (see the .cpp).
  void batch_send_recv(const std::vector<P2POp>& ops) override;
  std::unique_ptr<Communicator> split(const std::vector<int>& ranks,
                                      const std::string& tag) override;

  void set_stream(Stream s) override { stream_ = s; }
  Stream stream() const override { return stream_; }
  void synchronize() override;  // host wait for the stream and the async ops (counted)
  void raise_if_failed() override;  // the watchdog's error, if any (see above)
  bool watchdog_guarded() const override { return watchdog_ != nullptr; }
  NcclWatchdog* watchdog() const { return watchdog_.get(); }  // null with DS_NCCL_BLOCKING_WAIT=1

  CommHandle submit(const char* what, std::function<void()> op, std::vector<Tensor> uses = {}) override;
  void wait_all() override;
  // The stream asynchronous ops run on (cudaStream_t; null before the first
  // submit): inside a submitted op, work enqueued there runs with the op.
  void* comm_stream() const { return comm_stream_; }
  // Polls event `ev` (a cudaEvent_t) like a blocking op waits for its stream.
  void wait_event_host(void* ev, const char* what);

 protected:
  DeviceType device_type() const override { return DeviceType::CUDA; }

 private:
  class Enqueue;  // the group's lock and the enqueue clock around one op's NCCL calls
  // After an op was enqueued on `stream`: nothing inside submit(), else the
  // watchdog tracks it, or (DS_NCCL_BLOCKING_WAIT=1) the host polls it.
  void finish(const char* what, void* stream);
  void poll(const char* what, void* stream, void* event);  // host wait; one of the two is set
  void* op_stream();  // the stream an op is enqueued on, ordered after the async ops
  void* take_op_start();
  NcclCommunicator() = default;
  void init_comm();  // unique id through the store, then ncclCommInitRank
  void check(int result, const char* what);

  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<NcclGroupState> gs_;     // the ncclComm_t, shared with the watchdog
  std::shared_ptr<NcclWatchdog> watchdog_;  // the world's, shared by its groups; null: blocking wait
  float* scratch_ = nullptr;  // device float for barrier()
  Stream stream_;
  void* comm_stream_ = nullptr;  // cudaStream_t of the async ops
  void* last_async_ = nullptr;   // cudaEvent_t after the latest async op (owned)
  void* ordered_after_ = nullptr;  // last_async_ value stream_ was last ordered after
  bool in_submit_ = false;
  void* op_start_ = nullptr;  // the watchdog's start event of the op being enqueued (op_stream -> finish)
  int device_ = 0;
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_ = 0, size_ = 1;
  std::chrono::milliseconds op_timeout_{std::chrono::seconds(1800)};
  std::set<std::string> used_tags_;
};

}  // namespace ds

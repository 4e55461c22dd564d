// NCCL backend: the only file of lib/comm that calls NCCL (through the
// run-time loaded table of nccl_api.h) or the CUDA runtime. CUDA and NCCL
// errors go through the one check-macro family (cuda/core/check.h,
// DS_NCCL_CHECK in nccl_api.h).
#include "lib/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "lib/comm/group_util.h"
#include "lib/comm/nccl/nccl_api.h"
#include "lib/comm/tcp_store.h"
#include "lib/core/error.h"
#include "lib/core/stream_use.h"
#include "lib/core/sync_counter.h"

namespace ds {
namespace {

ncclComm_t as_comm(void* p) { return static_cast<ncclComm_t>(p); }
cudaStream_t as_stream(Stream s) { return static_cast<cudaStream_t>(s.handle); }

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    default: break;
  }
  DS_THROW("NCCL cannot reduce dtype {}", dtype_name(t));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

// A 0/1 environment switch; `fallback` when unset or empty.
bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const std::string s(v);
  DS_USER_CHECK(s == "0" || s == "1", "environment variable {}='{}' must be 0 or 1", name, s);
  return s == "1";
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// Around the NCCL calls of one op: the group's lock (so the watchdog never
// aborts the communicator under a running call) and the enqueue clock (so a
// call that never returns is reported as a timeout). The watchdog's failure
// is checked first: nothing is enqueued on a failed world.
class NcclCommunicator::Enqueue {
 public:
  Enqueue(NcclCommunicator& c, const char* what) : c_(c) {
    c.raise_if_failed();
    lk_ = std::unique_lock<std::mutex>(c.gs_->mu);
    DS_CHECK(c.gs_->comm, "NCCL {} on group '{}' after the communicator was aborted", what, c.name_);
    c.gs_->enqueue_what.store(what);
    c.gs_->enqueue_since_ns.store(steady_ns(), std::memory_order_release);
  }
  ~Enqueue() { c_.gs_->enqueue_since_ns.store(0, std::memory_order_release); }
  ncclComm_t comm() const { return as_comm(c_.gs_->comm); }

 private:
  NcclCommunicator& c_;
  std::unique_lock<std::mutex> lk_;
};

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = fmt::format("cudaGetDeviceCount failed: {}", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device visible";
  return n;
}

void NcclCommunicator::check(int result, const char* what) {
  auto r = static_cast<ncclResult_t>(result);
  if (r == ncclSuccess) return;
  void* comm = gs_ ? gs_->comm : nullptr;  // callers hold the group's lock
  const char* last = nccl().GetLastError(as_comm(comm));
  DS_THROW("NCCL {} on group '{}' (rank {} of {}, device {}) failed: {}{}{}", what, name_, rank_,
           size_, device_, nccl().GetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_world(std::shared_ptr<TcpStore> store,
                                                                 int rank, int size,
                                                                 int local_rank,
                                                                 std::chrono::milliseconds op_timeout) {
  std::string why;
  int n = cuda_device_count(&why);
  DS_USER_CHECK(n > 0, "rank {}: the NCCL backend needs a CUDA device ({})", rank, why);
  // One GPU per rank: NCCL refuses two ranks on one device ("duplicate GPU").
  DS_USER_CHECK(local_rank >= 0 && local_rank < n,
                "rank {}: LOCAL_RANK {} but only {} CUDA device(s) are visible (CUDA_VISIBLE_DEVICES); the NCCL "
                "backend runs one rank per GPU, so start at most {} rank(s) on this node",
                rank, local_rank, n, n);
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->store_ = std::move(store);
  c->rank_ = rank;
  c->size_ = size;
  c->name_ = "world";
  c->device_ = local_rank % n;
  c->op_timeout_ = op_timeout;
  for (int r = 0; r < size; ++r) c->world_ranks_.push_back(r);
  DS_CUDA_CHECK(cudaSetDevice(c->device_));
  DS_CHECK(size == 1 || c->store_, "an NCCL world of {} ranks needs a store", size);
  // Read before any NCCL work, so a malformed value is a user error at start-up.
  const bool blocking_wait = env_flag("DS_NCCL_BLOCKING_WAIT", false);
  const bool exit_process = env_flag("DS_NCCL_WATCHDOG_EXIT", true);
  if (!blocking_wait) c->watchdog_ = std::make_shared<NcclWatchdog>(c->device_, exit_process);
  c->init_comm();
  return c;
}

void NcclCommunicator::init_comm() {
  ncclUniqueId id;
  std::string key = "nccl/" + name_ + "/unique_id";
  if (rank_ == 0) {
    DS_NCCL_CHECK(nccl().GetUniqueId(&id));
    if (size_ > 1) store_->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } else {
    std::string v = store_->get(key);
    DS_CHECK(v.size() == sizeof(id), "store value '{}' has {} bytes, expected {}", key, v.size(),
             sizeof(id));
    std::memcpy(&id, v.data(), sizeof(id));
  }
  DS_CUDA_CHECK(cudaSetDevice(device_));
  gs_ = std::make_shared<NcclGroupState>();
  gs_->name = name_;
  gs_->rank = rank_;
  gs_->size = size_;
  gs_->device = device_;
  gs_->timeout = op_timeout_;
  // Watched from before its creation: the enqueue clock bounds a bootstrap
  // that never completes (a peer lost before it joined).
  if (watchdog_) watchdog_->add_group(gs_);
  ncclComm_t comm = nullptr;
  gs_->enqueue_what.store("ncclCommInitRank");
  gs_->enqueue_since_ns.store(steady_ns(), std::memory_order_release);
  const ncclResult_t r = nccl().CommInitRank(&comm, size_, id, rank_);
  gs_->enqueue_since_ns.store(0, std::memory_order_release);
  check(r, "ncclCommInitRank");
  {
    std::lock_guard<std::mutex> lk(gs_->mu);
    gs_->comm = comm;
  }
  DS_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
}

// Ops may still be queued (they are stream-ordered). On a normal destruction
// they are waited for while the watchdog still watches them (ncclCommDestroy
// would flush them unwatched); while an exception unwinds, or after a
// failure, peers may have given up, so the communicator is aborted instead
// of flushed, and first: an NCCL kernel still waiting for them would
// otherwise block the cudaFree below (it synchronises the device) forever,
// with the watchdog no longer watching the group.
NcclCommunicator::~NcclCommunicator() {
  if (watchdog_) watchdog_->release(take_op_start());
  const bool unwinding = std::uncaught_exceptions() > 0;
  const bool healthy = gs_ && gs_->comm && !(watchdog_ && watchdog_->failed());
  if (healthy && !unwinding) {
    cudaStreamSynchronize(as_stream(stream_));
    if (comm_stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(comm_stream_));
  }
  if (gs_) {
    std::lock_guard<std::mutex> lk(gs_->mu);
    if (gs_->comm) {
      if (healthy && !unwinding) nccl().CommDestroy(as_comm(gs_->comm));
      else nccl().CommAbort(as_comm(gs_->comm));
    }
    gs_->comm = nullptr;
  }
  if (watchdog_ && gs_) watchdog_->remove_group(gs_.get());
  if (last_async_) cudaEventDestroy(static_cast<cudaEvent_t>(last_async_));
  if (comm_stream_) cudaStreamDestroy(static_cast<cudaStream_t>(comm_stream_));
  if (scratch_) cudaFree(scratch_);
}

std::unique_ptr<Communicator> NcclCommunicator::split(const std::vector<int>& ranks,
                                                      const std::string& tag) {
  int me = validate_group(ranks, tag, rank_, size_, name_);
  DS_CHECK(used_tags_.insert(tag).second, "split tag '{}' already used on group '{}'", tag, name_);
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->store_ = store_;
  c->name_ = name_ + "/" + tag;
  c->rank_ = me;
  c->size_ = static_cast<int>(ranks.size());
  c->device_ = device_;
  c->op_timeout_ = op_timeout_;
  c->stream_ = stream_;
  c->watchdog_ = watchdog_;
  for (int r : ranks) c->world_ranks_.push_back(world_ranks_[r]);
  if (c->size_ > 1) {
    DS_CHECK(store_, "group '{}' needs the store", c->name_);
    agree_on_members(*store_, c->name_, me, c->world_ranks_);
  }
  c->init_comm();
  return c;
}

void NcclCommunicator::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  void* st = op_stream();
  {
    Enqueue q(*this, "all_reduce");
    check(nccl().AllReduce(data, data, count, nccl_type(dtype), nccl_op(op), q.comm(), static_cast<cudaStream_t>(st)),
          "all_reduce");
  }
  finish("all_reduce", st);
}

void NcclCommunicator::reduce_scatter(const void* input, void* output, int64_t count_per_rank,
                                      DType dtype, ReduceOp op) {
  if (count_per_rank == 0) return;
  void* st = op_stream();
  {
    Enqueue q(*this, "reduce_scatter");
    check(nccl().ReduceScatter(input, output, count_per_rank, nccl_type(dtype), nccl_op(op), q.comm(),
                               static_cast<cudaStream_t>(st)), "reduce_scatter");
  }
  finish("reduce_scatter", st);
}

void NcclCommunicator::all_gather(const void* input, void* output, int64_t count_per_rank,
                                  DType dtype) {
  size_t bytes = count_per_rank * dtype_size(dtype);
  if (bytes == 0) return;
  void* st = op_stream();
  {
    Enqueue q(*this, "all_gather");
    check(nccl().AllGather(input, output, bytes, ncclUint8, q.comm(), static_cast<cudaStream_t>(st)), "all_gather");
  }
  finish("all_gather", st);
}

// NCCL has no all-to-all: one send and one receive per peer inside a group
// (the local chunk is a device copy on the stream).
void NcclCommunicator::all_to_all(const void* input, void* output, int64_t count_per_rank, DType dtype) {
  const size_t bytes = count_per_rank * dtype_size(dtype);
  if (bytes == 0) return;
  cudaStream_t st = static_cast<cudaStream_t>(op_stream());
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  DS_CUDA_CHECK(cudaMemcpyAsync(out + rank_ * bytes, in + rank_ * bytes, bytes, cudaMemcpyDeviceToDevice,
                                st));
  if (size_ > 1) {
    Enqueue q(*this, "all_to_all");
    check(nccl().GroupStart(), "all_to_all group start");
    // Errors inside the group are reported after ncclGroupEnd, which must
    // always follow ncclGroupStart.
    ncclResult_t first = ncclSuccess;
    for (int p = 0; p < size_ && first == ncclSuccess; ++p) {
      if (p == rank_) continue;
      first = nccl().Send(in + p * bytes, bytes, ncclUint8, p, q.comm(), st);
      if (first == ncclSuccess) first = nccl().Recv(out + p * bytes, bytes, ncclUint8, p, q.comm(), st);
    }
    const ncclResult_t end = nccl().GroupEnd();
    check(first, "all_to_all send/recv");
    check(end, "all_to_all group end");
  }
  finish("all_to_all", st);
}

void NcclCommunicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  DS_CHECK(root >= 0 && root < size_, "broadcast root {} outside group '{}' of {}", root, name_,
           size_);
  size_t bytes = count * dtype_size(dtype);
  if (bytes == 0) return;
  void* st = op_stream();
  {
    Enqueue q(*this, "broadcast");
    check(nccl().Broadcast(data, data, bytes, ncclUint8, root, q.comm(), static_cast<cudaStream_t>(st)), "broadcast");
  }
  finish("broadcast", st);
}

void NcclCommunicator::send(const void* data, int64_t count, DType dtype, int dst) {
  DS_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send to {} from rank {} of group '{}'", dst,
           rank_, name_);
  size_t bytes = count * dtype_size(dtype);
  if (bytes == 0) return;
  void* st = op_stream();
  {
    Enqueue q(*this, "send");
    check(nccl().Send(data, bytes, ncclUint8, dst, q.comm(), static_cast<cudaStream_t>(st)), "send");
  }
  finish("send", st);
}

void NcclCommunicator::recv(void* data, int64_t count, DType dtype, int src) {
  DS_CHECK(src >= 0 && src < size_ && src != rank_, "recv from {} on rank {} of group '{}'", src,
           rank_, name_);
  size_t bytes = count * dtype_size(dtype);
  if (bytes == 0) return;
  void* st = op_stream();
  {
    Enqueue q(*this, "recv");
    check(nccl().Recv(data, bytes, ncclUint8, src, q.comm(), static_cast<cudaStream_t>(st)), "recv");
  }
  finish("recv", st);
}

// NCCL matches the k-th send from A to B with the k-th receive on B from A.
// Posting order inside a group is therefore what pairs messages: we post every
// channel-0 op of the batch first, then the channel-1 ops (each in the given
// order), so two peers that batch the same messages agree whatever order the
// caller listed them in. Unlike Gloo's per-channel counters, the two channels
// of one direction share NCCL's stream: a channel-1 message can only overtake
// a channel-0 one inside the same batch. The pipeline schedules send
// activations and gradients of one direction in matching batches, which is
// all this needs.
void NcclCommunicator::batch_send_recv(const std::vector<P2POp>& ops) {
  for (const P2POp& op : ops) {
    DS_CHECK(op.peer >= 0 && op.peer < size_ && op.peer != rank_ &&
                 (op.channel == 0 || op.channel == 1) && op.count >= 0,
             "batch_send_recv: {} peer {} channel {} count {} on rank {} of group '{}' ({})",
             op.is_send ? "send to" : "recv from", op.peer, op.channel, op.count, rank_, name_,
             size_);
    DS_CHECK(op.data || op.count == 0, "batch_send_recv: null buffer for {} elements on group '{}'",
             op.count, name_);
  }
  bool any = false;
  for (const P2POp& op : ops) any |= op.count * dtype_size(op.dtype) > 0;
  if (!any) return;
  void* st = op_stream();
  {
    Enqueue q(*this, "batch_send_recv");
    // Errors inside the group are collected and reported after ncclGroupEnd,
    // which must always be called once ncclGroupStart was.
    check(nccl().GroupStart(), "ncclGroupStart (batch_send_recv)");
    ncclResult_t first = ncclSuccess;
    const char* what = "";
    for (int channel = 0; channel < 2; ++channel) {
      for (const P2POp& op : ops) {
        const size_t bytes = op.count * dtype_size(op.dtype);
        if (op.channel != channel || bytes == 0) continue;
        ncclResult_t r = op.is_send
                             ? nccl().Send(op.data, bytes, ncclUint8, op.peer, q.comm(), static_cast<cudaStream_t>(st))
                             : nccl().Recv(op.data, bytes, ncclUint8, op.peer, q.comm(), static_cast<cudaStream_t>(st));
        if (r != ncclSuccess && first == ncclSuccess) {
          first = r;
          what = op.is_send ? "send (batch_send_recv)" : "recv (batch_send_recv)";
        }
      }
    }
    ncclResult_t end = nccl().GroupEnd();
    check(first, what);
    check(end, "ncclGroupEnd (batch_send_recv)");
  }
  // Stream-ordered like every blocking op: the buffers may be reused by later
  // work on the same stream (the pipeline's buffers are; host memory is never
  // passed to NCCL).
  finish("batch_send_recv", st);
}

// A host barrier (the checkpoint commit relies on it: rank 0 writes `latest`
// only after every rank wrote its files), so unlike the other blocking ops it
// waits on the host for the all-reduce (counted; the watchdog still bounds it).
void NcclCommunicator::barrier() {
  if (size_ == 1) return;
  void* st = op_stream();
  {
    Enqueue q(*this, "barrier");
    check(nccl().AllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, q.comm(), static_cast<cudaStream_t>(st)),
          "barrier");
  }
  if (in_submit_) return;  // ibarrier: its handle waits
  if (watchdog_) watchdog_->track(gs_, "barrier", st, take_op_start());
  poll("barrier", st, nullptr);
}

void NcclCommunicator::synchronize() {
  if (in_submit_) return;
  poll("synchronize", stream_.handle, nullptr);
  if (last_async_) wait_event_host(last_async_, "synchronize");
}

void NcclCommunicator::raise_if_failed() {
  if (watchdog_) watchdog_->check();
}

// Also marks the op's start for the watchdog (its deadline runs from there),
// after the ordering wait, so an op queued behind asynchronous ones is timed
// from when it can run.
void* NcclCommunicator::op_stream() {
  raise_if_failed();  // the watchdog's error before any CUDA call on a failed world
  if (in_submit_) return comm_stream_;
  if (last_async_ && ordered_after_ != last_async_) {
    DS_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), static_cast<cudaEvent_t>(last_async_), 0));
    ordered_after_ = last_async_;
  }
  if (watchdog_) {
    watchdog_->release(op_start_);  // left by an op that failed before it was enqueued
    op_start_ = nullptr;
    op_start_ = watchdog_->mark_start(stream_.handle);
  }
  return stream_.handle;
}

void* NcclCommunicator::take_op_start() {
  void* s = op_start_;
  op_start_ = nullptr;
  return s;
}

namespace {

// One asynchronous NCCL op: its completion event on the communication stream.
struct NcclWork : CommHandle::State {
  NcclCommunicator* owner;
  cudaEvent_t done;
  cudaStream_t compute;
  const char* what;
  NcclWork(NcclCommunicator* o, cudaEvent_t d, cudaStream_t c, const char* w) : owner(o), done(d), compute(c), what(w) {}
  ~NcclWork() override { cudaEventDestroy(done); }
  void wait() override {
    owner->raise_if_failed();
    DS_CUDA_CHECK(cudaStreamWaitEvent(compute, done, 0));
  }
  void wait_host() override { owner->wait_event_host(done, what); }
  bool ready() override { return cuda::query_status(cudaEventQuery(done)) == cudaSuccess; }
};

}  // namespace

CommHandle NcclCommunicator::submit(const char* what, std::function<void()> op, std::vector<Tensor> uses) {
  DS_CHECK(!in_submit_, "NCCL submit({}) inside another submit on group '{}'", what, name_);
  raise_if_failed();
  DS_CUDA_CHECK(cudaSetDevice(device_));
  if (!comm_stream_) {
    cudaStream_t s = nullptr;
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    comm_stream_ = s;
  }
  cudaStream_t cs = static_cast<cudaStream_t>(comm_stream_);
  cudaEvent_t ready = nullptr;
  DS_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  DS_CUDA_CHECK(cudaEventRecord(ready, as_stream(stream_)));  // the inputs were produced on the compute stream
  DS_CUDA_CHECK(cudaStreamWaitEvent(cs, ready, 0));
  cudaEventDestroy(ready);  // released once recorded work completes
  void* start = watchdog_ ? watchdog_->mark_start(cs) : nullptr;
  in_submit_ = true;
  try {
    op();
  } catch (...) {
    in_submit_ = false;
    if (watchdog_) watchdog_->release(start);
    throw;
  }
  in_submit_ = false;
  if (watchdog_) watchdog_->track(gs_, what, cs, start);
  for (const Tensor& t : uses)
    if (t.defined() && t.device().is_cuda()) record_stream_use(t.raw(), t.device().index, cs);
  cudaEvent_t done = nullptr;
  DS_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  DS_CUDA_CHECK(cudaEventRecord(done, cs));
  if (!last_async_) DS_CUDA_CHECK(cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(&last_async_), cudaEventDisableTiming));
  DS_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(last_async_), cs));
  ordered_after_ = nullptr;  // re-recorded: the next blocking op orders itself after it again
  return CommHandle(std::make_shared<NcclWork>(this, done, as_stream(stream_), what));
}

void NcclCommunicator::wait_all() {
  raise_if_failed();
  if (last_async_) DS_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), static_cast<cudaEvent_t>(last_async_), 0));
}

void NcclCommunicator::wait_event_host(void* ev, const char* what) { poll(what, nullptr, ev); }

void NcclCommunicator::finish(const char* what, void* stream) {
  if (in_submit_) return;  // asynchronous: submit() tracks the op, the handle waits
  if (watchdog_) {
    watchdog_->track(gs_, what, stream, take_op_start());  // stream-ordered: no host wait
    return;
  }
  poll(what, stream, nullptr);  // DS_NCCL_BLOCKING_WAIT=1
}

// The host waits for `event` if set, else `stream`, polling (never a blocking
// CUDA wait). With the watchdog, its failure is checked in between (it owns
// the ops' deadlines; work on the stream that is not NCCL's has none). With
// DS_NCCL_BLOCKING_WAIT=1 the poll itself checks ncclCommGetAsyncError and
// the DS_COMM_TIMEOUT deadline, and on a failure aborts the communicator and
// throws naming the op and the group, so the rank exits with a clear error
// and the launcher tears the job down.
void NcclCommunicator::poll(const char* what, void* stream, void* event) {
  raise_if_failed();
  {
    std::lock_guard<std::mutex> lk(gs_->mu);
    DS_CHECK(gs_->comm, "NCCL {} on group '{}' after the communicator was aborted", what, name_);
  }
  count_host_sync();
  auto deadline = std::chrono::steady_clock::now() + op_timeout_;
  while (true) {
    cudaError_t e = cuda::query_status(event ? cudaEventQuery(static_cast<cudaEvent_t>(event))
                                             : cudaStreamQuery(static_cast<cudaStream_t>(stream)));
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) DS_CUDA_CHECK(e);
    if (watchdog_) {
      raise_if_failed();
    } else {
      std::lock_guard<std::mutex> lk(gs_->mu);
      ncclResult_t async = ncclSuccess;
      check(nccl().CommGetAsyncError(as_comm(gs_->comm), &async), "ncclCommGetAsyncError");
      const bool late = std::chrono::steady_clock::now() > deadline;
      if ((async != ncclSuccess && async != ncclInProgress) || late) {
        nccl().CommAbort(as_comm(gs_->comm));
        gs_->comm = nullptr;
        if (late)
          DS_THROW("NCCL {} on group '{}' (rank {} of {}) timed out after {} s (DS_COMM_TIMEOUT); aborted the "
                   "communicator (a peer may have died)", what, name_, rank_, size_, op_timeout_.count() / 1000);
        DS_THROW("NCCL {} on group '{}' (rank {} of {}) failed: {}; a peer probably failed", what, name_, rank_,
                 size_, nccl().GetErrorString(async));
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace ds

// Communicator: the one interface through which dstrain talks between ranks.
// Two implementations: Gloo (CPU tensors, TCP) and NCCL (CUDA tensors). Also
// the rendezvous settings read from the rank environment and the factory that
// builds the world communicator. No global communicators: build one world with
// make_world_communicator(), derive groups with split() (see lib/parallel/comms.h
// for the Megatron tp/dp/pp groups) and pass them down.
//
// Semantics shared by both backends
// - Every member of a group calls each collective in the same order with the
//   same count/dtype; a communicator is used by one thread at a time.
// - Tensors are handles: the ops write into the memory a (const) Tensor points
//   to, so views such as buf.view(off, {n}) can be passed directly.
// - reduce_scatter takes size() equal chunks: input holds size()*n elements,
//   output n elements; output = reduction of chunk rank() over all members.
//   Pad buffers to a multiple of size() (ZeRO partitions do) for uneven data.
// - all_gather: input n elements, output size()*n, chunk i from member i.
// - all_to_all: input and output size()*n elements; chunk j of member i's
//   input becomes chunk i of member j's output (a transpose of the chunks).
//   Input and output must not overlap.
// - In-place is allowed: all_reduce always; reduce_scatter when output is
//   input's chunk rank(); all_gather when input is output's chunk rank().
// - send/recv are matched in order between each pair of members (no tags).
// - Determinism: Gloo reduces every element in member order
//   ((x0 op x1) op x2)..., accumulating 16-bit types in f32 and rounding once,
//   so results are bit-identical across runs, across members, and between
//   all_reduce and reduce_scatter. NCCL is deterministic for a fixed NCCL
//   version, topology and NCCL_ALGO/NCCL_PROTO, in its own order.
// - The raw and Tensor forms are blocking: Gloo on the host; NCCL in stream
//   order (enqueued on the communicator's stream, set_stream, without a host
//   wait: later work on that stream sees the result; a watchdog bounds each
//   op, see nccl_communicator.h). barrier() waits on the host on both.
// - Asynchronous forms (iall_reduce, ..., or submit() around any blocking op)
//   return a CommHandle (comm_handle.h). Issue order per group is preserved:
//   Gloo runs them one at a time on the group's communication thread; NCCL
//   enqueues them on the group's own communication stream after an event of
//   the compute stream. A blocking op issued while async ops are pending runs
//   after them (Gloo waits for the thread to drain; NCCL orders the compute
//   stream after the communication stream). Buffers of an async op must not
//   be touched until its handle was waited for. See docs/distributed.md.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/comm/comm_handle.h"
#include "lib/core/dtype.h"
#include "lib/core/stream.h"
#include "lib/core/tensor.h"

namespace ds {

class TcpStore;

enum class ReduceOp : uint8_t { Sum, Max };
enum class Backend : uint8_t { Gloo, Nccl };

const char* backend_name(Backend b);                 // "gloo" | "nccl"
Backend backend_from_name(const std::string& name);  // UserError on unknown

// One point-to-point message of a batch (batch_send_recv).
struct P2POp {
  bool is_send = false;
  void* data = nullptr;  // host memory for Gloo, device memory for NCCL
  int64_t count = 0;
  DType dtype = DType::F32;
  int peer = 0;          // group rank
  // Independent in-order message streams per pair (0: also plain send/recv;
  // 1: e.g. pipeline gradients, so they never pair with activations).
  int channel = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual Backend backend() const = 0;
  virtual int rank() const = 0;  // rank within this group
  virtual int size() const = 0;
  // World ranks of the members, indexed by group rank.
  virtual const std::vector<int>& world_ranks() const = 0;
  // Store key prefix naming this group ("world", "world/tp/3"), used in errors.
  virtual const std::string& name() const = 0;
  // The job's rendezvous store; nullptr for a single process built without one.
  virtual TcpStore* store() const = 0;

  // Raw-pointer collectives: host memory for Gloo, device memory for NCCL.
  virtual void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  virtual void reduce_scatter(const void* input, void* output, int64_t count_per_rank,
                              DType dtype, ReduceOp op) = 0;
  virtual void all_gather(const void* input, void* output, int64_t count_per_rank,
                          DType dtype) = 0;
  virtual void all_to_all(const void* input, void* output, int64_t count_per_rank, DType dtype) = 0;
  virtual void broadcast(void* data, int64_t count, DType dtype, int root) = 0;
  virtual void send(const void* data, int64_t count, DType dtype, int dst) = 0;
  virtual void recv(void* data, int64_t count, DType dtype, int src) = 0;
  virtual void barrier() = 0;
  // Posts every send and receive of `ops`, then waits for all of them (as
  // batch_isend_irecv): two peers' batches with matching operations complete
  // in any posting order, so pipeline steps cannot deadlock. Messages keep the
  // per-pair order of send/recv. Default: one op at a time, in order.
  virtual void batch_send_recv(const std::vector<P2POp>& ops);

  // Sub-group: `ranks` are ranks of THIS communicator, in the order that
  // becomes the new group's ranks. Called only by the members (every member
  // with the same list and tag); each member must create its groups in the
  // same relative order (build_comms does tp, dp, pp, embedding). `tag`
  // must be unique among the groups split from this communicator. Members'
  // lists are cross-checked through the store.
  virtual std::unique_ptr<Communicator> split(const std::vector<int>& ranks,
                                              const std::string& tag) = 0;

  // NCCL: the stream ops are enqueued on (Stream::handle = cudaStream_t).
  virtual void set_stream(Stream s) {}
  virtual Stream stream() const { return {}; }
  virtual void synchronize() {}  // wait until enqueued ops finished
  // NCCL: throws the error the watchdog found (a failed or timed-out op on any
  // group of the world), if any; cheap. Callers that read back data an op
  // produced call it after the read, so a value from an aborted op is never used.
  virtual void raise_if_failed() {}
  // NCCL: true when a watchdog bounds every enqueued op, so a plain device
  // synchronisation behind NCCL work cannot hang forever (false with
  // DS_NCCL_BLOCKING_WAIT=1, and for Gloo, whose ops block on the host).
  virtual bool watchdog_guarded() const { return false; }

  // Tensor forms: check device, dtype and sizes, then call the raw forms.
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::Sum);
  void all_gather(const Tensor& input, const Tensor& output);
  void all_to_all(const Tensor& input, const Tensor& output);  // equal numel, a multiple of size()
  void broadcast(const Tensor& t, int root);
  void send(const Tensor& t, int dst);
  void recv(const Tensor& t, int src);
  // One f32 scalar reduced / broadcast over the group, staged through a
  // 1-element tensor on `dev` (the caller's training device: host memory for
  // Gloo, the rank's GPU for NCCL).
  double all_reduce_scalar(double v, Device dev, ReduceOp op = ReduceOp::Sum);
  double broadcast_scalar(double v, Device dev, int root);

  // Asynchronous forms. submit() issues any blocking op of this group
  // asynchronously: `op` calls the blocking form (raw or Tensor); `uses` are
  // the tensors it reads or writes (NCCL: their blocks are not reused by the
  // caching allocator before the op finished). Gloo: queued on the group's
  // communication thread (started on first use). The typed forms check their
  // arguments at issue time, on the caller's thread.
  virtual CommHandle submit(const char* what, std::function<void()> op, std::vector<Tensor> uses = {});
  CommHandle iall_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
  CommHandle ireduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::Sum);
  CommHandle iall_gather(const Tensor& input, const Tensor& output);
  CommHandle ibroadcast(const Tensor& t, int root);
  CommHandle isend(const Tensor& t, int dst);
  CommHandle irecv(const Tensor& t, int src);
  // `keep` are tensors owning the ops' buffers (kept alive until the op ran).
  CommHandle ibatch_send_recv(std::vector<P2POp> ops, std::vector<Tensor> keep = {});
  CommHandle ibarrier();
  // Waits (as CommHandle::wait does) for every op issued so far.
  virtual void wait_all();

 protected:
  virtual DeviceType device_type() const = 0;  // where this backend's tensors live
  void check_tensor(const Tensor& t, const char* op) const;
  // Blocking ops of a backend that uses the communication thread call this
  // first: from the caller's thread it waits until the queued ops ran.
  void drain_async();
  bool on_async_thread() const { return worker_ && worker_->on_worker_thread(); }
  // Derived destructors call this before their members go (the thread calls
  // their virtuals).
  void stop_async() { worker_.reset(); }

 private:
  std::unique_ptr<CommWorker> worker_;
};

// Where and how to meet the other ranks; from_env() reads the dsrun variables.
struct RendezvousInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string token;  // DS_JOB_TOKEN
  // Connecting + rendezvous bound (DS_RENDEZVOUS_TIMEOUT, seconds).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Bound on one collective waiting for peers (DS_COMM_TIMEOUT, seconds).
  std::chrono::milliseconds op_timeout{std::chrono::seconds(1800)};

  // RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_SIZE, MASTER_ADDR, MASTER_PORT,
  // DS_JOB_TOKEN, DS_RENDEZVOUS_TIMEOUT, DS_COMM_TIMEOUT; unset -> the
  // single-process defaults above. UserError naming the variable if malformed.
  static RendezvousInfo from_env();
};

// Connects this rank to the job: rank 0 hosts the store, everybody meets at a
// barrier (whose timeout error lists the ranks that never arrived), then the
// backend connects. A world of 1 opens no socket. Nccl needs a CUDA build
// (UserError otherwise) and uses device local_rank % device_count.
std::unique_ptr<Communicator> make_world_communicator(Backend backend, const RendezvousInfo& info);

}  // namespace ds

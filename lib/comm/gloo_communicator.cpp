// Gloo backend: TCP full mesh per group (rendezvous through our store) and
// member-order collectives built from point-to-point exchanges.
//
// all_reduce / reduce_scatter: each member owns one chunk; in rounds of at
// most segment_bytes per chunk, every member sends each peer the peer's chunk
// piece, receives its own chunk piece from every peer and reduces the pieces
// in member order (reduce_in_order). all_reduce then sends its reduced piece
// to every peer. Traffic per member equals a ring's; latency is one step.
// A peer that does not answer within DS_COMM_TIMEOUT (stopped, hung) or
// whose connection fails (exited) is a UserError naming the op and the peer.
#include "lib/comm/gloo_communicator.h"

#include <gloo/alltoall.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "lib/comm/group_util.h"
#include "lib/comm/reduce_kernels.h"
#include "lib/comm/socket_util.h"
#include "lib/comm/tcp_store.h"
#include "lib/core/error.h"
#include "lib/core/sync_counter.h"

namespace ds {
namespace {

// Slots for send/recv live far above the collectives' (Context::nextSlot).
constexpr uint64_t kP2PSlotBase = 1ull << 60;

// Gloo's view of our store, with every key under a per-group prefix.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(TcpStore& s, std::string prefix) : s_(s), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = s_.get(prefix_ + key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, s_.timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(prefix_ + k);
    s_.wait(full, t);
  }

 private:
  TcpStore& s_;
  std::string prefix_;
};

// A transfer with one peer that failed inside an exchange; guarded() turns
// it into the one error line naming the op, the peer and, for an expired
// wait, the timeout.
struct PeerFailure : std::runtime_error {
  PeerFailure(int p, bool r, const std::string& what) : std::runtime_error(what), peer(p), recv(r) {}
  int peer;   // group rank
  bool recv;  // this rank was receiving from it
};

// Gloo reports an expired wait as an IoException "Timed out waiting ...".
bool is_timeout(const std::exception& e) { return std::strstr(e.what(), "Timed out") != nullptr; }

// Waits for buffer b's transfer with `peer`; a Gloo I/O error (a timeout, a
// closed connection) becomes a PeerFailure naming that peer.
void wait_transfer(gloo::transport::UnboundBuffer& b, bool is_send, int peer, std::chrono::milliseconds timeout,
                   const std::string& group) {
  bool ok = false;
  try {
    ok = is_send ? b.waitSend(timeout) : b.waitRecv(timeout);
  } catch (const gloo::IoException& e) {
    throw PeerFailure(peer, !is_send, e.what());
  }
  DS_CHECK(ok, "gloo transfer aborted on group '{}'", group);
}

// Gloo's TCP pairs write with writev(), which raises SIGPIPE when the peer
// has already closed its end. The default action would kill this rank with
// exit 141 before the failed op can throw and name itself, so a dead peer must
// surface as EPIPE instead. Only a default disposition is replaced; a handler
// the program installed itself is left alone.
void ignore_sigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, nullptr);
  }
}

std::shared_ptr<gloo::transport::Device> make_device(const std::string& master_addr, int port,
                                                     const std::string& local_address) {
  ignore_sigpipe();
  gloo::transport::tcp::attr attr;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname) {
    attr.iface = ifname;
  } else {
    attr.hostname = local_address.empty() ? net::local_address_towards(master_addr, port)
                                          : local_address;
    if (attr.hostname.empty()) attr.hostname = "127.0.0.1";
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    DS_USER_ERROR("cannot open the Gloo TCP transport on '{}': {}; set GLOO_SOCKET_IFNAME to the "
                  "interface that reaches MASTER_ADDR", ifname ? ifname : attr.hostname, e.what());
  }
}

}  // namespace

GlooCommunicator::~GlooCommunicator() { stop_async(); }

std::unique_ptr<GlooCommunicator> GlooCommunicator::create_world(std::shared_ptr<TcpStore> store,
                                                                 int rank, int size,
                                                                 const std::string& master_addr,
                                                                 const GlooOptions& opt) {
  DS_CHECK(rank >= 0 && rank < size, "rank {} outside world of {}", rank, size);
  std::unique_ptr<GlooCommunicator> c(new GlooCommunicator());
  c->store_ = std::move(store);
  c->rank_ = rank;
  c->size_ = size;
  c->name_ = "world";
  c->opt_ = opt;
  if (const char* seg = std::getenv("DS_COMM_SEGMENT_BYTES")) c->opt_.segment_bytes = std::atoll(seg);
  c->opt_.segment_bytes = std::max<int64_t>(c->opt_.segment_bytes, 1);
  for (int r = 0; r < size; ++r) c->world_ranks_.push_back(r);
  if (size > 1) {
    DS_CHECK(c->store_, "a Gloo world of {} ranks needs a store", size);
    c->device_ = make_device(master_addr, c->store_->port(), opt.local_address);
    c->connect(c->name_);
  }
  return c;
}

void GlooCommunicator::connect(const std::string& store_prefix) {
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
  ctx->setTimeout(store_->timeout());  // bounds connecting the pairs
  GlooStoreAdapter adapter(*store_, "gloo/" + store_prefix + "/");
  try {
    ctx->connectFullMesh(adapter, device_);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    DS_THROW("Gloo rendezvous of group '{}' (rank {} of {}) failed: {}", name_, rank_, size_,
             e.what());
  }
  ctx->setTimeout(opt_.op_timeout);
  ctx_ = ctx;
  send_seq_.assign(2 * size_, 0);
  recv_seq_.assign(2 * size_, 0);
}

std::unique_ptr<Communicator> GlooCommunicator::split(const std::vector<int>& ranks,
                                                      const std::string& tag) {
  int me = validate_group(ranks, tag, rank_, size_, name_);
  DS_CHECK(used_tags_.insert(tag).second, "split tag '{}' already used on group '{}'", tag, name_);
  std::unique_ptr<GlooCommunicator> c(new GlooCommunicator());
  c->store_ = store_;
  c->device_ = device_;
  c->name_ = name_ + "/" + tag;
  c->rank_ = me;
  c->size_ = static_cast<int>(ranks.size());
  c->opt_ = opt_;
  for (int r : ranks) c->world_ranks_.push_back(world_ranks_[r]);
  if (c->size_ > 1) {
    DS_CHECK(store_ && device_, "group '{}' needs the store and transport", c->name_);
    agree_on_members(*store_, c->name_, me, c->world_ranks_);
    c->connect(c->name_);
  }
  return c;
}

template <class F>
void GlooCommunicator::guarded(const char* op, int64_t count, DType dtype, F&& body) {
  // Issue order: a blocking op from the caller's thread runs after the queued
  // async ops (and then alone: the thread is idle until the caller issues more).
  if (!on_async_thread()) {
    drain_async();
    count_host_sync();  // the caller blocks on communication
  }
  const auto where = [&] {
    return fmt::format("gloo {} of {} x {} on group '{}' (rank {} of {})", op, count, dtype_name(dtype), name_, rank_,
                       size_);
  };
  const std::string timeout = fmt::format("{:g} s", opt_.op_timeout.count() / 1000.0);
  // A stopped, hung or exited peer is the job's problem, not a bug: one user error line naming it.
  try {
    body();
  } catch (const Error&) {
    throw;
  } catch (const UserError&) {
    throw;
  } catch (const PeerFailure& e) {
    const int world = world_ranks_[e.peer];
    if (is_timeout(e))
      DS_USER_ERROR("{}: rank {} (world rank {}) did not {} within the {} timeout (DS_COMM_TIMEOUT); that rank is "
                    "stopped, hung or far behind: check it", where(), e.peer, world,
                    e.recv ? "send its part" : "take this rank's part", timeout);
    DS_USER_ERROR("{}: the connection to rank {} (world rank {}) failed ({}); that rank probably exited, check its "
                  "log", where(), e.peer, world, e.what());
  } catch (const gloo::IoException& e) {
    if (is_timeout(e))
      DS_USER_ERROR("{}: a peer did not answer within the {} timeout (DS_COMM_TIMEOUT); a rank is stopped, hung or "
                    "far behind: check the other ranks", where(), timeout);
    DS_USER_ERROR("{} failed: {}; a peer probably exited, check the other ranks' logs", where(), e.what());
  } catch (const std::exception& e) {
    DS_THROW("{} failed: {}; a peer probably exited, check the other ranks' logs", where(), e.what());
  }
}

void GlooCommunicator::exchange(const std::vector<Xfer>& xs, uint64_t slot) {
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
  std::vector<const Xfer*> posted;
  for (const Xfer& x : xs) {
    if (x.bytes == 0) continue;
    auto b = ctx_->createUnboundBuffer(x.ptr, x.bytes);
    if (x.is_send)
      b->send(x.peer, slot);
    else
      b->recv(x.peer, slot);
    bufs.push_back(std::move(b));
    posted.push_back(&x);
  }
  for (size_t i = 0; i < bufs.size(); ++i)
    wait_transfer(*bufs[i], posted[i]->is_send, posted[i]->peer, opt_.op_timeout, name_);
}

void GlooCommunicator::reduce_scatter_rounds(const void* in, void* out,
                                             const std::vector<int64_t>& offsets,
                                             const std::vector<int64_t>& lens, DType dtype, ReduceOp op, bool then_gather) {
  const size_t es = dtype_size(dtype);
  const int64_t seg = std::max<int64_t>(1, opt_.segment_bytes / static_cast<int64_t>(es));
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  std::vector<char> tmp(static_cast<size_t>(size_) * seg * es);
  char* src = static_cast<char*>(const_cast<void*>(in));
  char* dst = static_cast<char*>(out);
  auto piece = [&](int c, int64_t lo) { return lo < lens[c] ? std::min(seg, lens[c] - lo) : 0; };
  for (int64_t lo = 0; lo < max_len; lo += seg) {
    const int64_t mine = piece(rank_, lo);
    std::vector<Xfer> xs;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      xs.push_back({p, tmp.data() + p * seg * es, mine * es, false});
      xs.push_back({p, src + (offsets[p] + lo) * es, piece(p, lo) * es, true});
    }
    exchange(xs, ctx_->nextSlot());
    if (mine > 0) {
      std::vector<const void*> srcs(size_);
      for (int i = 0; i < size_; ++i)
        srcs[i] = i == rank_ ? src + (offsets[rank_] + lo) * es : tmp.data() + i * seg * es;
      reduce_in_order(dtype, op, srcs, dst + lo * es, mine);
    }
    if (!then_gather) continue;
    xs.clear();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      xs.push_back({p, dst + lo * es, mine * es, true});
      xs.push_back({p, src + (offsets[p] + lo) * es, piece(p, lo) * es, false});
    }
    exchange(xs, ctx_->nextSlot());
  }
}

void GlooCommunicator::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  if (size_ == 1 || count == 0) return;
  std::vector<int64_t> offsets, lens;
  even_chunks(count, size_, offsets, lens);
  char* mine = static_cast<char*>(data) + offsets[rank_] * dtype_size(dtype);
  guarded("all_reduce", count, dtype, [&] {
    reduce_scatter_rounds(data, mine, offsets, lens, dtype, op, true);
  });
}

void GlooCommunicator::reduce_scatter(const void* input, void* output, int64_t count_per_rank,
                                      DType dtype, ReduceOp op) {
  const size_t bytes = count_per_rank * dtype_size(dtype);
  const char* my_in = static_cast<const char*>(input) + rank_ * bytes;
  if (size_ == 1) {
    if (output != my_in) std::memmove(output, my_in, bytes);
    return;
  }
  if (count_per_rank == 0) return;
  std::vector<int64_t> offsets(size_), lens(size_, count_per_rank);
  for (int i = 0; i < size_; ++i) offsets[i] = i * count_per_rank;
  guarded("reduce_scatter", count_per_rank * size_, dtype, [&] {
    reduce_scatter_rounds(input, output, offsets, lens, dtype, op, false);
  });
}

void GlooCommunicator::all_gather(const void* input, void* output, int64_t count_per_rank,
                                  DType dtype) {
  const size_t bytes = count_per_rank * dtype_size(dtype);
  char* out = static_cast<char*>(output);
  if (out + rank_ * bytes != input) std::memmove(out + rank_ * bytes, input, bytes);
  if (size_ == 1 || bytes == 0) return;
  std::vector<Xfer> xs;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    xs.push_back({p, out + rank_ * bytes, bytes, true});
    xs.push_back({p, out + p * bytes, bytes, false});
  }
  guarded("all_gather", count_per_rank * size_, dtype, [&] { exchange(xs, ctx_->nextSlot()); });
}

// Gloo's alltoall (its own slot prefix, so it never meets our exchanges'
// slots); bytes are moved as chars, whatever the dtype.
void GlooCommunicator::all_to_all(const void* input, void* output, int64_t count_per_rank, DType dtype) {
  const size_t bytes = count_per_rank * dtype_size(dtype);
  char* out = static_cast<char*>(output);
  const char* in = static_cast<const char*>(input);
  if (size_ == 1 || bytes == 0) {
    if (bytes) std::memmove(out, in, bytes);
    return;
  }
  guarded("all_to_all", count_per_rank * size_, dtype, [&] {
    gloo::AlltoallOptions o(ctx_);
    o.setInput(const_cast<char*>(in), bytes * size_);
    o.setOutput(out, bytes * size_);
    o.setTimeout(opt_.op_timeout);
    gloo::alltoall(o);
  });
}

void GlooCommunicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  DS_CHECK(root >= 0 && root < size_, "broadcast root {} outside group '{}' of {}", root, name_,
           size_);
  const size_t bytes = count * dtype_size(dtype);
  if (size_ == 1 || bytes == 0) return;
  std::vector<Xfer> xs;
  if (rank_ == root) {
    for (int p = 0; p < size_; ++p)
      if (p != root) xs.push_back({p, data, bytes, true});
  } else {
    xs.push_back({root, data, bytes, false});
  }
  guarded("broadcast", count, dtype, [&] { exchange(xs, ctx_->nextSlot()); });
}

void GlooCommunicator::send(const void* data, int64_t count, DType dtype, int dst) {
  DS_CHECK(dst >= 0 && dst < size_ && dst != rank_, "send to {} from rank {} of group '{}' ({})",
           dst, rank_, name_, size_);
  const size_t bytes = count * dtype_size(dtype);
  if (bytes == 0) return;
  guarded("send", count, dtype, [&] {
    exchange({{dst, const_cast<void*>(data), bytes, true}}, kP2PSlotBase + send_seq_[dst]++);
  });
}

void GlooCommunicator::recv(void* data, int64_t count, DType dtype, int src) {
  DS_CHECK(src >= 0 && src < size_ && src != rank_, "recv from {} on rank {} of group '{}' ({})",
           src, rank_, name_, size_);
  const size_t bytes = count * dtype_size(dtype);
  if (bytes == 0) return;
  guarded("recv", count, dtype, [&] { exchange({{src, data, bytes, false}}, kP2PSlotBase + recv_seq_[src]++); });
}

// Each message takes the next slot of its (peer, direction) counter, exactly
// as send/recv do; all are posted before any is waited on.
void GlooCommunicator::batch_send_recv(const std::vector<P2POp>& ops) {
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
  std::vector<const P2POp*> posted;
  guarded("batch_send_recv", static_cast<int64_t>(ops.size()), DType::U8, [&] {
    for (const P2POp& op : ops) {
      DS_CHECK(op.peer >= 0 && op.peer < size_ && op.peer != rank_ && (op.channel == 0 || op.channel == 1),
               "p2p peer {} channel {} on rank {} of group '{}' ({})", op.peer, op.channel, rank_, name_, size_);
      const size_t at = static_cast<size_t>(op.channel) * size_ + op.peer;
      const uint64_t base = kP2PSlotBase + (static_cast<uint64_t>(op.channel) << 56);
      const size_t bytes = op.count * dtype_size(op.dtype);
      if (bytes == 0) continue;
      auto b = ctx_->createUnboundBuffer(op.data, bytes);
      if (op.is_send)
        b->send(op.peer, base + send_seq_[at]++);
      else
        b->recv(op.peer, base + recv_seq_[at]++);
      bufs.push_back(std::move(b));
      posted.push_back(&op);
    }
    for (size_t i = 0; i < bufs.size(); ++i)
      wait_transfer(*bufs[i], posted[i]->is_send, posted[i]->peer, opt_.op_timeout, name_);
  });
}

void GlooCommunicator::barrier() {
  if (size_ == 1) return;
  char token = 1;
  std::vector<char> got(size_);
  std::vector<Xfer> xs;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    xs.push_back({p, &token, 1, true});
    xs.push_back({p, &got[p], 1, false});
  }
  guarded("barrier", 0, DType::U8, [&] { exchange(xs, ctx_->nextSlot()); });
}

}  // namespace ds

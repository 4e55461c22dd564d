// GlooCommunicator: the CPU backend. Gloo provides the TCP transport (a full
// mesh of pairs, bootstrapped through our TcpStore); the collectives are our
// own, built from Gloo's point-to-point unbound buffers, so that every element
// is reduced in member order (bit-identical results, see communicator.h) and
// 16-bit types accumulate in f32. Groups of one member need no transport.
#pragma once
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "lib/comm/communicator.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace ds {

struct GlooOptions {
  // Address other ranks reach this one at; empty: the local address that
  // routes to MASTER_ADDR. GLOO_SOCKET_IFNAME (env) picks an interface instead.
  std::string local_address;
  std::chrono::milliseconds op_timeout{std::chrono::seconds(1800)};
  // Bytes of each peer's chunk moved per round of a reduction (bounds the
  // scratch memory to size() x this). DS_COMM_SEGMENT_BYTES overrides.
  int64_t segment_bytes = 4 << 20;
};

class GlooCommunicator : public Communicator {
 public:
  // The world group. `store` may be null only when size == 1. All ranks must
  // have met (TcpStore::barrier) or will meet inside the Gloo rendezvous.
  static std::unique_ptr<GlooCommunicator> create_world(std::shared_ptr<TcpStore> store, int rank,
                                                        int size, const std::string& master_addr,
                                                        const GlooOptions& opt);
  ~GlooCommunicator() override;

  Backend backend() const override { return Backend::Gloo; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  const std::string& name() const override { return name_; }
  TcpStore* store() const override { return store_.get(); }

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
  void batch_send_recv(const std::vector<P2POp>& ops) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(const std::vector<int>& ranks,
                                      const std::string& tag) override;

 protected:
  DeviceType device_type() const override { return DeviceType::CPU; }

 private:
  GlooCommunicator() = default;
  struct Xfer {  // one point-to-point message of an exchange round
    int peer;
    void* ptr;
    size_t bytes;
    bool is_send;
  };
  void connect(const std::string& store_prefix);
  void exchange(const std::vector<Xfer>& xs, uint64_t slot);
  void reduce_scatter_rounds(const void* in, void* out, const std::vector<int64_t>& offsets,
                             const std::vector<int64_t>& lens, DType dtype, ReduceOp op,
                             bool then_gather);
  template <class F> void guarded(const char* op, int64_t count, DType dtype, F&& body);

  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;  // null when size_ == 1
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_ = 0, size_ = 1;
  GlooOptions opt_;
  std::vector<uint64_t> send_seq_, recv_seq_;  // message counters per (channel, peer): channel * size + peer
  std::set<std::string> used_tags_;
};

}  // namespace ds

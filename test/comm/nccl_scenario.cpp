// NCCL checks with integer-valued inputs, so that the sums are exact in any
// reduction order (NCCL does not promise ours).
#include "test/comm/nccl_scenario.h"

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/core/error.h"
#ifdef DS_WITH_NCCL
#include <cuda_runtime.h>

#include "lib/comm/nccl/nccl_communicator.h"
#endif

namespace ds::test {

#ifndef DS_WITH_NCCL
int nccl_scenario() {
  std::printf("SKIP: built without CUDA/NCCL\n");
  return kScenarioSkipped;
}
#else
namespace {

#define NCHECK(cond, ...)                                                                  \
  do {                                                                                    \
    if (!(cond)) throw std::logic_error(fmt::format("nccl check failed: {}: ", #cond) +  \
                                        fmt::format(__VA_ARGS__));                        \
  } while (0)

float ival(int rank, int64_t i) { return static_cast<float>((rank * 7 + i * 3) % 50 - 25); }

// Device buffer of n floats with the given host contents.
struct DevBuf {
  float* p = nullptr;
  int64_t n = 0;
  explicit DevBuf(const std::vector<float>& h) : n(static_cast<int64_t>(h.size())) {
    if (cudaMalloc(&p, std::max<int64_t>(n, 1) * 4) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice);
  }
  ~DevBuf() { cudaFree(p); }
  std::vector<float> host() const {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost);
    return h;
  }
};

std::vector<float> inputs(int rank, int64_t n) {
  std::vector<float> h(n);
  for (int64_t i = 0; i < n; ++i) h[i] = ival(rank, i);
  return h;
}

void run_checks(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const int64_t count = 10007;
  DevBuf sum(inputs(me, count)), mx(inputs(me, count));
  c.all_reduce(sum.p, count, DType::F32, ReduceOp::Sum);
  c.all_reduce(mx.p, count, DType::F32, ReduceOp::Max);
  const int64_t per = 1001;
  DevBuf rs_in(inputs(me, per * n)), rs_out{std::vector<float>(per)};
  c.reduce_scatter(rs_in.p, rs_out.p, per, DType::F32, ReduceOp::Sum);
  DevBuf ag_in(inputs(me, per)), ag_out{std::vector<float>(per * n)};
  c.all_gather(ag_in.p, ag_out.p, per, DType::F32);
  DevBuf a2a_in(inputs(me, per * n)), a2a_out{std::vector<float>(per * n)};
  c.all_to_all(a2a_in.p, a2a_out.p, per, DType::F32);
  DevBuf bc(inputs(me, 513));
  c.broadcast(bc.p, 513, DType::F32, n - 1);
  c.synchronize();
  auto hs = sum.host(), hm = mx.host(), hr = rs_out.host(), hg = ag_out.host(), hb = bc.host(), ha = a2a_out.host();
  for (int64_t i = 0; i < count; ++i) {
    float s = 0, m = ival(0, i);
    for (int r = 0; r < n; ++r) s += ival(r, i), m = std::max(m, ival(r, i));
    NCHECK(hs[i] == s && hm[i] == m, "all_reduce i={}: {} {} vs {} {}", i, hs[i], hm[i], s, m);
  }
  for (int64_t j = 0; j < per; ++j) {
    float s = 0;
    for (int r = 0; r < n; ++r) s += ival(r, me * per + j);
    NCHECK(hr[j] == s, "reduce_scatter j={}", j);
    for (int r = 0; r < n; ++r) NCHECK(hg[r * per + j] == ival(r, j), "all_gather r={} j={}", r, j);
    for (int r = 0; r < n; ++r)
      NCHECK(ha[r * per + j] == ival(r, me * per + j), "all_to_all from {} j={}", r, j);
  }
  for (int64_t i = 0; i < 513; ++i) NCHECK(hb[i] == ival(n - 1, i), "broadcast i={}", i);
  if (n > 1) {  // ring send/recv, even ranks send first
    DevBuf out(inputs(me, 777)), in{std::vector<float>(777)};
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    if (me % 2 == 0) {
      c.send(out.p, 777, DType::F32, next);
      c.recv(in.p, 777, DType::F32, prev);
    } else {
      c.recv(in.p, 777, DType::F32, prev);
      c.send(out.p, 777, DType::F32, next);
    }
    c.synchronize();
    auto h = in.host();
    for (int64_t i = 0; i < 777; ++i) NCHECK(h[i] == ival(prev, i), "recv i={}", i);
  }
  c.barrier();
}

// Async forms on NCCL: two dependent all-reduces and a reduce-scatter issued
// on the communication stream, a blocking all-reduce issued behind them, the
// handles waited for by the compute stream; bit-identical to the blocking
// sequence.
void run_async_checks(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const int64_t count = 4099, per = 257;
  DevBuf a(inputs(me, count)), b(inputs(me, count)), rs_in(inputs(me, per * n)), rs_out{std::vector<float>(per)};
  DevBuf a2(inputs(me, count)), b2(inputs(me, count)), rs_out2{std::vector<float>(per)};
  c.all_reduce(a.p, count, DType::F32, ReduceOp::Sum);
  c.all_reduce(a.p, count, DType::F32, ReduceOp::Sum);
  c.reduce_scatter(rs_in.p, rs_out.p, per, DType::F32, ReduceOp::Sum);
  c.all_reduce(b.p, count, DType::F32, ReduceOp::Max);
  c.synchronize();
  std::vector<CommHandle> hs;
  hs.push_back(c.submit("all_reduce", [&] { c.all_reduce(a2.p, count, DType::F32, ReduceOp::Sum); }));
  hs.push_back(c.submit("all_reduce", [&] { c.all_reduce(a2.p, count, DType::F32, ReduceOp::Sum); }));
  hs.push_back(c.submit("reduce_scatter", [&] { c.reduce_scatter(rs_in.p, rs_out2.p, per, DType::F32, ReduceOp::Sum); }));
  c.all_reduce(b2.p, count, DType::F32, ReduceOp::Max);  // blocking, behind the async ones
  for (CommHandle& h : hs) h.wait();
  hs.back().wait_host();
  c.synchronize();
  NCHECK(a.host() == a2.host(), "async all_reduce differs from blocking");
  NCHECK(b.host() == b2.host(), "blocking all_reduce after async ones differs");
  NCHECK(rs_out.host() == rs_out2.host(), "async reduce_scatter differs from blocking");
  for (CommHandle& h : hs) NCHECK(h.ready(), "handle not ready after synchronize");
}

}  // namespace

int nccl_scenario() {
  std::string why;
  if (cuda_device_count(&why) == 0) {
    std::printf("SKIP: no CUDA device for the NCCL checks (%s)\n", why.c_str());
    return kScenarioSkipped;
  }
  auto world = make_world_communicator(Backend::Nccl, RendezvousInfo::from_env());
  run_checks(*world);
  run_async_checks(*world);
  auto self = world->split({world->rank()}, "self/" + std::to_string(world->rank()));
  run_checks(*self);
  std::printf("rank %d: NCCL checks passed on %d rank(s)\n", world->rank(), world->size());
  return 0;
}
#endif

}  // namespace ds::test

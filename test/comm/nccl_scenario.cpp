// NCCL checks with integer-valued inputs, so that the sums are exact in any
// reduction order (NCCL does not promise ours).
#include "test/comm/nccl_scenario.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <string>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/core/error.h"
#ifdef DS_WITH_NCCL
#include <cuda_runtime.h>

#include "lib/comm/nccl/nccl_communicator.h"
#include "lib/core/sync_counter.h"
#endif

namespace ds::test {

#ifndef DS_WITH_NCCL
int nccl_scenario() {
  std::printf("SKIP: built without CUDA/NCCL\n");
  return kScenarioSkipped;
}
int nccl_watchdog_timeout_scenario() { return nccl_scenario(); }
int nccl_dead_peer_scenario() { return nccl_scenario(); }
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

// Blocking ops are stream-ordered: a run of them enqueues without a single
// host synchronisation, a copy queued behind them on the same stream reads
// their result, and the watchdog sees every op complete.
void run_stream_order_checks(NcclCommunicator& c) {
  NCHECK(c.watchdog() != nullptr && c.watchdog_guarded(), "no watchdog on group '{}' by default", c.name());
  const int n = c.size(), me = c.rank();
  const int64_t count = 4097;
  const int reps = 16;
  DevBuf a(inputs(me, count)), copy{std::vector<float>(count)};
  const int64_t before = host_sync_count();
  for (int k = 0; k < reps; ++k) c.all_reduce(a.p, count, DType::F32, ReduceOp::Max);  // idempotent after the first
  c.all_reduce(a.p, count, DType::F32, ReduceOp::Sum);
  const int64_t syncs = host_sync_count() - before;
  NCHECK(syncs == 0, "{} host synchronisations for {} stream-ordered all_reduces", syncs, reps + 1);
  cudaStream_t st = static_cast<cudaStream_t>(c.stream().handle);
  if (cudaMemcpyAsync(copy.p, a.p, count * 4, cudaMemcpyDeviceToDevice, st) != cudaSuccess)
    throw std::runtime_error("cudaMemcpyAsync");
  const std::vector<float> h = copy.host();  // a synchronous copy: the stream's work is done
  for (int64_t i = 0; i < count; ++i) {
    float m = ival(0, i);
    for (int r = 1; r < n; ++r) m = std::max(m, ival(r, i));
    NCHECK(h[i] == m * n, "stream-ordered all_reduce then copy, i={}: {} vs {}", i, h[i], m * n);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (c.watchdog()->pending() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  NCHECK(c.watchdog()->pending() == 0, "the watchdog still tracks {} completed ops", c.watchdog()->pending());
  c.raise_if_failed();
}

// DS_NCCL_BLOCKING_WAIT=1 (a world of one built here): no watchdog, and the
// host polls after each op, one counted synchronisation per op. A value
// other than 0/1 is a user error naming the variable.
void run_blocking_wait_checks() {
  setenv("DS_NCCL_BLOCKING_WAIT", "yes", 1);
  bool refused = false;
  try {
    NcclCommunicator::create_world(nullptr, 0, 1, 0);
  } catch (const UserError& e) {
    refused = std::string(e.what()).find("DS_NCCL_BLOCKING_WAIT") != std::string::npos;
  }
  NCHECK(refused, "DS_NCCL_BLOCKING_WAIT=yes was not refused naming the variable");
  setenv("DS_NCCL_BLOCKING_WAIT", "1", 1);
  auto c = NcclCommunicator::create_world(nullptr, 0, 1, 0);
  unsetenv("DS_NCCL_BLOCKING_WAIT");
  NCHECK(c->watchdog() == nullptr && !c->watchdog_guarded(), "DS_NCCL_BLOCKING_WAIT=1 kept the watchdog");
  const int64_t count = 1031;
  const int ops = 5;
  DevBuf a(inputs(0, count));
  const int64_t before = host_sync_count();
  for (int k = 0; k < ops; ++k) c->all_reduce(a.p, count, DType::F32, ReduceOp::Sum);
  const int64_t syncs = host_sync_count() - before;
  NCHECK(syncs == ops, "DS_NCCL_BLOCKING_WAIT=1: {} host synchronisations for {} ops", syncs, ops);
  const std::vector<float> h = a.host();
  for (int64_t i = 0; i < count; ++i) NCHECK(h[i] == ival(0, i), "blocking-wait all_reduce i={}", i);
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
  run_stream_order_checks(dynamic_cast<NcclCommunicator&>(*world));
  if (world->size() == 1) run_blocking_wait_checks();
  auto self = world->split({world->rank()}, "self/" + std::to_string(world->rank()));
  run_checks(*self);
  std::printf("rank %d: NCCL checks passed on %d rank(s)\n", world->rank(), world->size());
  return 0;
}

namespace {

bool no_device() {
  std::string why;
  if (cuda_device_count(&why) > 0) return false;
  std::printf("SKIP: no CUDA device for the NCCL checks (%s)\n", why.c_str());
  return true;
}

// Abort mode: the error the training thread threw, printed; the process ends
// here, without unwinding into the aborted communicators.
[[noreturn]] void report_and_exit(const std::exception& e) {
  std::printf("ERROR: %s\n", e.what());
  std::fflush(nullptr);
  std::_Exit(2);
}

}  // namespace

int nccl_watchdog_timeout_scenario() {
  if (no_device()) return kScenarioSkipped;
  auto world = make_world_communicator(Backend::Nccl, RendezvousInfo::from_env());
  auto& nc = dynamic_cast<NcclCommunicator&>(*world);
  DevBuf a(inputs(0, 1000));
  try {
    // Inside a submitted op (after the watchdog marked its start), a sleeping
    // host function holds the communication stream, so the op cannot
    // complete within DS_COMM_TIMEOUT of its start.
    CommHandle h = nc.submit("all_reduce", [&] {
      cudaHostFn_t hold = [](void*) { std::this_thread::sleep_for(std::chrono::seconds(4)); };
      if (cudaLaunchHostFunc(static_cast<cudaStream_t>(nc.comm_stream()), hold, nullptr) != cudaSuccess)
        throw std::runtime_error("cudaLaunchHostFunc");
      nc.all_reduce(a.p, 1000, DType::F32, ReduceOp::Sum);
    });
    h.wait();  // the compute stream waits; the host does not
    std::printf("all_reduce enqueued\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // the watchdog ends the process meanwhile
    world->all_reduce(a.p, 1000, DType::F32, ReduceOp::Sum);       // or (abort mode) this throws its error
  } catch (const std::exception& e) {
    report_and_exit(e);
  }
  std::printf("FAIL: no watchdog error after the deadline\n");
  std::fflush(nullptr);
  std::_Exit(1);
}

int nccl_dead_peer_scenario() {
  if (no_device()) return kScenarioSkipped;
  auto world = make_world_communicator(Backend::Nccl, RendezvousInfo::from_env());
  world->barrier();
  const char* die = std::getenv("DS_TEST_DIE_RANK");
  if (die && std::atoi(die) == world->rank()) std::_Exit(3);
  DevBuf a(inputs(world->rank(), 100000));
  try {
    for (int i = 0; i < 50; ++i) world->all_reduce(a.p, 100000, DType::F32, ReduceOp::Sum);
    world->synchronize();  // the host waits here until the watchdog ends the process (or throws)
  } catch (const std::exception& e) {
    report_and_exit(e);
  }
  std::printf("FAIL: all_reduce with a dead peer completed\n");
  std::fflush(nullptr);
  std::_Exit(1);
}
#endif

}  // namespace ds::test

// ds_comm_worker: one rank of a multi-process communication test, started by
// proc_harness with the dsrun rank environment. argv[1] names the scenario.
// Exit 0 = all checks passed; 1 = a check failed; 2 = an exception (its
// message is printed after "ERROR: ", or "USER ERROR: " for a ds::UserError;
// the tests match on it); 3 = a deliberate death.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/communicator.h"
#include "lib/optim/onebit_exchange.h"
#include "lib/comm/tcp_store.h"
#include "lib/core/error.h"
#include "lib/core/rng.h"
#include "lib/parallel/comms.h"
#include "test/comm/nccl_scenario.h"
#include "test/comm/onebit_ref.h"

namespace ds {
namespace test {
int onebit_optimizers_scenario();  // onebit_optim_scenario.cpp
}
namespace {

#define WCHECK(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond))                                                                  \
      throw std::logic_error(fmt::format("{}:{} check failed: {}: ", __FILE__, __LINE__, #cond) + \
                             fmt::format(__VA_ARGS__));                           \
  } while (0)

// Input element i of `rank` for test `seed`: varied magnitudes so that the
// summation order shows in the rounding.
float value(uint64_t seed, int rank, int64_t i) {
  return static_cast<float>(normal_at(seed, rank, i) * std::ldexp(1.0, static_cast<int>(i % 9) - 4));
}

Tensor filled(uint64_t seed, int rank, int64_t n) {
  Tensor t = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = value(seed, rank, i);
  return t;
}

// Sum (or max) over ranks 0..n-1 in rank order, as the Gloo backend promises.
float expected(uint64_t seed, int n, int64_t i, ReduceOp op) {
  float acc = value(seed, 0, i);
  for (int r = 1; r < n; ++r) acc = op == ReduceOp::Sum ? acc + value(seed, r, i)
                                                        : std::max(acc, value(seed, r, i));
  return acc;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

void check_all_reduce(Communicator& c, uint64_t seed, int64_t n, ReduceOp op) {
  Tensor t = filled(seed, c.rank(), n);
  c.all_reduce(t, op);
  for (int64_t i = 0; i < n; ++i)
    WCHECK(same_bits(t.data<float>()[i], expected(seed, c.size(), i, op)),
           "all_reduce n={} i={}: {} vs {}", n, i, t.data<float>()[i], expected(seed, c.size(), i, op));
}

void check_typed_all_reduce(Communicator& c) {
  const int n = c.size(), me = c.rank();
  Tensor a = Tensor::empty({37}, DType::I32), b = Tensor::empty({37}, DType::I64);
  Tensor h = Tensor::empty({300}, DType::BF16);
  for (int i = 0; i < 37; ++i) {
    a.data<int32_t>()[i] = (me + 1) * 1000 + i;
    b.data<int64_t>()[i] = (int64_t(1) << 40) * (me + 1) - i;
  }
  for (int i = 0; i < 300; ++i) h.data<uint16_t>()[i] = f32_to_bf16(value(7, me, i));
  c.all_reduce(a);
  c.all_reduce(b, ReduceOp::Max);
  c.all_reduce(h);
  for (int i = 0; i < 37; ++i) {
    WCHECK(a.data<int32_t>()[i] == 1000 * n * (n + 1) / 2 + n * i, "i32 sum i={}", i);
    WCHECK(b.data<int64_t>()[i] == (int64_t(1) << 40) * n - i, "i64 max i={}", i);
  }
  for (int i = 0; i < 300; ++i) {
    float acc = bf16_to_f32(f32_to_bf16(value(7, 0, i)));
    for (int r = 1; r < n; ++r) acc += bf16_to_f32(f32_to_bf16(value(7, r, i)));
    WCHECK(h.data<uint16_t>()[i] == f32_to_bf16(acc), "bf16 sum i={}", i);
  }
}

void check_reduce_scatter(Communicator& c, uint64_t seed, int64_t per) {
  const int n = c.size(), me = c.rank();
  Tensor in = filled(seed, me, per * n);
  Tensor out = Tensor::empty({per}, DType::F32);
  c.reduce_scatter(in, out);
  for (int64_t j = 0; j < per; ++j)
    WCHECK(same_bits(out.data<float>()[j], expected(seed, n, me * per + j, ReduceOp::Sum)),
           "reduce_scatter per={} j={}", per, j);
  // In place (output = own chunk of input), and bit-equal to all_reduce.
  Tensor inplace = filled(seed, me, per * n);
  c.reduce_scatter(inplace, inplace.view(me * per, {per}));
  Tensor ar = filled(seed, me, per * n);
  c.all_reduce(ar);
  WCHECK(std::memcmp(inplace.data<float>() + me * per, out.raw(), per * 4) == 0, "in-place rs");
  WCHECK(std::memcmp(ar.data<float>() + me * per, out.raw(), per * 4) == 0, "rs vs all_reduce");
}

void check_all_gather(Communicator& c, int64_t per) {
  const int n = c.size(), me = c.rank();
  Tensor in = filled(11, me, per);
  Tensor out = Tensor::empty({per * n}, DType::F32);
  c.all_gather(in, out);
  for (int r = 0; r < n; ++r)
    for (int64_t j = 0; j < per; ++j)
      WCHECK(same_bits(out.data<float>()[r * per + j], value(11, r, j)), "all_gather r={} j={}", r, j);
  Tensor bytes = Tensor::empty({per * n}, DType::U8);  // in place, another dtype
  for (int64_t j = 0; j < per; ++j) bytes.data<uint8_t>()[me * per + j] = uint8_t(me * 31 + j);
  c.all_gather(bytes.view(me * per, {per}), bytes);
  for (int r = 0; r < n; ++r)
    for (int64_t j = 0; j < per; ++j)
      WCHECK(bytes.data<uint8_t>()[r * per + j] == uint8_t(r * 31 + j), "u8 all_gather");
}

// Chunk j of member i's input lands as chunk i of member j's output, bit for
// bit, in f32 and in a 2-byte type; a size mismatch is refused.
void check_all_to_all(Communicator& c, int64_t per) {
  const int n = c.size(), me = c.rank();
  Tensor in = filled(300 + per, me, per * n), out = Tensor::empty({per * n}, DType::F32);
  c.all_to_all(in, out);
  for (int r = 0; r < n; ++r)
    for (int64_t j = 0; j < per; ++j)
      WCHECK(same_bits(out.data<float>()[r * per + j], value(300 + per, r, me * per + j)),
             "all_to_all per={} from {} j={}", per, r, j);
  Tensor h_in = Tensor::empty({per * n}, DType::BF16), h_out = Tensor::empty({per * n}, DType::BF16);
  for (int64_t i = 0; i < per * n; ++i) h_in.data<uint16_t>()[i] = static_cast<uint16_t>(me * 7919 + i);
  c.all_to_all(h_in, h_out);
  for (int r = 0; r < n; ++r)
    for (int64_t j = 0; j < per; ++j)
      WCHECK(h_out.data<uint16_t>()[r * per + j] == static_cast<uint16_t>(r * 7919 + me * per + j),
             "bf16 all_to_all from {} j={}", r, j);
  if (n > 1 && per > 0) {
    bool refused = false;
    try {
      c.all_to_all(in.view(0, {per * n - 1}), out.view(0, {per * n - 1}));
    } catch (const Error&) {
      refused = true;
    }
    WCHECK(refused, "all_to_all of {} elements over {} members was accepted", per * n - 1, n);
  }
}

void check_broadcast_p2p(Communicator& c) {
  const int n = c.size(), me = c.rank();
  for (int root = 0; root < n; ++root) {
    Tensor t = filled(100 + root, me, 1003);
    c.broadcast(t, root);
    for (int64_t i = 0; i < 1003; ++i)
      WCHECK(same_bits(t.data<float>()[i], value(100 + root, root, i)), "broadcast root={}", root);
  }
  // Ring: even ranks send first, odd ranks receive first; three messages of
  // different sizes per hop must arrive in order.
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  auto do_send = [&] {
    for (int k = 0; k < 3; ++k) c.send(filled(200 + k, me, 10 + 500 * k), next);
  };
  auto do_recv = [&] {
    for (int k = 0; k < 3; ++k) {
      Tensor t = Tensor::empty({10 + 500 * k}, DType::F32);
      c.recv(t, prev);
      for (int64_t i = 0; i < t.numel(); ++i)
        WCHECK(same_bits(t.data<float>()[i], value(200 + k, prev, i)), "recv k={} i={}", k, i);
    }
  };
  if (me % 2 == 0) {
    do_send();
    do_recv();
  } else {
    do_recv();
    do_send();
  }
  c.barrier();
}

void run_suite(Communicator& c, uint64_t seed) {
  for (int64_t n : {0, 1, 5, 1001, 40000}) check_all_reduce(c, seed + n, n, ReduceOp::Sum);
  check_all_reduce(c, seed + 1, 777, ReduceOp::Max);
  check_typed_all_reduce(c);
  for (int64_t per : {1, 333, 5000}) check_reduce_scatter(c, seed + per, per);
  for (int64_t per : {1, 7, 2049}) check_all_gather(c, per);
  for (int64_t per : {0, 1, 13, 3001}) check_all_to_all(c, per);
  check_broadcast_p2p(c);
}

int scenario_collectives() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  run_suite(*world, 1);
  Tensor a = filled(5, world->rank(), 4097), b = filled(5, world->rank(), 4097);
  world->all_reduce(a);
  world->all_reduce(b);
  WCHECK(std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0, "repeat all_reduce differs");
  return 0;
}

// World of 4: pairs, strided pairs, a reversed group, and build_comms(TP 2, PP 2).
int scenario_groups() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  const int me = world->rank();
  WCHECK(world->size() == 4, "needs 4 ranks");
  auto pair = world->split(me < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3},
                           "pair/" + std::to_string(me / 2));
  auto stride = world->split(me % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3},
                             "stride/" + std::to_string(me % 2));
  auto rev = world->split({3, 2, 1, 0}, "rev");
  WCHECK(rev->rank() == 3 - me && rev->world_ranks()[0] == 3, "reversed group ranks");
  for (Communicator* g : {pair.get(), stride.get(), rev.get()}) {
    run_suite(*g, 40 + g->world_ranks()[0]);
    Tensor ids = Tensor::empty({g->size()}, DType::I32);
    Tensor mine = Tensor::empty({1}, DType::I32);
    mine.data<int32_t>()[0] = me;
    g->all_gather(mine, ids);
    for (int i = 0; i < g->size(); ++i)
      WCHECK(ids.data<int32_t>()[i] == g->world_ranks()[i], "group {} member {}", g->name(), i);
  }
  RankGrid grid = make_rank_grid(4, 2, 2, me);
  Comms comms = build_comms(*world, grid);
  const std::vector<std::pair<Communicator*, std::vector<int>>> expect = {
      {comms.tp, grid.my_tp_group()}, {comms.dp, grid.my_dp_group()},
      {comms.pp, grid.my_pp_group()}, {comms.embedding, grid.embedding_groups[grid.pp_index]}};
  for (const auto& [g, ranks] : expect) {
    WCHECK(g && g->world_ranks() == ranks, "comms group {}", g ? g->name() : "null");
    Tensor ids = Tensor::empty({g->size()}, DType::I32), mine = Tensor::empty({1}, DType::I32);
    mine.data<int32_t>()[0] = me;
    g->all_gather(mine, ids);
    for (int i = 0; i < g->size(); ++i) WCHECK(ids.data<int32_t>()[i] == ranks[i], "{}", g->name());
  }
  WCHECK(comms.pp->rank() == grid.pp_rank && comms.tp->rank() == grid.tp_rank, "group ranks");
  world->barrier();
  return 0;
}

// World of 4, EP 2 (DP 4): ep groups {0, 1}, {2, 3}; edp groups {0, 2}, {1, 3}.
int scenario_expert_groups() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  const int me = world->rank();
  WCHECK(world->size() == 4, "needs 4 ranks");
  const RankGrid grid = make_rank_grid(4, 1, 1, me, 1, 2);
  Comms comms = build_comms(*world, grid);
  WCHECK(comms.ep->world_ranks() == grid.my_ep_group() && comms.edp->world_ranks() == grid.my_edp_group(),
         "ep/edp groups");
  WCHECK(comms.ep->rank() == grid.ep_rank && comms.edp->rank() == grid.edp_rank, "ep/edp group ranks");
  // Each rank contributes rank + 1: the sums name the members.
  const int ep_sum = me / 2 == 0 ? 1 + 2 : 3 + 4, edp_sum = me % 2 == 0 ? 1 + 3 : 2 + 4;
  for (auto [g, want] : {std::pair{comms.ep, ep_sum}, {comms.edp, edp_sum}, {comms.dp, 10}}) {
    Tensor t = Tensor::empty({3}, DType::F32);
    for (int i = 0; i < 3; ++i) t.data<float>()[i] = float(me + 1);
    g->all_reduce(t);
    for (int i = 0; i < 3; ++i) WCHECK(t.data<float>()[i] == float(want), "{} sum", g->name());
  }
  world->barrier();
  return 0;
}

int die_rank() {
  const char* v = std::getenv("DS_TEST_DIE_RANK");
  return v ? std::atoi(v) : -1;
}

int scenario_die_before_join() {
  RendezvousInfo info = RendezvousInfo::from_env();
  if (info.rank == die_rank()) return 3;
  make_world_communicator(Backend::Gloo, info);
  return 0;
}

// The dying rank reaches the store, then vanishes without a goodbye.
int scenario_die_in_join() {
  RendezvousInfo info = RendezvousInfo::from_env();
  if (info.rank == die_rank()) {
    TcpStoreOptions o;
    o.host = info.master_addr;
    o.port = info.master_port;
    o.token = info.token;
    o.rank = info.rank;
    o.timeout = info.timeout;
    TcpStore s(o);
    s.set("hello", "1");
    _exit(3);
  }
  make_world_communicator(Backend::Gloo, info);
  return 0;
}

int scenario_die_in_collective() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  world->barrier();
  if (world->rank() == die_rank()) _exit(3);
  Tensor t = filled(1, world->rank(), 100000);
  for (int i = 0; i < 50; ++i) world->all_reduce(t);
  return 0;
}

// A rank stops itself (SIGSTOP) after the barrier, as a rank frozen by a
// debugger or a job scheduler: the others' all_reduce waits for its part
// until DS_COMM_TIMEOUT and fails with a user error naming it. A helper
// process continues the stopped rank a few seconds after the timeout, and
// it exits.
int scenario_stop_in_collective() {
  RendezvousInfo info = RendezvousInfo::from_env();
  auto world = make_world_communicator(Backend::Gloo, info);
  world->barrier();
  if (world->rank() == die_rank()) {
    const pid_t me = getpid();
    const pid_t helper = fork();
    if (helper == 0) {
      std::this_thread::sleep_for(info.op_timeout + std::chrono::seconds(3));
      kill(me, SIGCONT);
      _exit(0);
    }
    raise(SIGSTOP);
    _exit(3);
  }
  Tensor t = filled(1, world->rank(), 1000);
  world->all_reduce(t);
  return 0;
}

// The receiver of a large message exits part-way through it, leaving unread
// bytes in its socket: the kernel answers the sender's next write with a
// reset, so the sender meets EPIPE in the middle of writev(). That must end
// as an error naming the op (exit 2), not as a SIGPIPE death (exit 141).
int scenario_die_mid_receive() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  const int64_t n = int64_t(64) << 20;  // 256 MB of f32: far more than a socket buffer holds
  Tensor small = filled(2, 0, 16);
  if (world->rank() == die_rank()) {
    world->recv(small, 0);  // both ends are connected and in step
    Tensor big = Tensor::empty({n}, DType::F32);
    CommHandle h = world->irecv(big, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    _exit(3);
  }
  // Which write meets the reset is a race with Gloo's device thread reading
  // the peer's close, so first the deterministic form: a write to a socket
  // whose other end is closed, from a rank that holds a Gloo communicator.
  int sv[2];
  DS_CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair failed");
  close(sv[1]);
  const char byte = 0;
  const ssize_t w = write(sv[0], &byte, 1);  // SIGPIPE here would end this rank with 141
  const int write_errno = errno;
  close(sv[0]);
  if (w != -1 || write_errno != EPIPE) throw std::logic_error("write to a closed socket did not fail with EPIPE");
  world->send(small, die_rank());
  Tensor big = filled(3, 0, n);
  for (int i = 0; i < 4; ++i) world->send(big, die_rank());
  return 0;
}

// Async forms: a mixed sequence issued asynchronously (several ops in
// flight, dependent ops on one buffer without waiting between them, a
// blocking op issued while async ones are pending) is bit-identical to the
// same sequence issued blocking, on every rank; handles complete in order.
struct SequenceResult {
  std::vector<Tensor> outs;
};

SequenceResult run_sequence(Communicator& c, bool async) {
  const int n = c.size(), me = c.rank();
  SequenceResult r;
  Tensor a = filled(21, me, 40001), b = filled(22, me, 777), rs_in = filled(23, me, 513 * n);
  Tensor rs_out = Tensor::empty({513}, DType::F32), ag_out = Tensor::empty({301 * n}, DType::F32);
  Tensor ag_in = filled(24, me, 301), bc = filled(25, me, 999), bf = Tensor::empty({300}, DType::BF16);
  for (int i = 0; i < 300; ++i) bf.data<uint16_t>()[i] = f32_to_bf16(value(26, me, i));
  Tensor sent = filled(27, me, 1500), got = Tensor::empty({1500}, DType::F32);
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  std::vector<P2POp> ring = {{true, sent.raw(), 1500, DType::F32, next, 0},
                             {false, got.raw(), 1500, DType::F32, prev, 0}};
  std::vector<CommHandle> hs;
  if (async) {
    hs.push_back(c.iall_reduce(a));
    hs.push_back(c.iall_reduce(a));  // depends on the first (issue order)
    hs.push_back(c.iall_reduce(b, ReduceOp::Max));
    hs.push_back(c.ireduce_scatter(rs_in, rs_out));
    hs.push_back(c.iall_gather(ag_in, ag_out));
    hs.push_back(c.ibroadcast(bc, n - 1));
    hs.push_back(c.iall_reduce(bf));
    hs.push_back(c.ibatch_send_recv(ring, {sent, got}));
    c.barrier();  // blocking, issued while the above may be pending: runs after them
    for (auto& h : hs) WCHECK(h.ready(), "an op issued before a blocking op is not complete after it");
    for (auto& h : hs) h.wait();
  } else {
    c.all_reduce(a);
    c.all_reduce(a);
    c.all_reduce(b, ReduceOp::Max);
    c.reduce_scatter(rs_in, rs_out);
    c.all_gather(ag_in, ag_out);
    c.broadcast(bc, n - 1);
    c.all_reduce(bf);
    c.batch_send_recv(ring);
    c.barrier();
  }
  r.outs = {a, b, rs_out, ag_out, bc, bf, got};
  return r;
}

// The 1-bit all-reduce (lib/optim/onebit_exchange.h) against a simulation of all
// ranks in this process, written from the formulas (every rank's input is a
// function of seed, rank, round and index): three rounds, so the worker and
// server errors are fed back; sizes that need padding and ones that do not.
// Also: the result is the same on every rank, the traffic count, and one
// round's result is within the compression's reach of the true mean.
namespace onebit_ref {

float input(int rank, int round, int64_t i, int64_t n) {
  const double u = std::sin(0.37 * static_cast<double>(i + 1) * (rank + 2) + 1.3 * round) +
                   (i % 7 == 0 ? 0.0 : 0.25 * std::cos(0.11 * static_cast<double>(i) + rank));
  return static_cast<float>(i == n / 2 ? 0.0 : u);  // one exact zero: its sign counts as +1
}

}  // namespace onebit_ref

int scenario_onebit() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  const int W = world->size(), me = world->rank();
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{1000}, int64_t{4096}}) {
    test::OneBitSim sim(W, n);
    OneBitErrors e;
    for (int round = 0; round < 3; ++round) {
      std::vector<float> x(n);
      for (int64_t i = 0; i < n; ++i) x[i] = onebit_ref::input(me, round, i, n);
      std::vector<float> mean(n, 0.f);
      for (int r = 0; r < W; ++r)
        for (int64_t i = 0; i < n; ++i) mean[i] += onebit_ref::input(r, round, i, n) / static_cast<float>(W);
      onebit_all_reduce(*world, x.data(), n, e);
      std::vector<std::vector<float>> inputs(W, std::vector<float>(n));
      for (int r = 0; r < W; ++r)
        for (int64_t i = 0; i < n; ++i) inputs[r][i] = onebit_ref::input(r, round, i, n);
      const std::vector<float> want = sim.reduce(inputs);
      for (int64_t i = 0; i < n; ++i)
        WCHECK(std::fabs(x[i] - want[i]) <= 1e-6f * std::fabs(want[i]), "n {} round {} element {}: {} vs {}", n,
               round, i, x[i], want[i]);
      for (int64_t i = 0; i < onebit_padded_size(n, W); ++i)
        WCHECK(std::fabs(e.worker.data<float>()[i] - sim.worker[me][i]) <= 1e-5f, "n {} round {} worker error {}", n, round, i);
      // Every rank holds the same result.
      std::vector<float> all(static_cast<size_t>(n) * W);
      world->all_gather(x.data(), all.data(), n, DType::F32);
      for (int r = 0; r < W; ++r)
        WCHECK(std::memcmp(all.data() + r * n, x.data(), n * 4) == 0, "n {}: rank {} holds another result", n, r);
      // The first round (no error yet) points where the mean points: two sign
      // compressions keep a cosine similarity well above 0 (about 0.6 for
      // Gaussian-like inputs).
      if (round == 0 && n >= 1000) {
        double dot = 0, xx = 0, mm = 0;
        for (int64_t i = 0; i < n; ++i) {
          dot += static_cast<double>(x[i]) * mean[i];
          xx += static_cast<double>(x[i]) * x[i];
          mm += static_cast<double>(mean[i]) * mean[i];
        }
        const double cosine = dot / std::sqrt(xx * mm);
        WCHECK(cosine > 0.4, "n {}: the compressed mean's cosine with the mean is {}", n, cosine);
      }
    }
  }
  // Traffic: per rank about n'/4 bytes of signs (two exchanges of n'/8 x (W-1)/W) and the scales.
  const int64_t n = 1 << 20, np = onebit_padded_size(n, W);
  WCHECK(onebit_bytes_sent(n, W) == 2 * (W - 1) * (np / W / 8) + 8 * (W - 1), "bytes {}", onebit_bytes_sent(n, W));
  return 0;
}

int scenario_async() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  SequenceResult blocking = run_sequence(*world, false);
  SequenceResult async = run_sequence(*world, true);
  for (size_t i = 0; i < blocking.outs.size(); ++i)
    WCHECK(std::memcmp(blocking.outs[i].raw(), async.outs[i].raw(), blocking.outs[i].nbytes()) == 0,
           "async result {} differs from the blocking one", i);
  // Many small ops in flight on two groups at once: results in issue order.
  // (ranks 0 and 1 also use a pair group, whose members are listed reversed)
  const bool in_pair = world->rank() < 2;
  std::unique_ptr<Communicator> sub = in_pair ? world->split({1, 0}, "async_pair") : nullptr;
  std::vector<Tensor> ts;
  std::vector<CommHandle> hs;
  for (int k = 0; k < 64; ++k) {
    ts.push_back(Tensor::empty({1}, DType::F32));
    ts.back().data<float>()[0] = static_cast<float>(k * (world->rank() + 1));
    if (k % 2) hs.push_back(world->iall_reduce(ts.back()));
    else if (in_pair) hs.push_back(sub->iall_reduce(ts.back()));
  }
  for (auto& h : hs) h.wait();
  const int n = world->size();
  for (int k = 0; k < 64; ++k) {
    if (k % 2 == 0 && !in_pair) continue;
    const int members = k % 2 ? n : 2;
    WCHECK(ts[k].data<float>()[0] == static_cast<float>(k * members * (members + 1) / 2), "op {} of 64", k);
  }
  world->wait_all();
  return 0;
}

// A peer that dies or never calls: the error surfaces through wait(), naming
// the op and the group; ops queued behind a failed one fail at once.
int scenario_async_fail() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  world->barrier();
  if (world->rank() == die_rank()) {
    if (std::getenv("DS_TEST_HANG")) std::this_thread::sleep_for(std::chrono::seconds(6));
    _exit(3);
  }
  Tensor t = filled(1, world->rank(), 100000), u = filled(2, world->rank(), 10);
  CommHandle h = world->iall_reduce(t);
  CommHandle behind = world->iall_reduce(u);
  try {
    h.wait();
  } catch (const std::exception& e) {
    std::printf("first wait: %s\n", e.what());
  }
  try {
    behind.wait();
  } catch (const std::exception& e) {
    std::printf("second wait: %s\n", e.what());
    return 2;
  }
  return 0;
}

// Not a test: all_reduce timing for a quick look (DS_BENCH_ELEMS, default 16M).
int scenario_bench() {
  auto world = make_world_communicator(Backend::Gloo, RendezvousInfo::from_env());
  const char* e = std::getenv("DS_BENCH_ELEMS");
  int64_t n = e ? std::atoll(e) : (int64_t(1) << 24);
  Tensor t = filled(1, world->rank(), n);
  world->all_reduce(t);
  auto t0 = std::chrono::steady_clock::now();
  const int iters = 5;
  for (int i = 0; i < iters; ++i) world->all_reduce(t);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  double bus = 2.0 * (world->size() - 1) / world->size() * n * 4 / s / 1e9;  // nccl-tests busbw
  std::printf("rank %d: all_reduce %lld f32: %.3f ms, bus bandwidth %.2f GB/s\n", world->rank(),
              static_cast<long long>(n), s * 1e3, bus);
  return 0;
}

}  // namespace
}  // namespace ds

int main(int argc, char** argv) {
  using namespace ds;
  std::map<std::string, std::function<int()>> scenarios = {
      {"collectives", scenario_collectives},
      {"groups", scenario_groups},
      {"expert_groups", scenario_expert_groups},
      {"die_before_join", scenario_die_before_join},
      {"die_in_join", scenario_die_in_join},
      {"die_in_collective", scenario_die_in_collective},
      {"die_mid_receive", scenario_die_mid_receive},
      {"stop_in_collective", scenario_stop_in_collective},
      {"nccl", test::nccl_scenario},
      {"nccl_watchdog_timeout", test::nccl_watchdog_timeout_scenario},
      {"nccl_dead_peer", test::nccl_dead_peer_scenario},
      {"bench", scenario_bench},
      {"async", scenario_async},
      {"onebit", scenario_onebit},
      {"onebit_optimizers", test::onebit_optimizers_scenario},
      {"async_fail", scenario_async_fail},
  };
  if (argc < 2 || !scenarios.count(argv[1])) {
    std::fprintf(stderr, "usage: ds_comm_worker <scenario>\n");
    return 64;
  }
  try {
    int rc = scenarios[argv[1]]();
    std::printf("rank %s: %s done (rc %d)\n", std::getenv("RANK"), argv[1], rc);
    return rc;
  } catch (const std::logic_error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  } catch (const UserError& e) {
    std::printf("USER ERROR: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::printf("ERROR: %s\n", e.what());
    return 2;
  }
}

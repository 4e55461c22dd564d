// The cudnn attention backend (cudnn_sdpa.h): causal SDPA forward and backward
// as cuDNN operation graphs through the backend API, on strided views of our
// packed qkv rows (no copies), one execution plan per (device, direction, B,
// T, NH, NKV, HS, dtype), kept for the life of the process.
//
// Forward graph (S, P virtual; f32 unless noted):
//   S = Q.K^T * scale; S = row >= col ? S : -inf (gen_index, cmp_ge,
//   binary_select; the lowest float instead of -inf before cuDNN 9.10);
//   M = max_row(S); E = exp(S - M); Z = sum_row(E);
//   Stats = M + log(Z)  -> lse (natural log, (B, NH, T) f32);
//   P = E / Z (bf16/f16); O = P.V
// Backward graph:
//   Dsum = sum_row(dO * O) * 1  (a real f32 tensor in our workspace);
//   S as in the forward; P = exp(S - Stats); dV = reshape(P)^T.dO;
//   dP = dO.V^T; dS = (dP - Dsum) * P * scale; dK = reshape(dS)^T.Q;
//   dQacc = dS.K (f32, our workspace); dQ = identity(dQacc).
// Grouped-query attention (NKV < NH): K and V carry NKV heads and the
// matmuls broadcast them over the NH / NKV query heads of a group; in the
// backward dK and dV are computed per query head and summed over the group
// by a reduction. This is the shape cuDNN's fused flash engines recognise.
#include "cuda/attn/cudnn_sdpa.h"

#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/attn/cudnn_api.h"
#include "cuda/core/allocator.h"
#include "cuda/core/capture.h"
#include "cuda/core/check.h"
#include "lib/core/log.h"

namespace ds::cuda {
namespace {

// Unique ids of the real tensors (the variant pack's keys); virtual tensors
// take ids from kFirstVirtual on.
enum Uid : int64_t {
  kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8, kDV = 9,
  kScale = 10, kNegInf = 11, kOne = 12, kDsum = 13, kDQacc = 14, kFirstVirtual = 100
};

// Deprecated in recent cuDNN headers (a device-property descriptor may replace
// the handle) but accepted by every cuDNN 9: named by value to keep the build
// quiet.
constexpr auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);  // OPERATIONGRAPH_HANDLE
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);   // EXECUTION_PLAN_HANDLE

// A graph that cannot be built or has no engine: the case falls back.
struct BuildFail : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string status_text(cudnnStatus_t st) {
  const CudnnApi& api = cudnn();
  std::string msg = api.GetErrorString(st);
  char detail[512] = {0};
  api.GetLastErrorString(detail, sizeof detail);
  if (detail[0] != 0) msg += std::string(": ") + detail;
  return msg;
}

void build_check(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS) throw BuildFail(std::string("cuDNN ") + what + ": " + status_text(st));
}

void run_check(cudnnStatus_t st, const char* what) {
  DS_CUDA_REQUIRE(st == CUDNN_STATUS_SUCCESS, std::string("cuDNN ") + what + ": " + status_text(st));
}

// One backend descriptor, destroyed with the object.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    build_check(cudnn().BackendCreateDescriptor(type, &d_), "create descriptor");
  }
  ~Desc() {
    if (d_ != nullptr) cudnn().BackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc& operator=(Desc&&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  template <class V>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const V* v, int64_t n = 1) {
    build_check(cudnn().BackendSetAttribute(d_, name, type, n, v), "set attribute");
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    cudnnBackendDescriptor_t h = other.get();
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &h);
  }
  Desc& set_type(cudnnBackendAttributeName_t name, cudnnDataType_t t) { return set(name, CUDNN_TYPE_DATA_TYPE, &t); }
  void finalize(const char* what) { build_check(cudnn().BackendFinalize(d_), what); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::array<int64_t, 4>;
enum class Kind { Real, Virtual, ByValue };

// Builds one operation graph: owns its tensors and operations.
class Graph {
 public:
  const Desc& tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides, Kind kind) {
    auto t = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    const bool is_virtual = kind == Kind::Virtual, by_value = kind == Kind::ByValue;
    t->set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, dt)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4)
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4)
        .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
    if (by_value) t->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
    t->finalize("tensor");
    keep_.push_back(std::move(t));
    return *keep_.back();
  }
  const Desc& virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return tensor(next_uid_++, dt, dims, strides, Kind::Virtual);
  }
  // A by-value f32 scalar (1, 1, 1, 1); one descriptor per uid, however
  // many operations read it.
  const Desc& scalar(int64_t uid) {
    auto it = scalars_.find(uid);
    if (it != scalars_.end()) return *it->second;
    const Desc& t = tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, Kind::ByValue);
    scalars_.emplace(uid, &t);
    return t;
  }

  void matmul(const Desc& a, const Desc& b, const Desc& c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set_type(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize("matmul");
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm)
        .finalize("matmul operation");
    add_op(std::move(mm), std::move(op));
  }
  // y = mode(x[, b][, t]); `axis` only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc& y, const Desc* t = nullptr,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode).set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    pw.finalize("pointwise");
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (b != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.finalize("pointwise operation");
    add_op(std::move(pw), std::move(op));
  }
  void reduction(cudnnReduceTensorOp_t how, const Desc& x, const Desc& y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &how)
        .set_type(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT)
        .finalize("reduction");
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red)
        .finalize("reduction operation");
    add_op(std::move(red), std::move(op));
  }
  // y: the same elements as x under other dims/strides (a transpose here).
  void reshape(const Desc& x, const Desc& y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize("reshape operation");
    ops_.push_back(op.get());
    keep_.push_back(std::make_unique<Desc>(std::move(op)));
  }
  // The finalized operation graph (kept with its parts).
  const Desc& finish(cudnnHandle_t handle) {
    auto g = std::make_unique<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(), int64_t(ops_.size()))
        .set(kGraphHandle, CUDNN_TYPE_HANDLE, &handle)
        .finalize("operation graph");
    keep_.push_back(std::move(g));
    return *keep_.back();
  }

 private:
  void add_op(Desc&& attr, Desc&& op) {
    ops_.push_back(op.get());
    keep_.push_back(std::make_unique<Desc>(std::move(attr)));
    keep_.push_back(std::make_unique<Desc>(std::move(op)));
  }
  std::vector<std::unique_ptr<Desc>> keep_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::map<int64_t, const Desc*> scalars_;
  int64_t next_uid_ = kFirstVirtual;
};

// Element dims and strides of the views of one problem.
struct Views {
  int64_t B, T, NH, NKV, HS, W;  // W: elements per packed qkv row
  Dims q() const { return {B, NH, T, HS}; }
  Dims q_str() const { return {T * W, HS, W, 1}; }
  Dims kv() const { return {B, NKV, T, HS}; }  // K, V, dK, dV; same strides as Q
  Dims kt() const { return {B, NKV, HS, T}; }
  Dims kt_str() const { return {T * W, HS, 1, W}; }
  Dims o_str() const { return {T * NH * HS, HS, NH * HS, 1}; }  // O, dO: (B, T, NH*HS) rows
  Dims packed_q_str() const { return {NH * T * HS, T * HS, HS, 1}; }
  Dims s() const { return {B, NH, T, T}; }
  Dims s_str() const { return {NH * T * T, T * T, T, 1}; }
  Dims st_str() const { return {NH * T * T, T * T, 1, T}; }  // S^T's view of the same elements
  Dims row() const { return {B, NH, T, 1}; }
  Dims row_str() const { return {NH * T, T, 1, 1}; }
};

// S = Q.K^T * scale, causally masked.
const Desc& masked_scores(Graph& g, const Views& v, const Desc& q, const Desc& kt) {
  const auto F = CUDNN_DATA_FLOAT;
  const Desc& s0 = g.virt(F, v.s(), v.s_str());
  g.matmul(q, kt, s0);
  const Desc& s1 = g.virt(F, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_MUL, s0, &g.scalar(kScale), s1);
  const Desc& row = g.virt(CUDNN_DATA_INT32, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s1, nullptr, row, nullptr, CUDNN_DATA_INT32, 2);
  const Desc& col = g.virt(CUDNN_DATA_INT32, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s1, nullptr, col, nullptr, CUDNN_DATA_INT32, 3);
  const Desc& keep = g.virt(CUDNN_DATA_BOOLEAN, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, keep, nullptr, CUDNN_DATA_BOOLEAN);
  const Desc& s2 = g.virt(F, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s1, &g.scalar(kNegInf), s2, &keep);
  return s2;
}

void build_forward(Graph& g, const Views& v, cudnnDataType_t io) {
  const auto F = CUDNN_DATA_FLOAT;
  const Desc& q = g.tensor(kQ, io, v.q(), v.q_str(), Kind::Real);
  const Desc& kt = g.tensor(kK, io, v.kt(), v.kt_str(), Kind::Real);
  const Desc& val = g.tensor(kV, io, v.kv(), v.q_str(), Kind::Real);
  const Desc& o = g.tensor(kO, io, v.q(), v.o_str(), Kind::Real);
  const Desc& stats = g.tensor(kStats, F, v.row(), v.row_str(), Kind::Real);
  const Desc& s = masked_scores(g, v, q, kt);
  const Desc& m = g.virt(F, v.row(), v.row_str());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, m);
  const Desc& sm = g.virt(F, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_SUB, s, &m, sm);
  const Desc& e = g.virt(F, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_EXP, sm, nullptr, e);
  const Desc& z = g.virt(F, v.row(), v.row_str());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  const Desc& logz = g.virt(F, v.row(), v.row_str());
  g.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, logz);
  g.pointwise(CUDNN_POINTWISE_ADD, m, &logz, stats);
  const Desc& p = g.virt(io, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_DIV, e, &z, p);
  g.matmul(p, val, o);
}

// dK or dV: one matmul into the real tensor, or (grouped-query) per query
// head into a virtual tensor summed over each group.
void head_grad(Graph& g, const Views& v, cudnnDataType_t io, const Desc& a, const Desc& b, const Desc& out) {
  if (v.NKV == v.NH) {
    g.matmul(a, b, out);
    return;
  }
  const Desc& full = g.virt(io, v.q(), v.packed_q_str());
  g.matmul(a, b, full);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

void build_backward(Graph& g, const Views& v, cudnnDataType_t io) {
  const auto F = CUDNN_DATA_FLOAT;
  const Desc& q = g.tensor(kQ, io, v.q(), v.q_str(), Kind::Real);
  const Desc& kt = g.tensor(kK, io, v.kt(), v.kt_str(), Kind::Real);
  const Desc& vt = g.tensor(kV, io, v.kt(), v.kt_str(), Kind::Real);
  const Desc& o = g.tensor(kO, io, v.q(), v.o_str(), Kind::Real);
  const Desc& d_o = g.tensor(kDO, io, v.q(), v.o_str(), Kind::Real);
  const Desc& stats = g.tensor(kStats, F, v.row(), v.row_str(), Kind::Real);
  const Desc& dq = g.tensor(kDQ, io, v.q(), v.q_str(), Kind::Real);
  const Desc& dk = g.tensor(kDK, io, v.kv(), v.q_str(), Kind::Real);
  const Desc& dv = g.tensor(kDV, io, v.kv(), v.q_str(), Kind::Real);
  const Desc& dsum = g.tensor(kDsum, F, v.row(), v.row_str(), Kind::Real);
  const Desc& dq_acc = g.tensor(kDQacc, F, v.q(), v.packed_q_str(), Kind::Real);
  // Dsum = rowsum(dO * O)
  const Desc& dd = g.virt(F, v.q(), v.packed_q_str());
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, &o, dd);
  const Desc& dr = g.virt(F, v.row(), v.row_str());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dd, dr);
  g.pointwise(CUDNN_POINTWISE_MUL, dr, &g.scalar(kOne), dsum);
  // P = exp(S - Stats); dV = P^T.dO
  const Desc& s = masked_scores(g, v, q, kt);
  const Desc& sl = g.virt(F, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_SUB, s, &stats, sl);
  const Desc& p = g.virt(F, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_EXP, sl, nullptr, p);
  const Desc& pt = g.virt(io, v.s(), v.st_str());
  g.reshape(p, pt);
  head_grad(g, v, io, pt, d_o, dv);
  // dS = (dO.V^T - Dsum) * P * scale
  const Desc& dp = g.virt(F, v.s(), v.s_str());
  g.matmul(d_o, vt, dp);
  const Desc& dp1 = g.virt(F, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_SUB, dp, &dsum, dp1);
  const Desc& dp2 = g.virt(F, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_MUL, dp1, &p, dp2);
  const Desc& ds = g.virt(F, v.s(), v.s_str());
  g.pointwise(CUDNN_POINTWISE_MUL, dp2, &g.scalar(kScale), ds);
  // dK = dS^T.Q; dQ = dS.K (f32 accumulator, then cast)
  const Desc& dst = g.virt(io, v.s(), v.st_str());
  g.reshape(ds, dst);
  head_grad(g, v, io, dst, q, dk);
  const Desc& k = g.virt(io, v.kv(), v.q_str());
  g.reshape(kt, k);
  g.matmul(ds, k, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, nullptr, dq);
}

struct Plan {
  std::unique_ptr<Graph> graph;  // the graph's parts, alive as long as the plan
  std::unique_ptr<Desc> cfg;     // the engine configuration the plan was finalized with, as long as the plan
  std::unique_ptr<Desc> plan;
  int64_t workspace = 0;
};

// The first engine configuration the heuristics offer that finalizes, into
// out.cfg / out.plan / out.workspace.
void pick_engine(cudnnHandle_t handle, const Desc& graph, Plan& out) {
  const CudnnApi& api = cudnn();
  std::string last = "the heuristics offered no engine";
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    try {
      heur.finalize("engine heuristics");
    } catch (const BuildFail& e) {
      last = e.what();
      continue;
    }
    int64_t n = 0;
    build_check(api.BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                        &n, nullptr),
                "heuristics count");
    std::vector<Desc> cfgs;
    cfgs.reserve(size_t(n));
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < n; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(cfgs.back().get());
    }
    int64_t got = 0;
    if (n > 0)
      build_check(api.BackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                          n, &got, raw.data()),
                  "heuristics results");
    for (int64_t i = 0; i < got; ++i) {
      try {
        auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan->set(kPlanHandle, CUDNN_TYPE_HANDLE, &handle).set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[size_t(i)]);
        plan->finalize("execution plan");
        int64_t count = 0;
        build_check(api.BackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                            &count, &out.workspace),
                    "workspace size");
        out.cfg = std::make_unique<Desc>(std::move(cfgs[size_t(i)]));
        out.plan = std::move(plan);
        return;
      } catch (const BuildFail& e) {
        last = e.what();
      }
    }
  }
  throw BuildFail("no engine runs this graph (" + last + ")");
}

enum class Dir { Forward, Backward };
using Key = std::tuple<int, int, int64_t, int64_t, int, int, int, int>;  // device, dir, B, T, NH, NKV, HS, dtype

struct Cache {
  std::mutex mu;
  std::mutex exec_mu;  // a handle's stream is set per execution: set + execute are one step
  std::map<int, cudnnHandle_t> handles;          // per device
  std::map<Key, std::shared_ptr<Plan>> plans;    // built
  std::map<Key, std::string> failed;             // why a key has no plan
};
Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: plans outlive static teardown order
  return *c;
}

// The cached plan of a problem (built on first use), or a BuildFail.
std::shared_ptr<Plan> plan_for(Dir dir, const AttnShape& sh, DType dt) {
  int dev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  const Key key{dev, int(dir), sh.B, sh.T, sh.NH, sh.NKV, sh.HS, int(dt)};
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (auto it = c.plans.find(key); it != c.plans.end()) return it->second;
  if (auto it = c.failed.find(key); it != c.failed.end()) throw BuildFail(it->second);
  const CudnnApi& api = cudnn();
  auto h = c.handles.find(dev);
  if (h == c.handles.end()) {
    if (c.handles.empty())
      log_line(false, "attention backend cudnn: cuDNN " + std::to_string(api.version) + " from " + api.path);
    cudnnHandle_t handle = nullptr;
    run_check(api.Create(&handle), "cudnnCreate");
    h = c.handles.emplace(dev, handle).first;
  }
  try {
    auto plan = std::make_shared<Plan>();
    plan->graph = std::make_unique<Graph>();
    const Views v{sh.B, sh.T, sh.NH, sh.NKV, sh.HS, int64_t(sh.NH + 2 * sh.NKV) * sh.HS};
    const cudnnDataType_t io = dt == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    if (dir == Dir::Forward)
      build_forward(*plan->graph, v, io);
    else
      build_backward(*plan->graph, v, io);
    const Desc& graph = plan->graph->finish(h->second);
    pick_engine(h->second, graph, *plan);
    c.plans.emplace(key, plan);
    return plan;
  } catch (const BuildFail& e) {
    c.failed.emplace(key, e.what());
    throw;
  }
}

// Why the cuDNN graphs do not take this case ("" when they may).
std::string cudnn_unsupported(const AttnShape& sh, DType dt, const DropoutSpec& dropout,
                              std::initializer_list<const Tensor*> ptrs) {
  if (dt != DType::BF16 && dt != DType::F16)
    return std::string("dtype ") + dtype_name(dt) + ": cuDNN's fused attention runs bf16 and f16";
  if (sh.HS % 8 != 0 || sh.HS > 128)
    return "head size " + std::to_string(sh.HS) + ": the cudnn backend takes multiples of 8 up to 128";
  // cuDNN's own frontend refuses these too: its fused SDPA backward does not
  // take a sequence of one (nor, before 9.10, a causal forward of one), and
  // 9.10.0/9.10.1 have known SDPA bugs.
  if (sh.T == 1) return "sequence length 1: cuDNN's fused attention does not take it";
  const size_t v = cudnn().version;
  if (v == 91000 || v == 91001)
    return "cuDNN " + std::to_string(v) + " has known fused-attention bugs (use 9.10.2 or later)";
  // Any dropout, a per-step key in memory (step_key) included, stays off cuDNN.
  if (dropout.p > 0) return "attention dropout: the cudnn graphs do not draw the project's dropout masks";
  for (const Tensor* t : ptrs)
    if ((reinterpret_cast<uintptr_t>(t->raw()) & 15) != 0) return "a tensor is not 16-byte aligned";
  return "";
}

cudnnHandle_t handle_of_device() {
  int dev = 0;
  DS_CUDA_CHECK(cudaGetDevice(&dev));
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.handles.at(dev);
}

// Runs the plan on stream s. The device's one handle takes the stream per
// call, so setting it and executing hold one lock (two threads on the device
// never run on each other's stream).
void execute(const Plan& plan, const Stream& s, std::vector<int64_t> uids, std::vector<void*> ptrs, void* ws) {
  const cudnnHandle_t h = handle_of_device();
  try {
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), int64_t(uids.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), int64_t(ptrs.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &ws);
    pack.finalize("variant pack");
    std::lock_guard<std::mutex> lock(cache().exec_mu);
    run_check(cudnn().SetStream(h, resolve_stream(s.handle)), "cudnnSetStream");
    run_check(cudnn().BackendExecute(h, plan.plan->get(), pack.get()), "execute");
  } catch (const BuildFail& e) {  // the plan exists: a failure here is an error, not a fallback
    DS_CUDA_REQUIRE(false, std::string(e.what()));
  }
}

// The value masked scores take: -inf, or the lowest finite float before
// cuDNN 9.10, whose fused softmax expects that instead.
float mask_value() {
  return cudnn().version < 91000 ? std::numeric_limits<float>::lowest() : -INFINITY;
}

size_t round_up(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

std::string cudnn_attention_forward(const AttentionArgs& a, const AttnShape& sh, const Stream& s) {
  cudnn();  // a cuDNN that cannot be loaded is an error, not a fallback
  const DType dt = a.qkv.dtype();
  std::string why = cudnn_unsupported(sh, dt, a.dropout, {&a.qkv, &a.out, &a.lse});
  if (!why.empty()) return why;
  std::shared_ptr<Plan> plan;
  try {
    plan = plan_for(Dir::Forward, sh, dt);
  } catch (const BuildFail& e) {
    return e.what();
  }
  const size_t elt = dtype_size(dt);
  char* qkv = static_cast<char*>(a.qkv.raw());
  float scale = float(1.0 / std::sqrt(double(sh.HS))), neg_inf = mask_value();
  void* ws = plan->workspace > 0 ? stream_workspace(s, size_t(plan->workspace), WorkspaceSlot::Attn) : nullptr;
  execute(*plan, s, {kQ, kK, kV, kO, kStats, kScale, kNegInf},
          {qkv, qkv + elt * size_t(sh.NH) * sh.HS, qkv + elt * size_t(sh.NH + sh.NKV) * sh.HS, a.out.raw(),
           a.lse.raw(), &scale, &neg_inf},
          ws);
  return "";
}

std::string cudnn_attention_backward(const AttentionBwdArgs& a, const AttnShape& sh, const Stream& s) {
  cudnn();  // a cuDNN that cannot be loaded is an error, not a fallback
  const DType dt = a.qkv.dtype();
  std::string why = cudnn_unsupported(sh, dt, a.dropout, {&a.qkv, &a.dqkv, &a.out, &a.dout, &a.lse});
  if (!why.empty()) return why;
  // NVIDIA's frontend gives every SDPA backward whose sequence is not a
  // multiple of 128 SEQ_LEN_Q / SEQ_LEN_KV padding masks on cuDNN <= 9.15,
  // where outputs without them have been reported NaN; this graph builds no
  // such masks, so those shapes go to the flash kernels (logged once).
  if (sh.T % 128 != 0 && cudnn().version < 91600)
    return "sequence length " + std::to_string(sh.T) + " is not a multiple of 128: cuDNN " +
           std::to_string(cudnn().version) + "'s backward wants padding masks there, which this graph does not build";
  std::shared_ptr<Plan> plan;
  try {
    plan = plan_for(Dir::Backward, sh, dt);
  } catch (const BuildFail& e) {
    return e.what();
  }
  const size_t elt = dtype_size(dt);
  // Our workspace: Dsum (B, NH, T) f32, the dQ accumulator (B, NH, T, HS)
  // f32 (zeroed), then cuDNN's own.
  const size_t dsum_bytes = round_up(sizeof(float) * size_t(sh.B * sh.NH * sh.T));
  const size_t acc_bytes = round_up(sizeof(float) * size_t(sh.B * sh.NH * sh.T) * size_t(sh.HS));
  char* ws = static_cast<char*>(
      stream_workspace(s, dsum_bytes + acc_bytes + size_t(plan->workspace), WorkspaceSlot::Attn));
  DS_CUDA_CHECK(cudaMemsetAsync(ws + dsum_bytes, 0, acc_bytes, resolve_stream(s.handle)));
  char* qkv = static_cast<char*>(a.qkv.raw());
  char* dqkv = static_cast<char*>(a.dqkv.raw());
  const size_t k_off = elt * size_t(sh.NH) * sh.HS, v_off = elt * size_t(sh.NH + sh.NKV) * sh.HS;
  float scale = float(1.0 / std::sqrt(double(sh.HS))), neg_inf = mask_value(), one = 1.0f;
  execute(*plan, s, {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kNegInf, kOne, kDsum, kDQacc},
          {qkv, qkv + k_off, qkv + v_off, a.out.raw(), a.dout.raw(), a.lse.raw(), dqkv, dqkv + k_off, dqkv + v_off,
           &scale, &neg_inf, &one, ws, ws + dsum_bytes},
          plan->workspace > 0 ? ws + dsum_bytes + acc_bytes : nullptr);
  return "";
}

std::string cudnn_sdpa_check_graph(bool backward, const AttnShape& sh, DType dt) {
  cudnn();
  try {
    Graph g;
    const Views v{sh.B, sh.T, sh.NH, sh.NKV, sh.HS, int64_t(sh.NH + 2 * sh.NKV) * sh.HS};
    const cudnnDataType_t io = dt == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    if (backward)
      build_backward(g, v, io);
    else
      build_forward(g, v, io);
  } catch (const BuildFail& e) {
    return e.what();
  }
  return "";
}

size_t cudnn_sdpa_cached_plans() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.plans.size();
}

}  // namespace ds::cuda

// Backend-neutral parts of the communication layer: Tensor forms of the
// collectives (checks, then the raw forms), the rank environment parser and
// the world-communicator factory.
#include "lib/comm/communicator.h"

#include <cstdlib>

#include "lib/comm/gloo_communicator.h"
#include "lib/comm/nccl_module.h"
#include "lib/comm/tcp_store.h"
#include "lib/core/cuda_module.h"
#include "lib/core/error.h"

namespace ds {

const char* backend_name(Backend b) { return b == Backend::Gloo ? "gloo" : "nccl"; }

Backend backend_from_name(const std::string& name) {
  if (name == "gloo") return Backend::Gloo;
  if (name == "nccl") return Backend::Nccl;
  DS_USER_ERROR("unknown communication backend '{}' (expected gloo or nccl)", name);
}

void Communicator::check_tensor(const Tensor& t, const char* op) const {
  DS_CHECK(t.defined() || t.numel() == 0, "{} on group '{}': undefined tensor", op, name());
  DS_CHECK(t.device().type == device_type(),
           "{} on group '{}': {} backend needs {} tensors, got one on {}", op, name(),
           backend_name(backend()), device_type() == DeviceType::CPU ? "CPU" : "CUDA",
           device_name(t.device()));
}

namespace {
Tensor scalar_tensor(double v, Device dev) {
  Tensor h = Tensor::empty({1}, DType::F32);
  h.data<float>()[0] = static_cast<float>(v);
  return dev.is_cpu() ? h : h.to(dev);
}
double scalar_value(const Tensor& t) {
  Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  return static_cast<double>(h.data<float>()[0]);
}
}  // namespace

// On the GPU the collective is stream-ordered; the read of the result is the
// one host wait (the upload is another). raise_if_failed after the read: a
// value an aborted operation left behind is never returned.
double Communicator::all_reduce_scalar(double v, Device dev, ReduceOp op) {
  Tensor t = scalar_tensor(v, dev);
  all_reduce(t, op);
  const double r = scalar_value(t);
  raise_if_failed();
  return r;
}

double Communicator::broadcast_scalar(double v, Device dev, int root) {
  Tensor t = scalar_tensor(v, dev);
  broadcast(t, root);
  const double r = scalar_value(t);
  raise_if_failed();
  return r;
}

void Communicator::all_reduce(const Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce");
  all_reduce(t.raw(), t.numel(), t.dtype(), op);
}

void Communicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  check_tensor(input, "reduce_scatter");
  check_tensor(output, "reduce_scatter");
  DS_CHECK(input.dtype() == output.dtype(), "reduce_scatter: dtypes {} and {} differ",
           dtype_name(input.dtype()), dtype_name(output.dtype()));
  DS_CHECK(input.numel() == output.numel() * size(),
           "reduce_scatter on group '{}': input has {} elements, expected output ({}) x {} members",
           name(), input.numel(), output.numel(), size());
  reduce_scatter(input.raw(), output.raw(), output.numel(), output.dtype(), op);
}

void Communicator::all_gather(const Tensor& input, const Tensor& output) {
  check_tensor(input, "all_gather");
  check_tensor(output, "all_gather");
  DS_CHECK(input.dtype() == output.dtype(), "all_gather: dtypes {} and {} differ",
           dtype_name(input.dtype()), dtype_name(output.dtype()));
  DS_CHECK(output.numel() == input.numel() * size(),
           "all_gather on group '{}': output has {} elements, expected input ({}) x {} members",
           name(), output.numel(), input.numel(), size());
  all_gather(input.raw(), output.raw(), input.numel(), input.dtype());
}

void Communicator::all_to_all(const Tensor& input, const Tensor& output) {
  check_tensor(input, "all_to_all");
  check_tensor(output, "all_to_all");
  DS_CHECK(input.dtype() == output.dtype(), "all_to_all: dtypes {} and {} differ",
           dtype_name(input.dtype()), dtype_name(output.dtype()));
  DS_CHECK(input.numel() == output.numel() && input.numel() % size() == 0,
           "all_to_all on group '{}': input has {} elements and output {}; both must be the same "
           "multiple of {} members", name(), input.numel(), output.numel(), size());
  const char* in = static_cast<const char*>(input.raw());
  const char* out = static_cast<const char*>(output.raw());
  DS_CHECK(in + input.nbytes() <= out || out + output.nbytes() <= in,
           "all_to_all on group '{}': input and output overlap", name());
  all_to_all(input.raw(), output.raw(), input.numel() / size(), input.dtype());
}

void Communicator::broadcast(const Tensor& t, int root) {
  check_tensor(t, "broadcast");
  broadcast(t.raw(), t.numel(), t.dtype(), root);
}

void Communicator::send(const Tensor& t, int dst) {
  check_tensor(t, "send");
  send(t.raw(), t.numel(), t.dtype(), dst);
}

void Communicator::recv(const Tensor& t, int src) {
  check_tensor(t, "recv");
  recv(t.raw(), t.numel(), t.dtype(), src);
}

namespace {

// Integer env variable in [lo, hi]; `fallback` when unset or empty.
int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  DS_USER_CHECK(end && *end == '\0', "environment variable {}='{}' is not an integer", name, v);
  DS_USER_CHECK(x >= lo && x <= hi, "environment variable {}={} is outside [{}, {}]", name, x, lo,
                hi);
  return x;
}

}  // namespace

RendezvousInfo RendezvousInfo::from_env() {
  RendezvousInfo r;
  r.world_size = static_cast<int>(env_int("WORLD_SIZE", 1, 1, 1 << 20));
  r.rank = static_cast<int>(env_int("RANK", 0, 0, r.world_size - 1));
  r.local_size = static_cast<int>(env_int("LOCAL_SIZE", 1, 1, 1 << 16));
  r.local_rank = static_cast<int>(env_int("LOCAL_RANK", 0, 0, 1 << 16));
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) r.master_addr = a;
  else
    DS_USER_CHECK(r.world_size == 1, "MASTER_ADDR is not set but WORLD_SIZE={}; start the ranks "
                  "with dsrun or set MASTER_ADDR and MASTER_PORT", r.world_size);
  r.master_port = static_cast<int>(env_int("MASTER_PORT", 29500, 1, 65535));
  if (const char* t = std::getenv("DS_JOB_TOKEN")) r.token = t;
  r.timeout = std::chrono::seconds(env_int("DS_RENDEZVOUS_TIMEOUT", 300, 1, 1 << 30));
  r.op_timeout = std::chrono::seconds(env_int("DS_COMM_TIMEOUT", 1800, 1, 1 << 30));
  return r;
}

std::unique_ptr<Communicator> make_world_communicator(Backend backend, const RendezvousInfo& info) {
  DS_USER_CHECK(info.world_size >= 1 && info.rank >= 0 && info.rank < info.world_size,
                "RANK={} is outside WORLD_SIZE={}", info.rank, info.world_size);
  // NCCL comes from the CUDA backend module (nccl_module.h), loaded here
  // before the rendezvous so that a missing module fails alone, not the job.
  const NcclModuleApi* nccl = nullptr;
  if (backend == Backend::Nccl) {
    DS_USER_CHECK(cuda_module_built(), "this build has no CUDA/NCCL support; use the gloo "
                  "backend (CPU) or rebuild with the CUDA toolkit");
    nccl = static_cast<const NcclModuleApi*>(cuda_module_part(CudaModulePart::Nccl));
    DS_USER_CHECK(nccl && nccl->create_world, "this build's CUDA backend has no NCCL support (nccl.h was not "
                  "found at configure time); use the gloo backend or rebuild with NCCL's headers");
  }
  std::shared_ptr<TcpStore> store;
  if (info.world_size > 1) {
    TcpStoreOptions o;
    o.host = info.master_addr;
    o.port = info.master_port;
    o.is_server = info.rank == 0;
    o.token = info.token;
    o.rank = info.rank;
    o.timeout = info.timeout;
    o.world_size = info.world_size;
    store = std::make_shared<TcpStore>(o);
    store->barrier("world/join", info.rank, info.world_size);
  }
  if (backend == Backend::Gloo) {
    GlooOptions go;
    go.op_timeout = info.op_timeout;
    return GlooCommunicator::create_world(store, info.rank, info.world_size, info.master_addr, go);
  }
  return nccl->create_world(store, info.rank, info.world_size, info.local_rank, info.op_timeout);
}

// ---- Asynchronous forms (the generic part; NcclCommunicator overrides submit) ----

CommHandle Communicator::submit(const char* what, std::function<void()> op, std::vector<Tensor> uses) {
  if (!worker_) worker_ = std::make_unique<CommWorker>(name());
  // The tensors stay referenced until the op ran (their memory is not freed).
  return worker_->submit(what, [op = std::move(op), uses = std::move(uses)] { op(); });
}

void Communicator::wait_all() {
  if (worker_) worker_->drain();
}

void Communicator::drain_async() {
  if (worker_ && !worker_->on_worker_thread()) worker_->drain();
}

CommHandle Communicator::iall_reduce(const Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce");
  return submit("all_reduce", [this, t, op] { all_reduce(t, op); }, {t});
}

CommHandle Communicator::ireduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  check_tensor(input, "reduce_scatter");
  check_tensor(output, "reduce_scatter");
  DS_CHECK(input.numel() == output.numel() * size() && input.dtype() == output.dtype(),
           "reduce_scatter on group '{}': input {} x {}, output {} x {}, {} members", name(), input.numel(),
           dtype_name(input.dtype()), output.numel(), dtype_name(output.dtype()), size());
  return submit("reduce_scatter", [this, input, output, op] { reduce_scatter(input, output, op); }, {input, output});
}

CommHandle Communicator::iall_gather(const Tensor& input, const Tensor& output) {
  check_tensor(input, "all_gather");
  check_tensor(output, "all_gather");
  DS_CHECK(output.numel() == input.numel() * size() && input.dtype() == output.dtype(),
           "all_gather on group '{}': input {} x {}, output {} x {}, {} members", name(), input.numel(),
           dtype_name(input.dtype()), output.numel(), dtype_name(output.dtype()), size());
  return submit("all_gather", [this, input, output] { all_gather(input, output); }, {input, output});
}

CommHandle Communicator::ibroadcast(const Tensor& t, int root) {
  check_tensor(t, "broadcast");
  DS_CHECK(root >= 0 && root < size(), "broadcast root {} outside group '{}' of {}", root, name(), size());
  return submit("broadcast", [this, t, root] { broadcast(t, root); }, {t});
}

CommHandle Communicator::isend(const Tensor& t, int dst) {
  check_tensor(t, "send");
  DS_CHECK(dst >= 0 && dst < size() && dst != rank(), "send to {} from rank {} of group '{}' ({})", dst, rank(),
           name(), size());
  return submit("send", [this, t, dst] { send(t, dst); }, {t});
}

CommHandle Communicator::irecv(const Tensor& t, int src) {
  check_tensor(t, "recv");
  DS_CHECK(src >= 0 && src < size() && src != rank(), "recv from {} on rank {} of group '{}' ({})", src, rank(),
           name(), size());
  return submit("recv", [this, t, src] { recv(t, src); }, {t});
}

CommHandle Communicator::ibatch_send_recv(std::vector<P2POp> ops, std::vector<Tensor> keep) {
  for (const P2POp& op : ops)
    DS_CHECK(op.peer >= 0 && op.peer < size() && op.peer != rank() && (op.channel == 0 || op.channel == 1),
             "batch_send_recv: peer {} channel {} on rank {} of group '{}' ({})", op.peer, op.channel, rank(), name(),
             size());
  return submit("batch_send_recv", [this, ops = std::move(ops)] { batch_send_recv(ops); }, std::move(keep));
}

CommHandle Communicator::ibarrier() {
  return submit("barrier", [this] { barrier(); });
}

void Communicator::batch_send_recv(const std::vector<P2POp>& ops) {
  for (const P2POp& op : ops) {
    if (op.is_send)
      send(op.data, op.count, op.dtype, op.peer);
    else
      recv(op.data, op.count, op.dtype, op.peer);
  }
}

}  // namespace ds

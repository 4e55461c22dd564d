// The host modes of the op-test harness (op_case.h): the double reference,
// central finite differences and CPU timing of one OpCase.
#include "test/ops_harness/op_case.h"

#include <algorithm>
#include <chrono>

#include "test/ops_harness/op_test_util.h"

namespace ds::test {
namespace {

Vec values_f64(const Tensor& t) {
  Vec v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[i] = t.dtype() == DType::I32 ? t.data<int32_t>()[i] : t.data<float>()[i];
  return v;
}

}  // namespace

VecMap initial_values(const OpCase& c) {
  VecMap m = c.extra;
  for (const auto& [name, f] : c.fields) m[name] = values_f64(f.host);
  return m;
}

TensorMap host_copies(const OpCase& c) {
  TensorMap m;
  for (const auto& [name, f] : c.fields) m[name] = f.host.clone();
  return m;
}

void check_reference(const OpCase& c) {
  REQUIRE(c.reference);
  const VecMap want = c.reference(initial_values(c));
  TensorMap m = host_copies(c);
  c.run(m);
  for (const auto& [name, f] : c.fields) {
    if (!f.output) continue;
    auto it = want.find(name);
    INFO(c.name << ": output field " << name);
    REQUIRE(it != want.end());
    check_close(m[name], it->second, c.ref_tol, c.name + " " + name);
  }
}

void check_finite_diff(const OpCase& c) {
  REQUIRE(c.loss);
  REQUIRE(!c.grads.empty());
  const VecMap init = initial_values(c);
  TensorMap m = host_copies(c);
  c.run(m);
  for (const FdGrad& g : c.grads) {
    Vec fd = fd_grad(init.at(g.input), [&](const Vec& x) {
      VecMap v = init;
      v[g.input] = x;
      return c.loss(v);
    });
    Vec want = g.keeps_initial ? init.at(g.grad) : Vec(fd.size(), 0.0);
    for (size_t i = 0; i < want.size(); ++i) want[i] += g.times * fd[i];
    check_close(m[g.grad], want, c.fd_tol, c.name + " d" + g.input + " -> " + g.grad);
  }
}

double time_cpu(const OpCase& c, int iters) {
  TensorMap m = host_copies(c);
  c.run(m);  // warm-up
  std::vector<double> ns;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    c.run(m);
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ns.begin(), ns.end());
  return ns.empty() ? 0.0 : ns[ns.size() / 2];
}

}  // namespace ds::test

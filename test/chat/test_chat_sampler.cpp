// The order DeepSpeed-Chat's steps visit examples in (lib/chat/torch_sampler.h)
// against PyTorch's own DistributedSampler: test/chat/sampler_ref.py prints
// each rank's indices for many sizes, world sizes, ranks, seeds and epochs,
// and ours must be the same, in the same order. Skips when /usr/bin/python3
// cannot import torch.
#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lib/chat/torch_sampler.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using namespace ds;

namespace {

int reference(const std::vector<std::string>& cases, std::vector<std::string>& out) {
  const char* src = std::getenv("DS_SOURCE_DIR");
  std::string cmd = "/usr/bin/python3 " + std::string(src ? src : ".") + "/test/chat/sampler_ref.py";
  for (const std::string& c : cases) cmd += " " + c;
  return test::popen_lines(cmd + " 2>&1", out);
}

std::string joined(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

TEST_CASE("DistributedSampler order: the same indices, in the same order, as PyTorch gives") {
  struct Case {
    int64_t n;
    int replicas, rank;
    uint64_t seed;
    int64_t epoch;
  };
  std::vector<Case> cases;
  for (int64_t n : {1, 2, 3, 7, 10, 64, 1001, 40000})
    for (int replicas : {1, 2, 3, 8})
      for (int rank = 0; rank < replicas; rank += replicas > 2 ? replicas - 1 : 1)
        cases.push_back({n, replicas, rank, 0, 0});
  cases.push_back({5, 8, 7, 0, 0});            // more ranks than examples: padding repeats the permutation
  cases.push_back({3, 8, 6, 0, 0});
  cases.push_back({1000, 4, 2, 1234, 0});      // another seed
  cases.push_back({1000, 4, 2, 1234, 3});      // seed + epoch
  cases.push_back({1000, 2, 1, 4294967295u, 1});  // seed + epoch past 2^32: torch keeps the low 32 bits
  std::vector<std::string> args;
  for (const Case& c : cases)
    args.push_back(std::to_string(c.n) + ":" + std::to_string(c.replicas) + ":" + std::to_string(c.rank) + ":" +
                   std::to_string(c.seed) + ":" + std::to_string(c.epoch));
  std::vector<std::string> ref;
  const int rc = reference(args, ref);
  if (rc == 77) DS_SKIP((ref.empty() ? std::string("torch not importable") : ref[0]));
  REQUIRE(rc == 0);
  REQUIRE(ref.size() == cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO("case " << args[i]);
    const std::vector<int64_t> ours = chat::distributed_sampler_indices(c.n, c.replicas, c.rank, c.seed, c.epoch);
    CHECK(ours.size() == static_cast<size_t>((c.n + c.replicas - 1) / c.replicas));
    CHECK(joined(ours) == ref[i]);
  }
}

TEST_CASE("torch_randperm is a permutation that depends on the seed") {
  const std::vector<int64_t> a = chat::torch_randperm(0, 1000), b = chat::torch_randperm(1, 1000);
  std::vector<int> seen(1000);
  for (int64_t v : a) ++seen[static_cast<size_t>(v)];
  for (int s : seen) CHECK(s == 1);
  CHECK(a != b);
  CHECK(chat::torch_randperm(0, 0).empty());
}

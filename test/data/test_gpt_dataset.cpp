// Tests of GPT sampling: Megatron's split rounding, and the doc / sample /
// shuffle index semantics (coverage, overlap, epochs, determinism, endless data).
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "lib/core/error.h"
#include "lib/data/gpt_dataset.h"
#include "test/data/test_util.h"

using namespace ds;
using namespace ds::data;

namespace {

// Document d holds tokens d*1000 + j, so every token says where it came from.
// Lengths vary from 0 to 37 tokens.
IndexedDataset make_dataset(const test::TempDir& dir, int n_docs) {
  const std::string p = dir / "corpus";
  IndexedDatasetWriter w(p, TokenDType::I32);
  for (int d = 0; d < n_docs; ++d) {
    std::vector<int32_t> doc((d * 7) % 38);
    for (size_t j = 0; j < doc.size(); ++j) doc[j] = d * 1000 + static_cast<int32_t>(j);
    w.add_document(doc);
  }
  w.finalize();
  return IndexedDataset::open(p);
}

std::vector<int32_t> stream_of(const IndexedDataset& ds, const std::vector<int64_t>& docs) {
  std::vector<int32_t> s;
  for (int64_t d : docs) {
    std::vector<int32_t> t(ds.sequence_length(d));
    ds.read_tokens(d, 0, t.size(), t.data());
    s.insert(s.end(), t.begin(), t.end());
  }
  return s;
}

}  // namespace

TEST_CASE("--split takes plain decimal weights only") {
  using B = std::array<int64_t, 4>;
  REQUIRE(split_boundaries("1e2,0,0", 10) == B{0, 10, 10, 10});
  REQUIRE(split_boundaries(".5,0.5", 10) == B{0, 5, 10, 10});
  for (const char* bad : {"0x10", "0x10,1", "inf,1", "nan", " 1,2", "1e,1", "1,,2", "+1", "1e400"}) {
    INFO(bad);
    REQUIRE_THROWS_AS(split_boundaries(bad, 100), UserError);
  }
}

TEST_CASE("split boundaries follow Megatron's rounding") {
  using B = std::array<int64_t, 4>;
  REQUIRE(split_boundaries("949,50,1", 1000) == B{0, 949, 999, 1000});
  REQUIRE(split_boundaries("949,50,1", 10) == B{0, 10, 10, 10});  // round(0.5) == 0
  REQUIRE(split_boundaries("8,1,1", 100) == B{0, 80, 90, 100});
  REQUIRE(split_boundaries("1/1", 3) == B{0, 1, 3, 3});  // round(1.5) == 2, then shifted
  REQUIRE(split_boundaries("100", 17) == B{0, 17, 17, 17});
  REQUIRE(split_boundaries("98,2,0", 7) == B{0, 7, 7, 7});
  SplitRanges r = split_documents("90,5,5", 200);
  REQUIRE(r.train == DocRange{0, 180});
  REQUIRE(r.valid == DocRange{180, 190});
  REQUIRE(r.test == DocRange{190, 200});
  for (const char* bad : {"a,b", "1,2,3,4", "0,0,0", "-1,2", "", "1,,2"})
    REQUIRE_THROWS_AS(split_boundaries(bad, 10), UserError);
}

TEST_CASE("an epoch's samples tile its shuffled document stream") {
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 60);
  const int64_t T = 16;
  GptDataset g(ds, {3, 57}, T, 1234, "train");
  REQUIRE(g.num_tokens() > 10 * T);
  const int64_t n = g.samples_per_epoch();
  REQUIRE(n == (g.num_tokens() - 1) / T);

  for (int64_t epoch : {0, 1}) {
    std::vector<int64_t> docs = g.epoch_documents(epoch);
    std::vector<int64_t> sorted_docs = docs;
    std::sort(sorted_docs.begin(), sorted_docs.end());
    for (int64_t k = 0; k < 54; ++k) REQUIRE(sorted_docs[k] == 3 + k);  // a permutation
    const std::vector<int32_t> stream = stream_of(ds, docs);

    std::vector<std::vector<int32_t>> by_k(n);
    std::set<int64_t> seen;
    for (int64_t s = epoch * n; s < (epoch + 1) * n; ++s) {
      GptDataset::Location loc = g.locate(s);
      REQUIRE(loc.epoch == epoch);
      REQUIRE(seen.insert(loc.unshuffled).second);  // the shuffle is a bijection
      std::vector<int32_t> x = g.get(s);
      REQUIRE(x.size() == static_cast<size_t>(T + 1));
      by_k[loc.unshuffled] = x;
    }
    REQUIRE(static_cast<int64_t>(seen.size()) == n);
    for (int64_t k = 0; k < n; ++k) {
      // Sample k is stream tokens [k*T, k*T + T]: it crosses document boundaries
      // and shares its last token with the first of sample k+1.
      std::vector<int32_t> want(stream.begin() + k * T, stream.begin() + k * T + T + 1);
      REQUIRE(by_k[k] == want);
    }
    // The unshuffled order is not the visiting order.
    int64_t in_place = 0;
    for (int64_t s = 0; s < n; ++s) in_place += g.locate(epoch * n + s).unshuffled == s;
    REQUIRE(in_place < n / 2);
  }
}

TEST_CASE("epochs differ, seeds are deterministic, data never runs out") {
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 40);
  GptDataset a(ds, {0, 40}, 8, 7, "train"), b(ds, {0, 40}, 8, 7, "train"),
      c(ds, {0, 40}, 8, 8, "train");
  const int64_t n = a.samples_per_epoch();
  REQUIRE(a.epoch_documents(0) != a.epoch_documents(1));
  REQUIRE(a.epoch_documents(0) != c.epoch_documents(0));
  bool any_diff_epoch = false, any_diff_seed = false;
  for (int64_t s = 0; s < n; ++s) {
    REQUIRE(a.get(s) == b.get(s));
    any_diff_epoch |= a.get(s) != a.get(s + n);
    any_diff_seed |= a.get(s) != c.get(s);
  }
  REQUIRE(any_diff_epoch);
  REQUIRE(any_diff_seed);
  // Far-away samples (epoch 1000) are fine, and the cache does not change results.
  const std::vector<int32_t> far = a.get(1000 * n + 3);
  REQUIRE(far.size() == 9);
  REQUIRE(b.get(1000 * n + 3) == far);
  REQUIRE(a.get(5) == b.get(5));
}

TEST_CASE("samples stay inside their split's documents") {
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 100);
  SplitRanges r = split_documents("80,15,5", ds.num_sequences());
  GptDataset valid(ds, r.valid, 12, 1, "valid");
  REQUIRE(valid.samples_per_epoch() > 0);
  for (int64_t s = 0; s < 3 * valid.samples_per_epoch(); ++s)
    for (int32_t t : valid.get(s)) {
      REQUIRE(t / 1000 >= r.valid.begin);
      REQUIRE(t / 1000 < r.valid.end);
    }
}

TEST_CASE("a split smaller than one sample reports a clear error") {
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 4);  // 0 + 7 + 14 + 21 tokens
  GptDataset g(ds, {1, 2}, 7, 1, "test");   // exactly 7 tokens: needs 8
  REQUIRE(g.samples_per_epoch() == 0);
  try {
    g.get(0);
    FAIL("expected UserError");
  } catch (const UserError& e) {
    REQUIRE(std::string(e.what()).find("test split") != std::string::npos);
  }
  GptDataset h(ds, {1, 3}, 7, 1, "train");  // 21 tokens -> (21 - 1) / 7 = 2 samples
  REQUIRE(h.samples_per_epoch() == 2);
  REQUIRE(h.get(1).size() == 8);
}

TEST_CASE("a dataset can be moved into place") {
  static_assert(std::is_move_constructible_v<GptDataset>);
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 20);
  GptDataset a(ds, {0, 20}, 5, 3, "train");
  const std::vector<int32_t> first = a.get(0);
  GptDataset b = std::move(a);
  REQUIRE(b.get(0) == first);
}

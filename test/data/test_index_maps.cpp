// Megatron's GPT index maps (lib/data/index_maps.h, GptDataset::from_index_maps
// and write_index_maps): epoch 0 written as maps reads back sample for sample;
// a numpy transcription of Megatron's __getitem__ over the same files and the
// .bin/.idx gives the same tokens, also for maps laid out exactly as Megatron
// lays them out (test/data/npy_ref.py; [numpy] cases skip without it); bad maps
// are each one line naming the file.
#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>

#include "lib/core/error.h"
#include "lib/data/gpt_dataset.h"
#include "lib/data/index_maps.h"
#include "lib/data/npy.h"
#include "test/data/test_util.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using namespace ds;
using namespace ds::data;

namespace {

// Document d holds tokens d*1000 + j. Lengths 0..37 tokens ((d*7) % 38: d = 0
// is empty), and document 5 is 90 tokens, so samples of 16 tokens lie inside
// one document, cross several, and skip empty ones.
IndexedDataset make_dataset(const test::TempDir& dir, int n_docs) {
  const std::string p = dir / "corpus";
  IndexedDatasetWriter w(p, TokenDType::I32);
  for (int d = 0; d < n_docs; ++d) {
    std::vector<int32_t> doc(d == 5 ? 90 : (d * 7) % 38);
    for (size_t j = 0; j < doc.size(); ++j) doc[j] = d * 1000 + static_cast<int32_t>(j);
    w.add_document(doc);
  }
  w.finalize();
  return IndexedDataset::open(p);
}

IndexMapPaths paths_in(const test::TempDir& dir, const std::string& tag) {
  return {dir / (tag + "_doc_idx.npy"), dir / (tag + "_sample_idx.npy"), dir / (tag + "_shuffle_idx.npy")};
}

std::vector<int64_t> read_all(const std::string& path) {
  const NpyArray a = NpyArray::open(path);
  std::vector<int64_t> v(static_cast<size_t>(a.size()));
  for (int64_t i = 0; i < a.size(); ++i) v[static_cast<size_t>(i)] = a.at(i);
  return v;
}

std::string sample_line(int64_t i, const std::vector<int32_t>& toks) {
  std::ostringstream s;
  s << i;
  for (int32_t t : toks) s << " " << t;
  return s.str();
}

// "HEAD DOC SAMPLE SHUFFLE": npy_ref.py's arguments for the maps at `p`.
std::string maps_args(const std::string& head, const IndexMapPaths& p) {
  return fmt::format("{} {} {} {}", head, p.doc_idx, p.sample_idx, p.shuffle_idx);
}

int run_ref(const std::string& args, std::vector<std::string>& out) {
  const char* src = std::getenv("DS_SOURCE_DIR");
  return test::popen_lines(fmt::format("/usr/bin/python3 {}/test/data/npy_ref.py {} 2>&1", src ? src : ".", args), out);
}

}  // namespace

TEST_CASE("index maps: epoch 0 written as maps reads back sample for sample") {
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 60);
  for (int64_t T : {1, 5, 16, 100}) {
    for (DocRange range : {DocRange{0, 60}, DocRange{3, 57}}) {
      INFO("T=" << T << " range [" << range.begin << ", " << range.end << ")");
      GptDataset g(ds, range, T, 1234, "train");
      const IndexMapPaths p = paths_in(dir, fmt::format("t{}_{}", T, range.begin));
      g.write_index_maps(p);
      const GptDataset m = GptDataset::from_index_maps(ds, p, T, "train maps");
      const int64_t n = g.samples_per_epoch();
      REQUIRE(n > 1);
      REQUIRE(m.uses_index_maps());
      REQUIRE(!g.uses_index_maps());
      REQUIRE(m.samples_per_epoch() == n);
      REQUIRE(m.seq_length() == T);
      CHECK(m.num_tokens() == g.num_tokens());
      CHECK(m.epoch_documents(0) == g.epoch_documents(0));
      CHECK(m.epoch_documents(3) == g.epoch_documents(0));
      CHECK(m.range().begin >= range.begin);
      CHECK(m.range().end <= range.end);
      for (int64_t s = 0; s < n; ++s) {
        INFO("sample " << s);
        REQUIRE(m.get(s) == g.get(s));
        CHECK(m.locate(s).unshuffled == g.locate(s).unshuffled);
      }
      // Past n the maps' samples repeat in the same order.
      for (int64_t s : {n, n + 1, 2 * n - 1, 5 * n + 3}) {
        CHECK(m.get(s) == m.get(s % n));
        CHECK(m.locate(s).epoch == s / n);
      }
      // Megatron's dtypes and shapes.
      const NpyArray doc = NpyArray::open(p.doc_idx), smp = NpyArray::open(p.sample_idx),
                     shf = NpyArray::open(p.shuffle_idx);
      CHECK(doc.dtype() == NpyDType::I32);
      CHECK(doc.shape() == std::vector<int64_t>{range.size()});
      CHECK(smp.dtype() == NpyDType::I32);
      CHECK(smp.shape() == std::vector<int64_t>{n + 1, 2});
      CHECK(shf.dtype() == NpyDType::U32);
      CHECK(shf.shape() == std::vector<int64_t>{n});
      // Every row sits on a token of its document: the maps never point into an empty one.
      for (int64_t r = 0; r <= n; ++r)
        CHECK(smp.at(r, 1) < ds.sequence_length(doc.at(smp.at(r, 0))));
    }
  }
}

TEST_CASE("index maps: the three files are written together or not at all") {
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 30);
  GptDataset g(ds, {0, 30}, 16, 1, "train");
  IndexMapPaths p = paths_in(dir, "x");
  p.shuffle_idx = dir / "no_such_dir/shuffle.npy";
  const std::string msg = test::error_of([&] { g.write_index_maps(p); });
  CHECK(msg.find("no_such_dir/shuffle.npy") != std::string::npos);
  CHECK(!std::filesystem::exists(p.doc_idx));
  CHECK(!std::filesystem::exists(p.sample_idx));
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    INFO(e.path().string());
    CHECK(e.path().string().find(".npy") == std::string::npos);
  }
  const IndexMapPaths ok = paths_in(dir, "ok");
  g.write_index_maps(ok);
  const GptDataset m = GptDataset::from_index_maps(ds, ok, 16, "maps");
  CHECK(test::error_of([&] { m.write_index_maps(paths_in(dir, "again")); }).find("reads index maps already") !=
        std::string::npos);
  GptDataset tiny(ds, {0, 2}, 16, 1, "tiny");  // documents of 0 and 7 tokens: no sample
  CHECK(test::error_of([&] { tiny.write_index_maps(paths_in(dir, "tiny")); }).find("no index maps to write") !=
        std::string::npos);
}

TEST_CASE("index maps: bad maps are each one line naming the file") {
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 40);
  const int64_t T = 16;
  GptDataset g(ds, {0, 40}, T, 99, "train");
  const IndexMapPaths good = paths_in(dir, "good");
  g.write_index_maps(good);
  const std::vector<int64_t> docs = read_all(good.doc_idx), rows = read_all(good.sample_idx),
                             shuffle = read_all(good.shuffle_idx);
  const int64_t n = g.samples_per_epoch(), D = static_cast<int64_t>(docs.size());
  REQUIRE(rows[1] != rows[3]);  // sample 1 starts in another document than sample 0

  int variant = 0;
  // The good maps with one file replaced by `values` of `shape`; returns the error.
  auto with = [&](char which, std::vector<int64_t> values, std::vector<int64_t> shape) {
    IndexMapPaths p = good;
    std::string& target = which == 'd' ? p.doc_idx : which == 's' ? p.sample_idx : p.shuffle_idx;
    target = dir / fmt::format("bad{}.npy", variant++);
    write_npy(target, values, shape);
    const std::string msg = test::error_of([&] { GptDataset::from_index_maps(ds, p, T, "train"); });
    CHECK(msg.find(target) != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
    return msg;
  };
  auto has = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    CHECK(msg.find(part) != std::string::npos);
  };

  std::vector<int64_t> d = docs;
  d[7] = ds.num_sequences();
  has(with('d', d, {D}), "entry 7 = 40 is not a document of dataset");
  d[7] = -1;
  has(with('d', d, {D}), "entry 7 = -1 is not a document");
  has(with('d', {}, {0}), "is empty");
  has(with('d', docs, {D / 2, 2}), "has 2 dimensions");

  std::vector<int64_t> r = rows;
  const int64_t k1 = rows[2], len1 = ds.sequence_length(docs[static_cast<size_t>(k1)]);
  r[3] = len1;  // row 1's offset at its document's end
  has(with('s', r, {n + 1, 2}), fmt::format("row 1 = ({}, {}) has offset {} beyond document {}", k1, len1, len1,
                                            docs[static_cast<size_t>(k1)]));
  r = rows;
  r[1] = -1;
  has(with('s', r, {n + 1, 2}), "row 0 = (");
  r = rows;
  r[2 * n] = D;
  has(with('s', r, {n + 1, 2}), fmt::format("row {} = ({}, ", n, D));
  r = rows;
  std::swap(r[2], r[4]);
  std::swap(r[3], r[5]);
  has(with('s', r, {n + 1, 2}), fmt::format("row 2 = ({}, {}) does not advance past row 1", r[4], r[5]));
  r = rows;
  const bool shorter = r[2 * n + 1] > 0;  // the last sample a token shorter, or else longer
  r[2 * n + 1] += shorter ? -1 : 1;
  has(with('s', r, {n + 1, 2}),
      fmt::format("sample {} spans {} tokens, but sample 0 spans 17", n - 1, shorter ? 16 : 18));
  has(with('s', std::vector<int64_t>(3 * (n + 1), 0), {n + 1, 3}),
      fmt::format("has shape ({}, 3); expected (samples + 1, 2)", n + 1));
  has(with('s', {0, 0}, {1, 2}), "has 1 row(s): no samples");
  has(with('s', {rows.begin(), rows.begin() + 6}, {6}), "has shape (6,)");

  // Maps built for another --seq-length.
  for (int64_t other : {int64_t{8}, int64_t{32}}) {
    const std::string msg = test::error_of([&] { GptDataset::from_index_maps(ds, good, other, "train"); });
    CHECK(msg == fmt::format("index maps built for --seq-length 16, not {}: the samples of sample_idx '{}' span 17 "
                             "tokens, seq_length {} needs {}", other, good.sample_idx, other, other + 1));
  }

  std::vector<int64_t> s = shuffle;
  has(with('h', {s.begin(), s.end() - 1}, {n - 1}),
      fmt::format("has {} entries, but sample_idx '{}' holds {} samples", n - 1, good.sample_idx, n));
  s[4] = n;
  has(with('h', s, {n}), fmt::format("entry 4 = {} is outside the {} samples", n, n));
  s[4] = -3;
  has(with('h', s, {n}), "entry 4 = -3 is outside");
  has(with('h', std::vector<int64_t>(2 * n, 0), {n, 2}), "has 2 dimensions");

  IndexMapPaths missing = good;
  missing.sample_idx = dir / "nope.npy";
  CHECK(test::error_of([&] { GptDataset::from_index_maps(ds, missing, T, "train"); }) ==
        fmt::format("sample_idx '{}': file not found", dir / "nope.npy"));
  IndexMapPaths floats = good;
  floats.doc_idx = dir / "f.npy";
  const std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }\n";
  const char len[2] = {static_cast<char>(dict.size()), 0};
  test::spit(floats.doc_idx, std::string("\x93NUMPY\x01\x00", 8) + std::string(len, 2) + dict + std::string(8, '\0'));
  CHECK(test::error_of([&] { GptDataset::from_index_maps(ds, floats, T, "train"); })
            .find(fmt::format("doc_idx '{}': dtype '<f8' is not supported", floats.doc_idx)) == 0);
}

TEST_CASE("index maps: Megatron's __getitem__ in numpy gives our samples", "[numpy]") {
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 60);
  for (int64_t T : {5, 16}) {
    INFO("T=" << T);
    GptDataset g(ds, {2, 60}, T, 77, "train");
    const IndexMapPaths p = paths_in(dir, fmt::format("m{}", T));
    g.write_index_maps(p);
    const GptDataset m = GptDataset::from_index_maps(ds, p, T, "train maps");
    std::vector<std::string> ref;
    const int rc = run_ref(maps_args(fmt::format("samples {}", ds.prefix()), p), ref);
    if (rc == 77) DS_SKIP("numpy not importable in /usr/bin/python3");
    REQUIRE(rc == 0);
    REQUIRE(static_cast<int64_t>(ref.size()) == m.samples_per_epoch());
    for (int64_t s = 0; s < m.samples_per_epoch(); ++s) {
      REQUIRE(ref[static_cast<size_t>(s)] == sample_line(s, m.get(s)));
      REQUIRE(ref[static_cast<size_t>(s)] == sample_line(s, g.get(s)));
    }
  }
}

TEST_CASE("index maps: maps laid out as Megatron lays them out read the same", "[numpy]") {
  test::TempDir dir;
  IndexedDataset ds = make_dataset(dir, 45);
  const int64_t T = 16;
  const IndexMapPaths p = paths_in(dir, "meg");
  std::vector<std::string> out;
  const int rc = run_ref(maps_args(fmt::format("build {} 16 1234", ds.prefix()), p), out);
  if (rc == 77) DS_SKIP("numpy not importable in /usr/bin/python3");
  INFO((out.empty() ? "" : out.back()));
  REQUIRE(rc == 0);
  const GptDataset m = GptDataset::from_index_maps(ds, p, T, "train maps");
  // Two epochs of documents; sample_idx as Megatron-DeepSpeed's helper writes it (int64), row 0
  // (0, 0) on an empty document.
  const NpyArray smp = NpyArray::open(p.sample_idx), doc = NpyArray::open(p.doc_idx);
  CHECK(smp.dtype() == NpyDType::I64);
  CHECK(doc.size() == 2 * ds.num_sequences());
  CHECK(ds.sequence_length(doc.at(0)) == 0);
  CHECK(m.samples_per_epoch() == (2 * ds.num_tokens() - 1) / T);
  CHECK(m.num_tokens() == 2 * ds.num_tokens());
  std::vector<std::string> ref;
  REQUIRE(run_ref(maps_args(fmt::format("samples {}", ds.prefix()), p), ref) == 0);
  REQUIRE(static_cast<int64_t>(ref.size()) == m.samples_per_epoch());
  for (int64_t s = 0; s < m.samples_per_epoch(); ++s) REQUIRE(ref[static_cast<size_t>(s)] == sample_line(s, m.get(s)));
  CHECK(test::error_of([&] { GptDataset::from_index_maps(ds, p, 15, "train"); })
            .find("index maps built for --seq-length 16, not 15") == 0);
}

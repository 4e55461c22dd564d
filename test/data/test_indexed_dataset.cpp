// Tests of the Megatron indexed dataset: exact .idx bytes, write/read round trips,
// no leftovers from an aborted writer, and one-line errors for corrupt files;
// DeepSpeed's dtype-code table, with files of a python writer of that flavour
// (ds_indexed_write.py: its own ctest entry, skipped without numpy).
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <vector>

#include "lib/core/error.h"
#include "lib/data/indexed_dataset.h"
#include "test/data/test_util.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using namespace ds;
using namespace ds::data;
namespace fs = std::filesystem;

namespace {

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void write_docs(const std::string& prefix, TokenDType dt,
                const std::vector<std::vector<int32_t>>& docs) {
  IndexedDatasetWriter w(prefix, dt);
  for (const auto& d : docs) w.add_document(d);
  w.finalize();
}

// Runs f, expects a UserError whose message contains every needle.
template <typename F>
void expect_user_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    FAIL("expected ds::UserError");
  } catch (const UserError& e) {
    std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find('\n') == std::string::npos);
    for (const auto& n : needles) REQUIRE(msg.find(n) != std::string::npos);
  }
}

std::vector<int64_t> doc_idx(const IndexedDataset& f) { return f.doc_idx().to_vector(); }

// Every file under `dir` whose name contains `needle`.
std::vector<std::string> files_with(const std::string& dir, const std::string& needle) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(needle) != std::string::npos) out.push_back(e.path().string());
  return out;
}

}  // namespace

TEST_CASE("idx file has Megatron's exact layout") {
  test::TempDir dir;
  const std::string p = dir / "tiny";
  write_docs(p, TokenDType::U16, {{5, 6, 7}, {}, {65535}});
  std::string expect("MMIDIDX\0\0", 9);
  put<uint64_t>(expect, 1);
  put<uint8_t>(expect, 8);  // uint16
  put<uint64_t>(expect, 3);
  put<uint64_t>(expect, 4);
  for (int32_t s : {3, 0, 1}) put<int32_t>(expect, s);
  for (int64_t q : {0, 6, 6}) put<int64_t>(expect, q);
  for (int64_t d : {0, 1, 2, 3}) put<int64_t>(expect, d);
  REQUIRE(test::slurp(p + ".idx") == expect);
  std::string bin;
  for (uint16_t t : {5, 6, 7, 65535}) put<uint16_t>(bin, t);
  REQUIRE(test::slurp(p + ".bin") == bin);
  REQUIRE_FALSE(fs::exists(p + ".bin.tmp"));
  REQUIRE_FALSE(fs::exists(p + ".idx.tmp"));
}

TEST_CASE("indexed dataset round trips every integer dtype") {
  test::TempDir dir;
  std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {100}, {}, {7, 0, 120, 9, 9}};
  for (TokenDType dt : {TokenDType::U8, TokenDType::I8, TokenDType::I16, TokenDType::U16,
                        TokenDType::I32, TokenDType::I64}) {
    const std::string p = dir / token_dtype_name(dt);
    write_docs(p, dt, docs);
    IndexedDataset ds = IndexedDataset::open(p);
    REQUIRE(ds.dtype() == dt);
    REQUIRE(ds.num_sequences() == 4);
    REQUIRE(ds.num_documents() == 4);
    REQUIRE(ds.num_tokens() == 9);
    REQUIRE(ds.doc_idx().to_vector() ==
            std::vector<int64_t>{0, 1, 2, 3, 4});
    for (int64_t i = 0; i < 4; ++i) {
      REQUIRE(ds.sequence_length(i) == static_cast<int32_t>(docs[i].size()));
      REQUIRE(ds.sequence(i).length == static_cast<int64_t>(docs[i].size()));
      std::vector<int32_t> got(docs[i].size());
      ds.read_tokens(i, 0, got.size(), got.data());
      REQUIRE(got == docs[i]);
    }
    std::vector<int32_t> mid(2);
    ds.read_tokens(3, 2, 2, mid.data());
    REQUIRE(mid == std::vector<int32_t>{120, 9});
    REQUIRE(max_token_id(ds) == 120);
  }
}

TEST_CASE("writer supports several sequences per document") {
  test::TempDir dir;
  const std::string p = dir / "multi";
  {
    IndexedDatasetWriter w(p, TokenDType::I32);
    w.add_sequence(std::vector<int32_t>{1, 2});
    w.add_sequence(std::vector<int32_t>{3});
    w.end_document();
    w.add_document(std::vector<int32_t>{4, 5, 6});
    w.finalize();
  }
  IndexedDataset ds = IndexedDataset::open(p);
  REQUIRE(ds.num_sequences() == 3);
  REQUIRE(ds.num_documents() == 2);
  REQUIRE(ds.doc_idx().to_vector() ==
          std::vector<int64_t>{0, 2, 3});
  REQUIRE(ds.pointers().to_vector() ==
          std::vector<int64_t>{0, 8, 12});
}

TEST_CASE("an unfinished or failed writer leaves no files behind") {
  test::TempDir dir;
  const std::string p = dir / "sub/dir/out";
  {
    IndexedDatasetWriter w(p, TokenDType::U16);
    w.add_document(std::vector<int32_t>{1, 2, 3});
    REQUIRE(fs::exists(p + ".bin.tmp"));
  }  // destroyed without finalize(), as when an exception unwinds
  REQUIRE_FALSE(fs::exists(p + ".bin.tmp"));
  REQUIRE_FALSE(fs::exists(p + ".bin"));
  REQUIRE_FALSE(fs::exists(p + ".idx"));
  expect_user_error(
      [&] {
        IndexedDatasetWriter w(p, TokenDType::U16);
        w.add_document(std::vector<int32_t>{1, 70000});
      },
      {"70000", "u16"});
  for (const char* ext : {".bin", ".idx", ".bin.tmp", ".idx.tmp"})
    REQUIRE_FALSE(fs::exists(p + ext));
}

TEST_CASE("finalize replaces an existing dataset") {
  test::TempDir dir;
  const std::string p = dir / "again";
  write_docs(p, TokenDType::U16, {{1, 2, 3, 4}});
  write_docs(p, TokenDType::U16, {{9}});
  IndexedDataset ds = IndexedDataset::open(p);
  REQUIRE(ds.num_tokens() == 1);
  REQUIRE(max_token_id(ds) == 9);
}

TEST_CASE("corrupt or missing dataset files give one-line errors naming the file") {
  test::TempDir dir;
  const std::string p = dir / "good";
  write_docs(p, TokenDType::U16, {{1, 2, 3}, {4, 5}});
  const std::string idx = test::slurp(p + ".idx"), bin = test::slurp(p + ".bin");
  const std::string q = dir / "bad";
  auto open_bad = [&] { IndexedDataset::open(q); };

  expect_user_error(open_bad, {q + ".idx", "not found"});

  std::string s = idx;
  s[0] = 'X';
  test::spit(q + ".idx", s);
  test::spit(q + ".bin", bin);
  expect_user_error(open_bad, {q + ".idx", "magic"});

  s = idx;
  s[9] = 2;  // version 2
  test::spit(q + ".idx", s);
  expect_user_error(open_bad, {q + ".idx", "version 2"});

  s = idx;
  s[17] = 9;  // dtype code
  test::spit(q + ".idx", s);
  expect_user_error(open_bad, {q + ".idx", "dtype code 9"});

  test::spit(q + ".idx", idx.substr(0, 20));
  expect_user_error(open_bad, {q + ".idx", "truncated"});

  test::spit(q + ".idx", idx.substr(0, idx.size() - 8));
  expect_user_error(open_bad, {q + ".idx", "truncated"});

  test::spit(q + ".idx", idx);
  test::spit(q + ".bin", bin.substr(0, bin.size() - 2));
  expect_user_error(open_bad, {q + ".bin", "truncated"});

  fs::remove(q + ".bin");
  expect_user_error(open_bad, {q + ".bin", "not found"});

  test::spit(q + ".bin", bin);
  IndexedDataset ok = IndexedDataset::open(q);
  REQUIRE(ok.num_tokens() == 5);
}

TEST_CASE("an .idx that disagrees with its .bin or has a malformed document index is refused") {
  test::TempDir dir;
  const std::string p = dir / "good";
  write_docs(p, TokenDType::U16, {{1, 2, 3}, {4, 5}});
  const std::string idx = test::slurp(p + ".idx"), bin = test::slurp(p + ".bin");
  const std::string q = dir / "bad";
  auto open_bad = [&] { IndexedDataset::open(q); };
  test::spit(q + ".bin", bin);

  std::string s = idx;
  s[17] = 1;  // u8: 5 tokens need 5 bytes, the .bin has 10
  test::spit(q + ".idx", s);
  expect_user_error(open_bad, {q + ".bin", "wrong dtype code 1"});

  test::spit(q + ".idx", idx);
  test::spit(q + ".bin", bin + std::string(4, '\0'));  // trailing bytes no sequence owns
  expect_user_error(open_bad, {q + ".bin", "14 bytes"});
  test::spit(q + ".bin", bin);

  // n_doc = 0: the header's count at byte 26 and the file cut to match.
  s = idx.substr(0, idx.size() - 3 * 8);
  std::memset(s.data() + 26, 0, 8);
  test::spit(q + ".idx", s);
  expect_user_error(open_bad, {q + ".idx", "document index (0 entries)", "it is empty"});

  // The last doc_idx entry (2) must equal the sequence count: make it 1.
  s = idx;
  const int64_t one = 1;
  std::memcpy(s.data() + s.size() - 8, &one, 8);
  test::spit(q + ".idx", s);
  expect_user_error(open_bad, {q + ".idx", "runs from 0 to 1"});

  // The first entry must be 0.
  s = idx;
  std::memcpy(s.data() + s.size() - 24, &one, 8);
  test::spit(q + ".idx", s);
  expect_user_error(open_bad, {q + ".idx", "runs from 1 to 2"});

  test::spit(q + ".idx", idx);
  REQUIRE(IndexedDataset::open(q).num_tokens() == 5);
}

TEST_CASE("token dtype helpers") {
  REQUIRE(token_dtype_for_vocab(50257) == TokenDType::U16);
  REQUIRE(token_dtype_for_vocab(65500) == TokenDType::I32);
  REQUIRE(parse_token_dtype("uint16") == TokenDType::U16);
  REQUIRE(parse_token_dtype("i32") == TokenDType::I32);
  REQUIRE_THROWS_AS(parse_token_dtype("f32"), UserError);
  REQUIRE(token_dtype_size(TokenDType::F64) == 8);
  REQUIRE(static_cast<int>(TokenDType::F64) == 6);
  REQUIRE(static_cast<int>(TokenDType::F32) == 7);
}

TEST_CASE("DeepSpeed's dtype codes: header bytes, values, and what the Megatron table makes of them") {
  test::TempDir dir;
  CHECK(dtype_code(TokenDType::U16, DTypeCodes::DeepSpeed) == 6);
  CHECK(dtype_code(TokenDType::U32, DTypeCodes::DeepSpeed) == 7);
  CHECK(dtype_code(TokenDType::U64, DTypeCodes::DeepSpeed) == 8);
  CHECK(dtype_code(TokenDType::U16, DTypeCodes::Megatron) == 8);
  CHECK(dtype_code(TokenDType::F64, DTypeCodes::DeepSpeed) == 0);
  CHECK(dtype_code(TokenDType::U32, DTypeCodes::Megatron) == 0);
  CHECK(dtype_from_code(7, DTypeCodes::Megatron) == TokenDType::F32);
  CHECK(dtype_from_code(9, DTypeCodes::DeepSpeed) == std::nullopt);

  const std::vector<std::pair<TokenDType, std::vector<int64_t>>> cases = {
      {TokenDType::U16, {0, 65535, 7}},
      {TokenDType::U32, {0, 4294967295LL, 70000}},
      {TokenDType::U64, {0, std::numeric_limits<int64_t>::max(), 12}},
      {TokenDType::I8, {-128, 127, -1}},
      {TokenDType::I64, {std::numeric_limits<int64_t>::min(), -5, 5}}};
  for (const auto& [dt, vals] : cases) {
    const std::string p = dir / token_dtype_name(dt);
    IndexedDatasetWriter w(p, dt, DTypeCodes::DeepSpeed);
    w.add_sequence(std::span<const int64_t>(vals));
    w.add_sequence(std::span<const int64_t>(vals.data(), 1));
    w.end_document();
    w.end_document();  // DeepSpeed's close after a merge: the count repeats
    w.finalize();
    CHECK(static_cast<int>(test::slurp(p + ".idx")[17]) == dtype_code(dt, DTypeCodes::DeepSpeed));
    const IndexedDataset f = IndexedDataset::open(p, DTypeCodes::DeepSpeed);
    CHECK(f.dtype() == dt);
    CHECK(f.codes() == DTypeCodes::DeepSpeed);
    CHECK(f.values(0) == vals);
    CHECK(f.values(1) == std::vector<int64_t>{vals[0]});
    CHECK(doc_idx(f) == std::vector<int64_t>{0, 2, 2});
    int64_t two[2];
    f.read_values(0, 1, 2, two);
    CHECK(two[0] == vals[1]);
    CHECK(two[1] == vals[2]);
  }
  // Under Megatron's table code 8 is u16: the sizes disagree. Code 6 is f64: values are refused.
  CHECK_THAT(test::error_of([&] { IndexedDataset::open(dir / "u64"); }), Catch::Contains("wrong dtype code 8"));
  std::string idx = test::slurp(dir / "u64.idx");
  idx[17] = 6;
  test::spit(dir / "u64.idx", idx);
  CHECK(IndexedDataset::open(dir / "u64").dtype() == TokenDType::F64);
  CHECK_THAT(test::error_of([&] { IndexedDataset::open(dir / "u64").values(0); }),
             Catch::Contains("holds floating-point values (f64)"));
  // Tokens from a u32 file, while they fit int32.
  int32_t tok[3];
  IndexedDataset::open(dir / "u32", DTypeCodes::DeepSpeed).read_tokens(1, 0, 1, tok);
  CHECK(tok[0] == 0);
  CHECK_THAT(test::error_of([&] { IndexedDataset::open(dir / "u32", DTypeCodes::DeepSpeed).read_tokens(0, 0, 3, tok); }),
             Catch::Contains("token value 4294967295 is not a valid token id"));
  // Megatron's table has no u32; values outside the dtype are refused.
  CHECK_THAT(test::error_of([&] { IndexedDatasetWriter(dir / "x", TokenDType::U32); }),
             Catch::Contains("dtype u32 has no code in Megatron's dtype table"));
  CHECK_THAT(test::error_of([&] {
               IndexedDatasetWriter w(dir / "y", TokenDType::U8, DTypeCodes::DeepSpeed);
               const int64_t v = -1;
               w.add_sequence(std::span<const int64_t>(&v, 1));
             }),
             Catch::Contains("value -1 does not fit dtype u8"));
  CHECK(files_with(dir.path(), "x.").empty());
  CHECK(files_with(dir.path(), "y.").empty());
}

TEST_CASE("a u64 value above the int64 maximum is one clear error") {
  test::TempDir dir;
  const std::string p = dir / "big";
  std::string idx("MMIDIDX\0\0", 9), bin;
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, 8);  // DeepSpeed: u64
  put<uint64_t>(idx, 1);
  put<uint64_t>(idx, 2);
  put<int32_t>(idx, 2);
  put<int64_t>(idx, 0);
  put<int64_t>(idx, 0);
  put<int64_t>(idx, 1);
  put<uint64_t>(bin, 5);
  put<uint64_t>(bin, (uint64_t{1} << 63) + 5);
  test::spit(p + ".idx", idx);
  test::spit(p + ".bin", bin);
  const IndexedDataset f = IndexedDataset::open(p, DTypeCodes::DeepSpeed);
  int64_t v = 0;
  f.read_values(0, 0, 1, &v);
  CHECK(v == 5);
  const std::string err = test::error_of([&] { f.values(0); });
  CHECK_THAT(err, Catch::Contains(p + ".bin: value 9223372036854775813 (sequence 0, element 1) is above the int64 "
                                      "maximum"));
  CHECK(err.find('\n') == std::string::npos);
}

TEST_CASE("files of a python writer of DeepSpeed's format read back, and ours are the same bytes", "[python]") {
  test::TempDir dir;
  std::vector<std::string> lines;
  const int rc = test::popen_lines("/usr/bin/python3 " + std::string(std::getenv("DS_SOURCE_DIR")) +
                                       "/test/data/ds_indexed_write.py " + dir.path() + " 2>&1",
                                   lines);
  if (rc == 77) DS_SKIP("numpy not importable in /usr/bin/python3");
  REQUIRE(rc == 0);
  // Each line: PREFIX DTYPE then the rows as space-separated values, rows separated by '|'.
  REQUIRE(lines.size() == 4);
  for (const std::string& line : lines) {
    INFO(line);
    std::istringstream in(line);
    std::string prefix, dtype_name, rest;
    in >> prefix >> dtype_name;
    std::getline(in, rest);
    std::vector<std::vector<int64_t>> rows(1);
    std::istringstream r(rest);
    for (std::string tok; r >> tok;) {
      if (tok == "|")
        rows.emplace_back();
      else  // 2^64 - 1 wraps to -1 here; that row is only read for its error
        rows.back().push_back(tok[0] == '-' ? std::stoll(tok) : static_cast<int64_t>(std::stoull(tok)));
    }
    const IndexedDataset f = IndexedDataset::open(prefix, DTypeCodes::DeepSpeed);
    CHECK(token_dtype_name(f.dtype()) == dtype_name);
    REQUIRE(f.num_sequences() == static_cast<int64_t>(rows.size()));
    if (dtype_name == "u64") {  // its last value is 2^64 - 1
      CHECK_THAT(test::error_of([&] { f.values(f.num_sequences() - 1); }), Catch::Contains("above the int64 maximum"));
      rows.pop_back();
    }
    for (size_t i = 0; i < rows.size(); ++i) CHECK(f.values(static_cast<int64_t>(i)) == rows[i]);
    if (dtype_name == "u64") continue;
    IndexedDatasetWriter w(prefix + "_ours", f.dtype(), DTypeCodes::DeepSpeed);
    const std::vector<int64_t> docs = doc_idx(f);
    size_t next = 0;
    for (size_t k = 1; k < docs.size(); ++k) {
      for (; next < static_cast<size_t>(docs[k]); ++next) w.add_sequence(std::span<const int64_t>(rows[next]));
      w.end_document();
    }
    w.finalize();
    CHECK(test::slurp(prefix + "_ours.idx") == test::slurp(prefix + ".idx"));
    CHECK(test::slurp(prefix + "_ours.bin") == test::slurp(prefix + ".bin"));
  }
}

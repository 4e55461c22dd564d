// Tests of the Megatron indexed dataset: exact .idx bytes, write/read round trips,
// no leftovers from an aborted writer, and one-line errors for corrupt files.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>

#include "lib/core/error.h"
#include "lib/data/indexed_dataset.h"
#include "test/data/test_util.h"

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

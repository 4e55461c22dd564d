// The .npy reader and writer (lib/data/npy.h): numpy's own files of every
// accepted dtype and format version read back equal, our files load in numpy
// with equal values (test/data/npy_ref.py; cases tagged [numpy] skip without
// it), header variants numpy's grammar allows are accepted, and every
// malformed or unsupported file is one UserError line naming the file.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <sstream>

#include "lib/core/error.h"
#include "lib/data/npy.h"
#include "test/data/test_util.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using namespace ds;
using namespace ds::data;

namespace {

// A .npy file: magic, version, header length (2 bytes for 1.x, 4 otherwise),
// the dict padded with spaces and a newline to 64 bytes, then `data`.
std::string npy_bytes(const std::string& dict, const std::string& data = "", int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string h = dict;
  while ((prefix + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = std::string("\x93NUMPY", 6) + char(major) + '\0';
  const uint32_t len = static_cast<uint32_t>(h.size());
  out.append(reinterpret_cast<const char*>(&len), major == 1 ? 2 : 4);
  return out + h + data;
}

template <typename T>
std::string raw(std::initializer_list<T> v) {
  return std::string(reinterpret_cast<const char*>(std::data(v)), v.size() * sizeof(T));
}

std::vector<int64_t> values_of(const NpyArray& a) {
  std::vector<int64_t> v(static_cast<size_t>(a.size()));
  for (int64_t i = 0; i < a.size(); ++i) v[static_cast<size_t>(i)] = a.at(i);
  return v;
}

// "FILE DESCR DIMS VALUES..." as npy_ref.py prints it.
std::string line_of(const std::string& name, const NpyArray& a) {
  std::ostringstream s;
  s << name << " " << npy_dtype_descr(a.dtype()) << " ";
  for (int d = 0; d < a.ndim(); ++d) s << (d ? "," : "") << a.shape()[static_cast<size_t>(d)];
  for (int64_t v : values_of(a)) s << " " << v;
  return s.str();
}

int run_ref(const std::string& args, std::vector<std::string>& out) {
  const char* src = std::getenv("DS_SOURCE_DIR");
  return test::popen_lines(fmt::format("/usr/bin/python3 {}/test/data/npy_ref.py {} 2>&1", src ? src : ".", args), out);
}

}  // namespace

TEST_CASE("npy: header forms numpy's grammar allows are read") {
  test::TempDir dir;
  struct Case {
    std::string dict, data;
    int major;
    NpyDType dtype;
    std::vector<int64_t> shape, values;
  };
  const std::vector<Case> cases = {
      {"{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", raw<int32_t>({-1, 7, 2147483647}), 1,
       NpyDType::I32, {3}, {-1, 7, 2147483647}},
      // keys in another order, no trailing comma, the native-order descr
      {"{'shape': (2,), 'fortran_order': False, 'descr': '=i4'}", raw<int32_t>({5, -6}), 1, NpyDType::I32, {2},
       {5, -6}},
      {"{\"descr\": \"<u2\", \"fortran_order\": False, \"shape\": (1, 3)}", raw<uint16_t>({1, 65535, 3}), 1,
       NpyDType::U16, {1, 3}, {1, 65535, 3}},
      {"{'descr': '=u8', 'fortran_order': False, 'shape': (2, 1)}", raw<uint64_t>({0, 1ull << 40}), 2, NpyDType::U64,
       {2, 1}, {0, int64_t{1} << 40}},
      {"{'descr': '<i1', 'fortran_order': False, 'shape': (2,)}", raw<int8_t>({-128, 3}), 3, NpyDType::I8, {2},
       {-128, 3}},
      {"{'descr': '>u1', 'fortran_order': False, 'shape': ( 2 , ) , }", raw<uint8_t>({255, 0}), 1, NpyDType::U8, {2},
       {255, 0}},
      {"{'descr': '<i8', 'fortran_order': False, 'shape': (0, 2)}", "", 1, NpyDType::I64, {0, 2}, {}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    INFO(c.dict);
    const std::string path = dir / fmt::format("ok{}.npy", i);
    test::spit(path, npy_bytes(c.dict, c.data, c.major));
    const NpyArray a = NpyArray::open(path);
    CHECK(a.dtype() == c.dtype);
    CHECK(a.major_version() == c.major);
    CHECK(a.shape() == c.shape);
    CHECK(values_of(a) == c.values);
  }
  // Headers np.save wrote before it aligned them to 64 bytes (16 then): no alignment is required.
  std::string odd = std::string("\x93NUMPY\x01\x00", 8);
  const std::string dict = "{'descr': '<i2', 'fortran_order': False, 'shape': (1,), }\n";
  const uint16_t len = static_cast<uint16_t>(dict.size());
  odd.append(reinterpret_cast<const char*>(&len), 2);
  test::spit(dir / "odd.npy", odd + dict + raw<int16_t>({-300}));
  CHECK(NpyArray::open(dir / "odd.npy").at(0) == -300);
}

TEST_CASE("npy: every malformed or unsupported file is one line naming it") {
  test::TempDir dir;
  const std::string ok_dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }";
  const std::string two = raw<int32_t>({1, 2});
  std::string cut = npy_bytes(ok_dict, two);
  cut.resize(40);  // inside the header
  std::string absurd = npy_bytes(ok_dict, two, 2);
  const uint32_t huge = 0x7fffffff;
  std::memcpy(absurd.data() + 8, &huge, 4);
  auto dict_with = [](const std::string& descr, const std::string& fortran, const std::string& shape) {
    return fmt::format("{{'descr': {}, 'fortran_order': {}, 'shape': {}, }}", descr, fortran, shape);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "bad magic"},
      {"NUMPY and more bytes", "bad magic"},
      {std::string("\x93NUMPY\x01", 7), "truncated .npy file"},
      {cut, "truncated .npy file"},
      {npy_bytes(ok_dict, raw<int32_t>({1})), "holds 4 data bytes, but its header says shape (2,) of <i4 = 8 "
                                              "bytes (a truncated file)"},
      {npy_bytes(ok_dict, raw<int32_t>({1, 2, 3})), "an overlong file"},
      {npy_bytes(ok_dict, two, 4), "unsupported .npy format version 4.0"},
      {absurd, "absurd .npy header length 2147483647"},
      {npy_bytes(dict_with("'<f4'", "False", "(2,)"), two),
       "dtype '<f4' is not supported: not an integer type; only little-endian integer arrays"},
      {npy_bytes(dict_with("'<f8'", "False", "(1,)"), raw<double>({1.5})), "dtype '<f8' is not supported"},
      {npy_bytes(dict_with("'|b1'", "False", "(2,)"), "\1\0"), "dtype '|b1' is not supported"},
      {npy_bytes(dict_with("'>i4'", "False", "(2,)"), two),
       "dtype '>i4' is big-endian; only little-endian integer arrays are read (save a.astype('<i4'))"},
      {npy_bytes(dict_with("'|i4'", "False", "(2,)"), two), "needs a byte order"},
      {npy_bytes(dict_with("'<U3'", "False", "(1,)"), "abcabcabcabc"), "dtype '<U3' is not supported"},
      {npy_bytes(dict_with("[('a', '<i4')]", "False", "(2,)"), two), "structured dtypes are not supported"},
      {npy_bytes(dict_with("'<i4'", "True", "(1, 2)"), two), "Fortran order; only C order is supported"},
      {npy_bytes(dict_with("'<i4'", "False", "()"), raw<int32_t>({1})), "shape () is 0-d"},
      {npy_bytes(dict_with("'<i4'", "False", "(1, 1, 2)"), two), "shape (1, 1, 2) is 3-d"},
      {npy_bytes(dict_with("'<i4'", "False", "(2)"), two), "shape (2) is not a tuple"},
      {npy_bytes(dict_with("'<i4'", "False", "(002,)"), two), "without leading zeros"},
      {npy_bytes(dict_with("'<i4'", "False", "(-2,)"), two), "expected a non-negative integer"},
      {npy_bytes(dict_with("'<i4'", "False", "(9999999999, 9999999999)"), two), "absurd shape"},
      {npy_bytes(dict_with("'<i4'", "False", "(1234567890123456789,)"), two), "absurdly large"},
      {npy_bytes(dict_with("'<i4'", "0", "(2,)"), two), "expected True or False"},
      {npy_bytes("{'descr': '<i4', 'fortran_order': False}", two), "the header lacks the key 'shape'"},
      {npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), 'x': 1}", two), "unexpected key 'x'"},
      {npy_bytes("{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (2,)}", two), "key 'descr' twice"},
      {npy_bytes(ok_dict + " junk", two), "expected only padding after the header dict"},
      {npy_bytes("{'descr': '<i\xc3\xa9', 'fortran_order': False, 'shape': (2,)}", two), "found byte 0xc3"},
      {npy_bytes("{'descr': '<i4' 'fortran_order': False, 'shape': (2,)}", two), "expected ',' or '}'"},
      {npy_bytes("'descr': '<i4'", two), "expected '{' opening the header dict"},
      {npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2,", two), "it ends where a non-negative integer"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir / fmt::format("bad{}.npy", i);
    test::spit(path, cases[i].first);
    const std::string msg = test::error_of([&] { NpyArray::open(path, "sample_idx"); });
    INFO("case " << i << ": " << msg);
    CHECK(msg.find(fmt::format("sample_idx '{}': ", path)) == 0);
    CHECK(msg.find(cases[i].second) != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
  const std::string missing = test::error_of([&] { NpyArray::open(dir / "none.npy", "doc_idx"); });
  CHECK(missing == fmt::format("doc_idx '{}': file not found", dir / "none.npy"));
  CHECK(test::error_of([&] { NpyArray::open(dir.path()); }).find("not a regular file") != std::string::npos);
}

TEST_CASE("npy: write_npy files read back, are aligned and appear whole") {
  test::TempDir dir;
  const std::vector<int32_t> a{-2147483647 - 1, 0, 2147483647, 5, 6, 7};
  const std::vector<int64_t> b{INT64_MIN, INT64_MAX, 1, 2};
  const std::vector<uint32_t> c{4294967295u, 0, 9};
  write_npy(dir / "a.npy", a, std::vector<int64_t>{3, 2});
  write_npy(dir / "b.npy", b, std::vector<int64_t>{4});
  write_npy(dir / "c.npy", c, std::vector<int64_t>{3, 1});
  const NpyArray ra = NpyArray::open(dir / "a.npy"), rb = NpyArray::open(dir / "b.npy"),
                 rc = NpyArray::open(dir / "c.npy");
  CHECK(ra.dtype() == NpyDType::I32);
  CHECK(ra.shape() == std::vector<int64_t>{3, 2});
  CHECK(ra.at(1, 0) == 2147483647);
  CHECK(values_of(ra) == std::vector<int64_t>(a.begin(), a.end()));
  CHECK(values_of(rb) == b);
  CHECK(rc.dtype() == NpyDType::U32);
  CHECK(values_of(rc) == std::vector<int64_t>{4294967295, 0, 9});
  const std::string bytes = test::slurp(dir / "a.npy");
  CHECK(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  CHECK((bytes.size() - a.size() * 4) % 64 == 0);
  CHECK(bytes == npy_file_bytes(a, std::vector<int64_t>{3, 2}));

  // A failed write leaves nothing: neither the file nor its temporary.
  const std::string nowhere = dir / "missing_dir/x.npy";
  CHECK(test::error_of([&] { write_npy(nowhere, a, std::vector<int64_t>{6}); }).find("cannot write") !=
        std::string::npos);
  CHECK_THROWS_AS(write_npy(dir / "d.npy", a, std::vector<int64_t>{4}), ds::Error);  // shape does not match
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    INFO(e.path().string());
    CHECK(e.path().extension() == ".npy");
    ++files;
  }
  CHECK(files == 3);
}

TEST_CASE("npy: numpy's files of every dtype and version read back equal", "[numpy]") {
  test::TempDir dir;
  std::vector<std::string> ref;
  const int rc = run_ref(fmt::format("write {}", dir.path()), ref);
  if (rc == 77) DS_SKIP("numpy not importable in /usr/bin/python3");
  REQUIRE(rc == 0);
  REQUIRE(ref.size() == 8 * 3 * 4);  // dtypes x shapes x (np.save + three versions)
  for (const std::string& want : ref) {
    const std::string name = want.substr(0, want.find(' '));
    const NpyArray a = NpyArray::open(dir / name);
    CHECK(line_of(name, a) == want);
    const char v = name[name.size() - 5];
    if (v != 'e') CHECK(a.major_version() == v - '0');  // ..._v2.npy: format 2.0
  }
}

TEST_CASE("npy: write_npy's files load in numpy with equal values", "[numpy]") {
  test::TempDir dir;
  const std::vector<int32_t> a{-2147483647 - 1, 0, 2147483647, 5, 6, 7};
  const std::vector<int64_t> b{INT64_MIN, INT64_MAX, 1, 2, -3, 4};
  const std::vector<uint32_t> c{4294967295u, 0, 9, 10};
  write_npy(dir / "a.npy", a, std::vector<int64_t>{3, 2});
  write_npy(dir / "b.npy", b, std::vector<int64_t>{6});
  write_npy(dir / "c.npy", c, std::vector<int64_t>{2, 2});
  write_npy(dir / "d.npy", std::span<const int64_t>(), std::vector<int64_t>{0, 2});
  std::vector<std::string> ref;
  const int rc =
      run_ref(fmt::format("read {} {} {} {}", dir / "a.npy", dir / "b.npy", dir / "c.npy", dir / "d.npy"), ref);
  if (rc == 77) DS_SKIP("numpy not importable in /usr/bin/python3");
  REQUIRE(rc == 0);
  REQUIRE(ref.size() == 4);
  CHECK(ref[0] == "a.npy <i4 3,2 -2147483648 0 2147483647 5 6 7");
  CHECK(ref[1] == "b.npy <i8 6 -9223372036854775808 9223372036854775807 1 2 -3 4");
  CHECK(ref[2] == "c.npy <u4 2,2 4294967295 0 9 10");
  CHECK(ref[3] == "d.npy <i8 0,2");
}

// .npy reading (strict header parser + mmap) and writing (np.save's layout,
// written atomically). The header is parsed as the restricted dict literal
// numpy writes, not as general Python: single- or double-quoted strings of
// printable ASCII without escapes, True / False, tuples of decimal integers.
#include "lib/data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"

namespace ds::data {

static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

namespace {

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
// numpy's own reader refuses headers above 10000 bytes unless told to trust the
// file; ours are small dicts, so anything far beyond that is a corrupt length.
constexpr uint64_t kMaxHeaderLen = 1 << 16;
constexpr size_t kAlign = 64;  // np.save pads the header to this

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// The dict literal of a .npy header. `text` is the header, `base` its offset
// in the file (errors give file offsets).
class HeaderParser {
 public:
  HeaderParser(std::string_view text, size_t base, const std::string& what)
      : t_(text), base_(base), what_(what) {}

  NpyHeader parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortran;
    std::optional<std::vector<int64_t>> shape;
    skip_ws();
    expect('{', "'{' opening the header dict");
    while (true) {
      skip_ws();
      if (peek() == '}') break;  // an empty dict, or a trailing comma
      const std::string key = string_literal("a quoted key");
      skip_ws();
      expect(':', "':' after a key");
      skip_ws();
      if (key == "descr") {
        if (descr) duplicate(key);
        if (peek() == '[')
          DS_USER_ERROR("{}: structured dtypes are not supported (expected a plain integer array)", what_);
        descr = string_literal("a quoted descr such as '<i8'");
      } else if (key == "fortran_order") {
        if (fortran) duplicate(key);
        fortran = boolean();
      } else if (key == "shape") {
        if (shape) duplicate(key);
        shape = tuple();
      } else {
        DS_USER_ERROR("{}: unexpected key '{}' in the header (a .npy header has 'descr', 'fortran_order' and "
                      "'shape')", what_, key);
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') fail("',' or '}' after a value");
    }
    ++pos_;  // the '}'
    skip_ws();
    if (pos_ != t_.size()) fail("only padding after the header dict");
    for (const auto& [have, name] : {std::pair{descr.has_value(), "descr"}, {fortran.has_value(), "fortran_order"},
                                     {shape.has_value(), "shape"}})
      if (!have) DS_USER_ERROR("{}: the header lacks the key '{}'", what_, name);
    NpyHeader h;
    h.dtype = dtype_of(*descr);
    if (*fortran)
      DS_USER_ERROR("{}: the array is in Fortran order; only C order is supported (save "
                    "np.ascontiguousarray(a) instead)", what_);
    if (shape->empty() || shape->size() > 2)
      DS_USER_ERROR("{}: shape {} is {}-d; expected a 1-d or 2-d array", what_, shape_str(*shape), shape->size());
    h.shape = std::move(*shape);
    return h;
  }

 private:
  char peek() const { return pos_ < t_.size() ? t_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\t' || t_[pos_] == '\n' || t_[pos_] == '\r')) ++pos_;
  }
  [[noreturn]] void fail(const char* expected) const {
    if (pos_ >= t_.size())
      DS_USER_ERROR("{}: malformed header: it ends where {} was expected", what_, expected);
    const unsigned char c = static_cast<unsigned char>(t_[pos_]);
    const std::string got = c >= 0x20 && c < 0x7f ? fmt::format("'{}'", char(c)) : fmt::format("byte 0x{:02x}", c);
    DS_USER_ERROR("{}: malformed header at byte {}: expected {}, found {}", what_, base_ + pos_, expected, got);
  }
  void expect(char c, const char* what) {
    if (peek() != c) fail(what);
    ++pos_;
  }
  [[noreturn]] void duplicate(const std::string& key) const {
    DS_USER_ERROR("{}: the header gives the key '{}' twice", what_, key);
  }
  std::string string_literal(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"') fail(what);
    ++pos_;
    const size_t start = pos_;
    while (pos_ < t_.size() && t_[pos_] != q) {
      const unsigned char c = static_cast<unsigned char>(t_[pos_]);
      if (c < 0x20 || c >= 0x7f || c == '\\') fail("a plain printable character in a string");
      ++pos_;
    }
    if (pos_ >= t_.size()) fail("the closing quote of a string");
    return std::string(t_.substr(start, pos_++ - start));
  }
  bool boolean() {
    for (const auto& [word, value] : {std::pair{std::string_view("True"), true}, {std::string_view("False"), false}}) {
      if (t_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    fail("True or False");
  }
  int64_t integer() {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
      if (pos_ - start >= 18)
        DS_USER_ERROR("{}: a dimension in the header's shape is absurdly large", what_);
      v = v * 10 + (t_[pos_++] - '0');
    }
    if (pos_ == start) fail("a non-negative integer in the shape");
    if (t_[start] == '0' && pos_ - start > 1) {  // Python rejects 007 too
      pos_ = start;
      fail("an integer without leading zeros");
    }
    return v;
  }
  std::vector<int64_t> tuple() {
    expect('(', "a shape tuple such as (5,) or (3, 2)");
    std::vector<int64_t> dims;
    size_t commas = 0;
    skip_ws();
    while (peek() != ')') {
      if (dims.size() > commas) fail("',' or ')' in the shape");
      dims.push_back(integer());
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        ++commas;
        skip_ws();
      }
    }
    ++pos_;
    if (dims.size() == 1 && commas == 0)
      DS_USER_ERROR("{}: shape ({}) is not a tuple (a 1-d shape is written ({},))", what_, dims[0], dims[0]);
    return dims;
  }
  NpyDType dtype_of(const std::string& d) const {
    const auto unsupported = [&](const char* why) {
      DS_USER_ERROR("{}: dtype '{}' is not supported: {}; only little-endian integer arrays (<i1, <i2, <i4, <i8, "
                    "<u1, <u2, <u4, <u8) are read", what_, d, why);
    };
    if (d.size() != 3 || std::string_view("<>|=").find(d[0]) == std::string_view::npos)
      unsupported("not a plain numeric type");
    if (d[1] != 'i' && d[1] != 'u') unsupported("not an integer type");
    const char size = d[2];
    if (size != '1' && size != '2' && size != '4' && size != '8') unsupported("no such integer size");
    if (size != '1' && d[0] == '>')
      DS_USER_ERROR("{}: dtype '{}' is big-endian; only little-endian integer arrays are read (save "
                    "a.astype('<{}'))", what_, d, d.substr(1));
    if (size != '1' && d[0] == '|') unsupported("a multi-byte type needs a byte order");
    const bool sgn = d[1] == 'i';
    switch (size) {
      case '1': return sgn ? NpyDType::I8 : NpyDType::U8;
      case '2': return sgn ? NpyDType::I16 : NpyDType::U16;
      case '4': return sgn ? NpyDType::I32 : NpyDType::U32;
      default: return sgn ? NpyDType::I64 : NpyDType::U64;
    }
  }

  std::string_view t_;
  size_t base_;
  size_t pos_ = 0;
  const std::string& what_;
};

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

size_t npy_dtype_size(NpyDType t) {
  switch (t) {
    case NpyDType::I8: case NpyDType::U8: return 1;
    case NpyDType::I16: case NpyDType::U16: return 2;
    case NpyDType::I32: case NpyDType::U32: return 4;
    case NpyDType::I64: case NpyDType::U64: return 8;
  }
  return 0;
}

const char* npy_dtype_descr(NpyDType t) {
  switch (t) {
    case NpyDType::I8: return "|i1";
    case NpyDType::U8: return "|u1";
    case NpyDType::I16: return "<i2";
    case NpyDType::U16: return "<u2";
    case NpyDType::I32: return "<i4";
    case NpyDType::U32: return "<u4";
    case NpyDType::I64: return "<i8";
    case NpyDType::U64: return "<u8";
  }
  return "?";
}

int64_t NpyHeader::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // parse_npy_header checked that this does not overflow
  return n;
}

NpyHeader parse_npy_header(std::string_view bytes, const std::string& what) {
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    DS_USER_ERROR("{}: not a .npy file (bad magic; expected \\x93NUMPY)", what);
  if (bytes.size() < 8)
    DS_USER_ERROR("{}: truncated .npy file ({} bytes, less than its header)", what, bytes.size());
  const int major = static_cast<unsigned char>(bytes[6]), minor = static_cast<unsigned char>(bytes[7]);
  if (minor != 0 || major < 1 || major > 3)
    DS_USER_ERROR("{}: unsupported .npy format version {}.{} (expected 1.0, 2.0 or 3.0)", what, major, minor);
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_bytes)
    DS_USER_ERROR("{}: truncated .npy file ({} bytes, less than its header)", what, bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const uint64_t hlen = major == 1 ? load<uint16_t>(p + 8) : load<uint32_t>(p + 8);
  if (hlen > kMaxHeaderLen)
    DS_USER_ERROR("{}: absurd .npy header length {} (at most {} accepted; a corrupt file?)", what, hlen,
                  kMaxHeaderLen);
  const size_t base = 8 + len_bytes;
  if (bytes.size() - base < hlen)
    DS_USER_ERROR("{}: truncated .npy file ({} bytes; its header alone needs {})", what, bytes.size(), base + hlen);
  NpyHeader h = HeaderParser(bytes.substr(base, hlen), base, what).parse();
  h.major = major;
  h.minor = minor;
  h.data_offset = base + hlen;
  int64_t n = 1;
  for (int64_t d : h.shape)
    if (__builtin_mul_overflow(n, d, &n) || n > std::numeric_limits<int64_t>::max() / 8)
      DS_USER_ERROR("{}: absurd shape {} in the header", what, shape_str(h.shape));
  return h;
}

// ---------------------------------------------------------------------------
// Reader

struct NpyArray::Mapping {
  void* addr = nullptr;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr) munmap(addr, bytes);
  }
};

NpyArray NpyArray::open(const std::string& path, const std::string& what) {
  const std::string name = fmt::format("{} '{}'", what, path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) DS_USER_ERROR("{}: file not found", name);
    DS_USER_ERROR("{}: cannot open: {}", name, std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DS_USER_ERROR("{}: not a regular file", name);
  }
  auto m = std::make_shared<Mapping>();
  m->bytes = static_cast<size_t>(st.st_size);
  if (m->bytes > 0) {
    void* addr = mmap(nullptr, m->bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      DS_USER_ERROR("{}: cannot mmap: {}", name, std::strerror(e));
    }
    m->addr = addr;
  }
  ::close(fd);
  const auto* base = static_cast<const unsigned char*>(m->addr);
  NpyArray a;
  a.header_ = parse_npy_header(std::string_view(reinterpret_cast<const char*>(base), m->bytes), name);
  a.size_ = a.header_.num_elements();
  const uint64_t want = static_cast<uint64_t>(a.size_) * npy_dtype_size(a.header_.dtype);
  const uint64_t have = m->bytes - a.header_.data_offset;
  if (have != want)
    DS_USER_ERROR("{}: holds {} data bytes, but its header says shape {} of {} = {} bytes ({} file)", name, have,
                  shape_str(a.header_.shape), npy_dtype_descr(a.header_.dtype), want,
                  have < want ? "a truncated" : "an overlong");
  a.path_ = path;
  a.data_ = base + a.header_.data_offset;
  a.map_ = std::move(m);
  return a;
}

int64_t NpyArray::at(int64_t i) const {
  const unsigned char* p = data_ + i * static_cast<int64_t>(npy_dtype_size(header_.dtype));
  switch (header_.dtype) {
    case NpyDType::I8: return static_cast<int8_t>(*p);
    case NpyDType::U8: return *p;
    case NpyDType::I16: return load<int16_t>(p);
    case NpyDType::U16: return load<uint16_t>(p);
    case NpyDType::I32: return load<int32_t>(p);
    case NpyDType::U32: return load<uint32_t>(p);
    case NpyDType::I64: return load<int64_t>(p);
    case NpyDType::U64: return static_cast<int64_t>(load<uint64_t>(p));
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Writer

std::string npy_header_bytes(NpyDType dtype, std::span<const int64_t> shape) {
  DS_CHECK(shape.size() == 1 || shape.size() == 2, "a .npy array of {} dimensions", shape.size());
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", npy_dtype_descr(dtype),
                                 shape_str(std::vector<int64_t>(shape.begin(), shape.end())));
  const size_t prefix = 10;  // magic, version 1.0, u16 length: a dict of two dimensions is far below 64 KiB
  const size_t pad = kAlign - (prefix + dict.size() + 1) % kAlign;
  dict.append(pad, ' ');
  dict += '\n';
  std::string out(kMagic, sizeof kMagic);
  out += '\x01';
  out += '\0';
  const uint16_t len = static_cast<uint16_t>(dict.size());
  out.append(reinterpret_cast<const char*>(&len), 2);
  return out + dict;
}

namespace {

template <typename T>
NpyDType dtype_for() {
  if constexpr (std::is_same_v<T, int32_t>) return NpyDType::I32;
  else if constexpr (std::is_same_v<T, int64_t>) return NpyDType::I64;
  else return NpyDType::U32;
}

template <typename T>
std::string_view checked_bytes(std::span<const T> data, std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    DS_CHECK(d >= 0, "negative dimension {} in a .npy shape", d);
    n *= d;
  }
  DS_CHECK(n == static_cast<int64_t>(data.size()), "a .npy shape of {} elements for {} values", n, data.size());
  return {reinterpret_cast<const char*>(data.data()), data.size() * sizeof(T)};
}

template <typename T>
void write_any(const std::string& path, std::span<const T> data, std::span<const int64_t> shape) {
  const std::string_view body = checked_bytes(data, shape);
  const std::string head = npy_header_bytes(dtype_for<T>(), shape);
  write_file_atomic(path, std::vector<std::string_view>{head, body});
}

template <typename T>
std::string file_bytes(std::span<const T> data, std::span<const int64_t> shape) {
  const std::string_view body = checked_bytes(data, shape);
  std::string out = npy_header_bytes(dtype_for<T>(), shape);
  out.append(body);
  return out;
}

}  // namespace

void write_npy(const std::string& path, std::span<const int32_t> data, std::span<const int64_t> shape) {
  write_any(path, data, shape);
}
void write_npy(const std::string& path, std::span<const int64_t> data, std::span<const int64_t> shape) {
  write_any(path, data, shape);
}
void write_npy(const std::string& path, std::span<const uint32_t> data, std::span<const int64_t> shape) {
  write_any(path, data, shape);
}
std::string npy_file_bytes(std::span<const int32_t> data, std::span<const int64_t> shape) {
  return file_bytes(data, shape);
}
std::string npy_file_bytes(std::span<const int64_t> data, std::span<const int64_t> shape) {
  return file_bytes(data, shape);
}
std::string npy_file_bytes(std::span<const uint32_t> data, std::span<const int64_t> shape) {
  return file_bytes(data, shape);
}

}  // namespace ds::data

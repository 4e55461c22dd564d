// Megatron indexed dataset: mmap reader with validation, and the temp-then-rename
// writer. Layout of PREFIX.idx (little endian):
//   "MMIDIDX\0\0" | u64 version=1 | u8 dtype code | u64 n_seq | u64 n_doc_idx |
//   i32 sizes[n_seq] | i64 pointers[n_seq] (byte offsets into .bin) | i64 doc_idx[n_doc_idx]
// The dtype code means a type under Megatron's or DeepSpeed's table (DTypeCodes).
#include "lib/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <type_traits>
#include <utility>

#include "lib/core/error.h"

namespace ds::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;  // 34

template <typename T>
T load_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the hosts we run on are little endian
  return v;
}

template <typename T>
void convert(const void* src, int64_t count, int32_t* out, const std::string& file) {
  const T* s = static_cast<const T*>(src);
  for (int64_t k = 0; k < count; ++k) {
    T v = s[k];
    if constexpr (sizeof(T) >= 4) {
      bool bad = static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
      if constexpr (std::is_signed_v<T>) bad = v < 0 || bad;
      if (bad) DS_USER_ERROR("{}: token value {} is not a valid token id", file, v);
    }
    out[k] = static_cast<int32_t>(v);
  }
}

// Elements as int64; a u64 above INT64_MAX is an error naming where it is.
template <typename T>
void widen(const unsigned char* src, int64_t count, int64_t* out, const std::string& file, int64_t seq,
           int64_t offset) {
  for (int64_t k = 0; k < count; ++k) {
    T v;
    std::memcpy(&v, src + k * static_cast<int64_t>(sizeof(T)), sizeof(T));
    if constexpr (std::is_same_v<T, uint64_t>) {
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        DS_USER_ERROR("{}: value {} (sequence {}, element {}) is above the int64 maximum {}", file, v, seq,
                      offset + k, std::numeric_limits<int64_t>::max());
    }
    out[k] = static_cast<int64_t>(v);
  }
}

}  // namespace

size_t token_dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::U8: case TokenDType::I8: return 1;
    case TokenDType::I16: case TokenDType::U16: return 2;
    case TokenDType::I32: case TokenDType::F32: case TokenDType::U32: return 4;
    case TokenDType::I64: case TokenDType::F64: case TokenDType::U64: return 8;
  }
  return 0;
}

const char* token_dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::U8: return "u8";
    case TokenDType::I8: return "i8";
    case TokenDType::I16: return "i16";
    case TokenDType::I32: return "i32";
    case TokenDType::I64: return "i64";
    case TokenDType::F64: return "f64";
    case TokenDType::F32: return "f32";
    case TokenDType::U16: return "u16";
    case TokenDType::U32: return "u32";
    case TokenDType::U64: return "u64";
  }
  return "?";
}

const char* dtype_codes_name(DTypeCodes c) { return c == DTypeCodes::DeepSpeed ? "DeepSpeed" : "Megatron"; }

namespace {
// Codes 6, 7, 8 of each table (1-5 are shared and equal to the enum values).
constexpr TokenDType kMegatronHigh[3] = {TokenDType::F64, TokenDType::F32, TokenDType::U16};
constexpr TokenDType kDeepSpeedHigh[3] = {TokenDType::U16, TokenDType::U32, TokenDType::U64};
}  // namespace

uint8_t dtype_code(TokenDType t, DTypeCodes codes) {
  const uint8_t v = static_cast<uint8_t>(t);
  if (v >= 1 && v <= 5) return v;
  const TokenDType* high = codes == DTypeCodes::DeepSpeed ? kDeepSpeedHigh : kMegatronHigh;
  for (uint8_t k = 0; k < 3; ++k)
    if (high[k] == t) return static_cast<uint8_t>(6 + k);
  return 0;
}

std::optional<TokenDType> dtype_from_code(uint8_t code, DTypeCodes codes) {
  if (code >= 1 && code <= 5) return static_cast<TokenDType>(code);
  if (code >= 6 && code <= 8) return (codes == DTypeCodes::DeepSpeed ? kDeepSpeedHigh : kMegatronHigh)[code - 6];
  return std::nullopt;
}

TokenDType parse_token_dtype(const std::string& s) {
  if (s == "u8" || s == "uint8") return TokenDType::U8;
  if (s == "i8" || s == "int8") return TokenDType::I8;
  if (s == "i16" || s == "int16") return TokenDType::I16;
  if (s == "u16" || s == "uint16") return TokenDType::U16;
  if (s == "i32" || s == "int32") return TokenDType::I32;
  if (s == "i64" || s == "int64") return TokenDType::I64;
  DS_USER_ERROR("unknown token dtype '{}' (expected one of u8, i8, i16, u16, i32, i64)", s);
}

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::U16 : TokenDType::I32;
}

// ---------------------------------------------------------------------------
// Reader

struct IndexedDataset::Mapping {
  void* addr = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (addr) munmap(addr, bytes);
  }
  const unsigned char* data() const { return static_cast<const unsigned char*>(addr); }
};

namespace {
// Maps a whole file read-only. A zero-length file yields an empty mapping.
std::unique_ptr<IndexedDataset::Mapping> map_file(const std::string& path, const char* what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      DS_USER_ERROR("{} file {} not found (a dataset prefix P needs P.bin and P.idx)", what, path);
    DS_USER_ERROR("cannot open {} file {}: {}", what, path, std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    DS_USER_ERROR("{} file {} is not a regular file", what, path);
  }
  auto m = std::make_unique<IndexedDataset::Mapping>();
  m->bytes = static_cast<size_t>(st.st_size);
  if (m->bytes > 0) {
    void* p = mmap(nullptr, m->bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      DS_USER_ERROR("cannot mmap {} file {}: {}", what, path, std::strerror(e));
    }
    m->addr = p;
  }
  ::close(fd);
  return m;
}

// The .bin holds exactly the tokens the .idx describes: a dtype code that
// disagrees with the data (u16 written, i32 claimed) shows here.
void check_bin_size(const IndexedDataset& d, const std::string& idx_path, const std::string& bin_path,
                    int64_t bin_bytes) {
  const int64_t elem = static_cast<int64_t>(token_dtype_size(d.dtype()));
  int64_t tokens = 0;
  for (size_t i = 0; i < d.sizes().size() && tokens <= bin_bytes; ++i) tokens += d.sizes()[i];  // no overflow:
  // each size was checked to lie inside .bin, and the sum stops once it passes it
  if (tokens > bin_bytes / elem || tokens * elem != bin_bytes)
    DS_USER_ERROR("dataset data {} is {} bytes, but {} says it holds {} tokens of dtype {} ({} bytes; wrong "
                  "dtype code {} or a truncated/overlong .bin)", bin_path, bin_bytes, idx_path, tokens,
                  token_dtype_name(d.dtype()), tokens * elem, static_cast<int>(dtype_code(d.dtype(), d.codes())));
}

}  // namespace

IndexedDataset::IndexedDataset(IndexedDataset&&) noexcept = default;
IndexedDataset& IndexedDataset::operator=(IndexedDataset&&) noexcept = default;
IndexedDataset::~IndexedDataset() = default;

IndexedDataset IndexedDataset::open(const std::string& prefix, DTypeCodes codes) {
  IndexedDataset d;
  d.prefix_ = prefix;
  d.codes_ = codes;
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  d.idx_map_ = map_file(idx_path, "dataset index");
  const unsigned char* p = d.idx_map_->data();
  const size_t n = d.idx_map_->bytes;
  if (n < kHeaderBytes)
    DS_USER_ERROR("dataset index {} is truncated ({} bytes, the header alone is {})", idx_path, n,
                  kHeaderBytes);
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0)
    DS_USER_ERROR("dataset index {} is not a Megatron indexed dataset (bad magic; expected "
                  "MMIDIDX)", idx_path);
  uint64_t version = load_le<uint64_t>(p + 9);
  if (version != 1)
    DS_USER_ERROR("dataset index {} has version {}, only version 1 is supported", idx_path, version);
  const uint8_t code = p[17];
  const std::optional<TokenDType> dtype = dtype_from_code(code, codes);
  if (!dtype) DS_USER_ERROR("dataset index {} has unknown dtype code {} (expected 1..8)", idx_path, code);
  d.dtype_ = *dtype;
  uint64_t n_seq = load_le<uint64_t>(p + 18), n_doc = load_le<uint64_t>(p + 26);
  const uint64_t limit = n / 4;  // any count above this cannot fit the file
  if (n_seq > limit || n_doc > limit || kHeaderBytes + 12 * n_seq + 8 * n_doc > n)
    DS_USER_ERROR("dataset index {} is truncated: header says {} sequences and {} document "
                  "entries but the file has only {} bytes", idx_path, n_seq, n_doc, n);
  d.sizes_ = {p + kHeaderBytes, n_seq};
  d.pointers_ = {p + kHeaderBytes + 4 * n_seq, n_seq};
  d.doc_idx_ = {p + kHeaderBytes + 12 * n_seq, n_doc};

  d.bin_map_ = map_file(bin_path, "dataset data");
  const int64_t bin_bytes = static_cast<int64_t>(d.bin_map_->bytes);
  const int64_t elem = static_cast<int64_t>(token_dtype_size(d.dtype_));
  for (uint64_t i = 0; i < n_seq; ++i) {
    int64_t len = d.sizes_[i], ptr = d.pointers_[i];
    if (len < 0 || ptr < 0 || ptr % elem != 0 || ptr > bin_bytes || len > (bin_bytes - ptr) / elem)
      DS_USER_ERROR("dataset data {} is truncated or does not match {}: sequence {} (offset {}, "
                    "{} tokens) lies outside the file's {} bytes", bin_path, idx_path, i, ptr,
                    len, bin_bytes);
  }
  check_bin_size(d, idx_path, bin_path, bin_bytes);
  if (n_doc == 0 || d.doc_idx_[0] != 0 || d.doc_idx_[n_doc - 1] != static_cast<int64_t>(n_seq))
    DS_USER_ERROR("dataset index {} is corrupt: its document index ({} entries) must run from 0 to the "
                  "sequence count {}, but {}", idx_path, n_doc, n_seq,
                  n_doc == 0 ? std::string("it is empty")
                             : fmt::format("runs from {} to {}", d.doc_idx_[0], d.doc_idx_[n_doc - 1]));
  for (uint64_t k = 1; k < n_doc; ++k) {
    int64_t v = d.doc_idx_[k];
    if (v < d.doc_idx_[k - 1])
      DS_USER_ERROR("dataset index {} is corrupt: document index entry {} = {} (must be "
                    "non-decreasing and at most {})", idx_path, k, v, n_seq);
  }
  return d;
}

SequenceView IndexedDataset::sequence(int64_t i) const {
  DS_CHECK(i >= 0 && i < num_sequences(), "sequence {} out of range [0, {})", i, num_sequences());
  return {bin_map_->data() + pointers_[i], sizes_[i]};
}

int64_t IndexedDataset::num_tokens() const {
  int64_t t = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) t += sizes_[i];
  return t;
}

void IndexedDataset::read_tokens(int64_t i, int64_t offset, int64_t count, int32_t* out) const {
  DS_CHECK(offset >= 0 && count >= 0 && offset + count <= sequence_length(i),
           "read of [{}, {}) outside sequence {} of length {}", offset, offset + count, i,
           sequence_length(i));
  const std::string& file = prefix_;
  const unsigned char* src =
      bin_map_->data() + pointers_[i] + offset * static_cast<int64_t>(token_dtype_size(dtype_));
  switch (dtype_) {
    case TokenDType::U8: convert<uint8_t>(src, count, out, file); break;
    case TokenDType::I8: convert<int8_t>(src, count, out, file); break;
    case TokenDType::I16: convert<int16_t>(src, count, out, file); break;
    case TokenDType::U16: convert<uint16_t>(src, count, out, file); break;
    case TokenDType::I32: convert<int32_t>(src, count, out, file); break;
    case TokenDType::I64: convert<int64_t>(src, count, out, file); break;
    case TokenDType::U32: convert<uint32_t>(src, count, out, file); break;
    case TokenDType::U64: convert<uint64_t>(src, count, out, file); break;
    case TokenDType::F32: case TokenDType::F64:
      DS_USER_ERROR("dataset {} holds floating-point values ({}), not token ids", prefix_,
                    token_dtype_name(dtype_));
  }
  if (dtype_ == TokenDType::I8 || dtype_ == TokenDType::I16) {
    for (int64_t k = 0; k < count; ++k)
      if (out[k] < 0) DS_USER_ERROR("{}: token value {} is not a valid token id", file, out[k]);
  }
}

void IndexedDataset::read_values(int64_t i, int64_t offset, int64_t count, int64_t* out) const {
  DS_CHECK(offset >= 0 && count >= 0 && offset + count <= sequence_length(i),
           "read of [{}, {}) outside sequence {} of length {}", offset, offset + count, i,
           sequence_length(i));
  const std::string file = prefix_ + ".bin";
  const unsigned char* src =
      bin_map_->data() + pointers_[i] + offset * static_cast<int64_t>(token_dtype_size(dtype_));
  switch (dtype_) {
    case TokenDType::U8: widen<uint8_t>(src, count, out, file, i, offset); break;
    case TokenDType::I8: widen<int8_t>(src, count, out, file, i, offset); break;
    case TokenDType::I16: widen<int16_t>(src, count, out, file, i, offset); break;
    case TokenDType::U16: widen<uint16_t>(src, count, out, file, i, offset); break;
    case TokenDType::I32: widen<int32_t>(src, count, out, file, i, offset); break;
    case TokenDType::U32: widen<uint32_t>(src, count, out, file, i, offset); break;
    case TokenDType::I64: widen<int64_t>(src, count, out, file, i, offset); break;
    case TokenDType::U64: widen<uint64_t>(src, count, out, file, i, offset); break;
    case TokenDType::F32: case TokenDType::F64:
      DS_USER_ERROR("dataset {} holds floating-point values ({}), not integers", prefix_, token_dtype_name(dtype_));
  }
}

std::vector<int64_t> IndexedDataset::values(int64_t i) const {
  std::vector<int64_t> v(static_cast<size_t>(sequence_length(i)));
  read_values(i, 0, static_cast<int64_t>(v.size()), v.data());
  return v;
}

int64_t max_token_id(const IndexedDataset& ds) {
  int64_t best = -1;
  std::vector<int32_t> buf;
  for (int64_t i = 0; i < ds.num_sequences(); ++i) {
    int64_t len = ds.sequence_length(i);
    for (int64_t off = 0; off < len; off += 1 << 16) {
      int64_t n = std::min<int64_t>(1 << 16, len - off);
      buf.resize(n);
      ds.read_tokens(i, off, n, buf.data());
      for (int32_t t : buf) best = std::max<int64_t>(best, t);
    }
  }
  return best;
}

// ---------------------------------------------------------------------------
// Writer

namespace {

// The range a writer accepts for `t`: tokens are never negative; values may be
// anything the dtype holds.
std::pair<int64_t, int64_t> dtype_range(TokenDType t, bool tokens) {
  int64_t lo = 0, hi = 0;
  switch (t) {
    case TokenDType::U8: hi = 255; break;
    case TokenDType::I8: lo = -128, hi = 127; break;
    case TokenDType::I16: lo = -32768, hi = 32767; break;
    case TokenDType::U16: hi = 65535; break;
    case TokenDType::I32: lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max(); break;
    case TokenDType::U32: hi = std::numeric_limits<uint32_t>::max(); break;
    default: lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max(); break;
  }
  if (tokens) lo = 0, hi = std::min<int64_t>(hi, std::numeric_limits<int32_t>::max());
  return {lo, hi};
}

// Encodes `in` into `buf` as little-endian elements of `t` (already range-checked).
template <typename T>
void encode(std::span<const T> in, TokenDType t, std::vector<unsigned char>& buf) {
  const size_t elem = token_dtype_size(t);
  buf.resize(in.size() * elem);
  for (size_t k = 0; k < in.size(); ++k) {
    const int64_t v = in[k];
    unsigned char* dst = buf.data() + k * elem;
    if (elem == 1) {
      dst[0] = static_cast<unsigned char>(v);
    } else if (elem == 2) {
      const uint16_t x = static_cast<uint16_t>(v);
      std::memcpy(dst, &x, 2);
    } else if (elem == 4) {
      const uint32_t x = static_cast<uint32_t>(v);
      std::memcpy(dst, &x, 4);
    } else {
      std::memcpy(dst, &v, 8);
    }
  }
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenDType dtype, DTypeCodes codes)
    : prefix_(std::move(prefix)), dtype_(dtype), codes_(codes) {
  if (dtype_ == TokenDType::F32 || dtype_ == TokenDType::F64)
    DS_USER_ERROR("token dtype must be an integer type, got {}", token_dtype_name(dtype_));
  if (dtype_code(dtype_, codes_) == 0)
    DS_USER_ERROR("dtype {} has no code in {}'s dtype table (cannot write {})", token_dtype_name(dtype_),
                  dtype_codes_name(codes_), prefix_);
  std::filesystem::path parent = std::filesystem::path(prefix_).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec)
    DS_USER_ERROR("cannot create output directory {}: {}", parent.string(), ec.message());
  std::string tmp = prefix_ + ".bin.tmp";
  bin_ = std::fopen(tmp.c_str(), "wb");
  if (!bin_) DS_USER_ERROR("cannot write {}: {}", tmp, std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (!finalized_) abort_files();
}

void IndexedDatasetWriter::abort_files() noexcept {
  if (bin_) std::fclose(bin_);
  bin_ = nullptr;
  std::remove((prefix_ + ".bin.tmp").c_str());
  std::remove((prefix_ + ".idx.tmp").c_str());
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  DS_CHECK(!finalized_ && bin_, "writer for {} is already finalized", prefix_);
  const auto [lo, hi] = dtype_range(dtype_, true);
  for (const int32_t v : tokens)
    if (v < lo || v > hi)
      DS_USER_ERROR("token id {} does not fit dtype {} of {} (use a wider --dtype)", v,
                    token_dtype_name(dtype_), prefix_);
  encode(tokens, dtype_, buf_);
  write_sequence(tokens.size());
}

void IndexedDatasetWriter::add_sequence(std::span<const int64_t> values) {
  DS_CHECK(!finalized_ && bin_, "writer for {} is already finalized", prefix_);
  const auto [lo, hi] = dtype_range(dtype_, false);
  for (const int64_t v : values)
    if (v < lo || v > hi)
      DS_USER_ERROR("value {} does not fit dtype {} of {}", v, token_dtype_name(dtype_), prefix_);
  encode(values, dtype_, buf_);
  write_sequence(values.size());
}

void IndexedDatasetWriter::write_sequence(size_t count) {
  if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), bin_) != buf_.size())
    DS_USER_ERROR("write to {}.bin.tmp failed: {}", prefix_, std::strerror(errno));
  DS_USER_CHECK(count <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                "sequence of {} elements is too long for the .idx format", count);
  sizes_.push_back(static_cast<int32_t>(count));
  num_tokens_ += static_cast<int64_t>(count);
}

void IndexedDatasetWriter::end_document() {
  doc_idx_.push_back(static_cast<int64_t>(sizes_.size()));
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  add_sequence(tokens);
  end_document();
}

void IndexedDatasetWriter::finalize() {
  DS_CHECK(!finalized_ && bin_, "writer for {} is already finalized", prefix_);
  const std::string bin_tmp = prefix_ + ".bin.tmp", idx_tmp = prefix_ + ".idx.tmp";
  bool ok = std::fflush(bin_) == 0 && fsync(fileno(bin_)) == 0;
  ok = (std::fclose(bin_) == 0) && ok;
  bin_ = nullptr;
  if (!ok) DS_USER_ERROR("write to {} failed: {}", bin_tmp, std::strerror(errno));

  std::FILE* f = std::fopen(idx_tmp.c_str(), "wb");
  if (!f) DS_USER_ERROR("cannot write {}: {}", idx_tmp, std::strerror(errno));
  uint64_t version = 1, n_seq = sizes_.size(), n_doc = doc_idx_.size();
  const uint8_t code = dtype_code(dtype_, codes_);
  std::vector<int64_t> pointers(sizes_.size());
  int64_t ptr = 0;
  for (size_t i = 0; i < sizes_.size(); ++i) {
    pointers[i] = ptr;
    ptr += static_cast<int64_t>(sizes_[i]) * static_cast<int64_t>(token_dtype_size(dtype_));
  }
  ok = std::fwrite(kMagic, 1, 9, f) == 9 && std::fwrite(&version, 8, 1, f) == 1 &&
       std::fwrite(&code, 1, 1, f) == 1 && std::fwrite(&n_seq, 8, 1, f) == 1 &&
       std::fwrite(&n_doc, 8, 1, f) == 1 &&
       std::fwrite(sizes_.data(), 4, n_seq, f) == n_seq &&
       std::fwrite(pointers.data(), 8, n_seq, f) == n_seq &&
       std::fwrite(doc_idx_.data(), 8, n_doc, f) == n_doc && std::fflush(f) == 0 &&
       fsync(fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) DS_USER_ERROR("write to {} failed: {}", idx_tmp, std::strerror(errno));

  // Drop any old .idx first, then move .bin, then .idx: a reader that looks in
  // between finds no index (a clear error), never a new .bin under an old .idx.
  std::remove((prefix_ + ".idx").c_str());
  if (std::rename(bin_tmp.c_str(), (prefix_ + ".bin").c_str()) != 0)
    DS_USER_ERROR("cannot rename {} into place: {}", bin_tmp, std::strerror(errno));
  if (std::rename(idx_tmp.c_str(), (prefix_ + ".idx").c_str()) != 0) {
    int e = errno;
    std::remove((prefix_ + ".bin").c_str());
    DS_USER_ERROR("cannot rename {} into place: {}", idx_tmp, std::strerror(e));
  }
  finalized_ = true;
}

}  // namespace ds::data

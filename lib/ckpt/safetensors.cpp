// Safetensors reader (mmap + full header validation) and writer (atomic:
// temp file, fsync, rename). Validation follows the format's rules: header
// length within the file and at most 100 MB, a JSON object starting with '{',
// known dtypes, byte ranges matching shape * element size, and ranges that
// tile the data section with no gap, overlap or trailing bytes.
#include "lib/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "lib/ckpt/crc32c.h"
#include "lib/ckpt/file_io.h"
#include "lib/core/progress.h"
#include "lib/io/aio.h"
#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/json_config.h"

namespace ds {

namespace {

constexpr uint64_t kMaxHeader = 100000000;  // same limit as the reference reader

struct StDtype {
  const char* name;
  int size;  // bytes per element
  int rank;  // position in the reference implementation's dtype order
};
// Every dtype of the format with a whole-byte element size.
constexpr StDtype kStDtypes[] = {
    {"BOOL", 1, 0},     {"U8", 1, 4},       {"I8", 1, 5},  {"F8_E5M2", 1, 6}, {"F8_E4M3", 1, 7},
    {"F8_E8M0", 1, 8},  {"I16", 2, 9},      {"U16", 2, 10}, {"F16", 2, 11},    {"BF16", 2, 12},
    {"I32", 4, 13},     {"U32", 4, 14},     {"F32", 4, 15}, {"C64", 8, 16},    {"F64", 8, 17},
    {"I64", 8, 18},     {"U64", 8, 19},
};

const StDtype* find_st_dtype(const std::string& s) {
  for (const auto& d : kStDtypes)
    if (s == d.name) return &d;
  return nullptr;
}

bool dtype_from_st(const std::string& s, DType& out) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U16, DType::U8}) {
    if (s == safetensors_dtype_name(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

void put_u64_le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
  }
  return "?";
}

// ---------------------------------------------------------------- writer

void SafetensorsWriter::add(const std::string& name, const Tensor& t) {
  DS_CHECK(!name.empty() && name != "__metadata__", "invalid safetensors tensor name '{}'", name);
  DS_CHECK(t.defined() || t.numel() == 0, "safetensors: tensor '{}' is undefined", name);
  for (const auto& e : tensors_) DS_CHECK(e.first != name, "safetensors: tensor '{}' added twice", name);
  tensors_.emplace_back(name, t.device().is_cpu() ? t : t.to(Device::cpu()));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

uint64_t SafetensorsWriter::Entry::nbytes() const {
  return static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype);
}

void SafetensorsWriter::declare_f32(const std::string& name, const Shape& shape) {
  declared_.emplace_back(name, shape);
}

std::vector<SafetensorsWriter::Entry> SafetensorsWriter::file_order() const {
  std::vector<Entry> order;
  for (const auto& e : tensors_) order.push_back({e.first, e.second.dtype(), e.second.shape(), &e.second});
  for (const auto& [name, shape] : declared_) order.push_back({name, DType::F32, shape, nullptr});
  auto rank = [](DType t) { return find_st_dtype(safetensors_dtype_name(t))->rank; };
  std::sort(order.begin(), order.end(), [&](const Entry& a, const Entry& b) {
    const int ra = rank(a.dtype), rb = rank(b.dtype);
    return ra != rb ? ra > rb : a.name < b.name;
  });
  return order;
}

std::vector<std::string> SafetensorsWriter::streamed_order() const {
  std::vector<std::string> out;
  for (const Entry& e : file_order())
    if (!e.data) out.push_back(e.name);
  return out;
}

std::string SafetensorsWriter::header_bytes(const std::vector<Entry>& order) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry& e : order) {
    const uint64_t n = e.nbytes();
    header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string json_text = header.dump();
  json_text.append((8 - json_text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json_text.size());
  put_u64_le(out, json_text.size());
  out += json_text;
  return out;
}

std::string SafetensorsWriter::serialize() const {
  DS_CHECK(declared_.empty(), "SafetensorsWriter::serialize: declared tensors are written by write_streamed");
  const auto order = file_order();
  std::string out = header_bytes(order);
  for (const Entry& e : order) out.append(static_cast<const char*>(e.data->raw()), e.nbytes());
  return out;
}

void SafetensorsWriter::write(const std::string& path, Progress* progress) const {
  DS_CHECK(declared_.empty(), "SafetensorsWriter::write: declared tensors are written by write_streamed");
  // Header, then each tensor straight from its own memory: no copy of the file.
  const auto order = file_order();
  const std::string header = header_bytes(order);
  std::vector<std::string_view> pieces{header};
  for (const Entry& e : order)
    pieces.emplace_back(static_cast<const char*>(e.data->raw()), static_cast<size_t>(e.nbytes()));
  write_file_atomic(path, pieces, progress);
}

void SafetensorsWriter::write_streamed(const std::string& path,
                                       const std::function<Tensor(const std::string& name)>& next,
                                       Progress* progress) const {
  write_streamed_bytes(
      path,
      [&](const std::string& name, const std::function<void(std::string_view)>& sink) {
        const Tensor t = next(name);
        const Shape& shape = std::find_if(declared_.begin(), declared_.end(), [&](const auto& d) {
                               return d.first == name;
                             })->second;
        DS_CHECK(t.dtype() == DType::F32 && t.shape() == shape && t.device().is_cpu(),
                 "write_streamed: tensor '{}' came as {} {}, declared F32 {}", name, dtype_name(t.dtype()),
                 shape_str(t.shape()), shape_str(shape));
        sink({static_cast<const char*>(t.raw()), static_cast<size_t>(t.nbytes())});
      },
      progress);
}

void SafetensorsWriter::write_streamed_bytes(const std::string& path, const EmitBytes& emit,
                                             Progress* progress) const {
  const auto order = file_order();
  const std::string header = header_bytes(order);
  write_file_atomic_stream(
      path,
      [&](const ByteSink& sink) {
        sink(header);
        for (const Entry& e : order) {
          if (e.data) {
            sink({static_cast<const char*>(e.data->raw()), static_cast<size_t>(e.nbytes())});
            continue;
          }
          uint64_t n = 0;
          emit(e.name, [&](std::string_view piece) {
            n += piece.size();
            DS_CHECK(n <= e.nbytes(), "write_streamed: tensor '{}' got more than its {} bytes", e.name, e.nbytes());
            sink(piece);
          });
          DS_CHECK(n == e.nbytes(), "write_streamed: tensor '{}' got {} of its {} bytes", e.name, n, e.nbytes());
        }
      },
      progress);
}

// ---------------------------------------------------------------- reader

namespace {

std::shared_ptr<const uint8_t> map_file(const std::string& path, uint64_t& size, std::shared_ptr<const int>& fd_out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DS_USER_CHECK(fd >= 0, "safetensors file '{}' cannot be opened: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    DS_USER_ERROR("safetensors file '{}' cannot be read: {}", path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    DS_USER_ERROR("safetensors file '{}' is not a regular file", path);
  }
  size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    DS_USER_ERROR("safetensors file '{}' is {} bytes, too short for a header (truncated?)", path, size);
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  if (p == MAP_FAILED) ::close(fd);
  DS_USER_CHECK(p != MAP_FAILED, "safetensors file '{}' cannot be mapped: {}", path, std::strerror(err));
  // Tensor data is read with pread (read_f32, get): one copy from the page
  // cache, no page faults on the mapping, which serves the header only.
  fd_out = std::shared_ptr<const int>(new int(fd), [](const int* q) {
    ::close(*q);
    delete q;
  });
  return std::shared_ptr<const uint8_t>(static_cast<const uint8_t*>(p),
                                        [size](const uint8_t* q) { ::munmap(const_cast<uint8_t*>(q), size); });
}

uint64_t checked_u64(const nlohmann::json& v, const std::string& what, const std::string& path) {
  DS_USER_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
                "safetensors file '{}': {} must be a non-negative integer, got {}", path, what, v.dump());
  return v.get<uint64_t>();
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  uint64_t size = 0;
  f.mapping_ = map_file(path, size, f.fd_);
  f.size_ = size;
  const uint64_t n = get_u64_le(f.mapping_.get());
  DS_USER_CHECK(n <= size - 8, "safetensors file '{}': header length {} runs past the end of the file ({} bytes); "
                "truncated or not a safetensors file", path, n, size);
  DS_USER_CHECK(n <= kMaxHeader, "safetensors file '{}': header length {} exceeds the 100 MB limit", path, n);
  const char* h = reinterpret_cast<const char*>(f.mapping_.get() + 8);
  DS_USER_CHECK(n > 0 && h[0] == '{', "safetensors file '{}': header does not start with '{{'", path);
  const nlohmann::json header = parse_json_text(std::string_view(h, n), "safetensors file '" + path + "' header");
  DS_USER_CHECK(header.is_object(), "safetensors file '{}': header is not a JSON object", path);
  f.data_offset_ = 8 + n;
  f.parse_header(header, size - 8 - n);
  return f;
}

void SafetensorsFile::parse_header(const nlohmann::json& header, uint64_t data_size) {
  const std::string& path = path_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      DS_USER_CHECK(v.is_object(), "safetensors file '{}': __metadata__ must be an object", path);
      for (auto m = v.begin(); m != v.end(); ++m) {
        DS_USER_CHECK(m.value().is_string(), "safetensors file '{}': __metadata__.{} must be a string", path, m.key());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    DS_USER_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
                  "safetensors file '{}': tensor '{}' needs dtype, shape and data_offsets", path, name);
    Entry e;
    DS_USER_CHECK(v["dtype"].is_string(), "safetensors file '{}': tensor '{}' dtype is not a string", path, name);
    e.dtype = v["dtype"].get<std::string>();
    const StDtype* d = find_st_dtype(e.dtype);
    DS_USER_CHECK(d != nullptr, "safetensors file '{}': tensor '{}' has unknown dtype '{}'", path, name, e.dtype);
    DS_USER_CHECK(v["shape"].is_array(), "safetensors file '{}': tensor '{}' shape is not a list", path, name);
    uint64_t bytes = static_cast<uint64_t>(d->size);
    for (const auto& dim : v["shape"]) {
      const uint64_t x = checked_u64(dim, "tensor '" + name + "' shape entry", path);
      DS_USER_CHECK(x <= static_cast<uint64_t>(INT64_MAX) && (x == 0 || bytes <= UINT64_MAX / x),
                    "safetensors file '{}': tensor '{}' is too large", path, name);
      bytes *= x;
      e.shape.push_back(static_cast<int64_t>(x));
    }
    const auto& off = v["data_offsets"];
    DS_USER_CHECK(off.is_array() && off.size() == 2, "safetensors file '{}': tensor '{}' data_offsets must be "
                  "[begin, end]", path, name);
    e.begin = checked_u64(off[0], "tensor '" + name + "' data_offsets", path);
    e.end = checked_u64(off[1], "tensor '" + name + "' data_offsets", path);
    DS_USER_CHECK(e.begin <= e.end && e.end - e.begin == bytes,
                  "safetensors file '{}': tensor '{}' has data_offsets [{}, {}] but {} {} needs {} bytes", path,
                  name, e.begin, e.end, e.dtype, shape_str(e.shape), bytes);
    entries_[name] = std::move(e);
  }
  check_layout(data_size);
}

// The byte ranges must tile [0, data_size) exactly.
void SafetensorsFile::check_layout(uint64_t data_size) const {
  std::vector<std::pair<uint64_t, const std::string*>> starts;
  for (const auto& [name, e] : entries_) starts.emplace_back(e.begin, &name);
  std::sort(starts.begin(), starts.end(), [&](const auto& a, const auto& b) {
    const Entry& ea = entries_.at(*a.second);
    const Entry& eb = entries_.at(*b.second);
    return ea.begin != eb.begin ? ea.begin < eb.begin : ea.end < eb.end;
  });
  uint64_t pos = 0;
  for (const auto& [begin, name] : starts) {
    const Entry& e = entries_.at(*name);
    DS_USER_CHECK(e.begin == pos, "safetensors file '{}': tensor '{}' starts at byte {} of the data, expected {} "
                  "(gap or overlap)", path_, *name, e.begin, pos);
    DS_USER_CHECK(e.end <= data_size, "safetensors file '{}': tensor '{}' ends at data byte {} but the file has only "
                  "{} data bytes (truncated)", path_, *name, e.end, data_size);
    pos = e.end;
  }
  DS_USER_CHECK(pos == data_size, "safetensors file '{}': {} bytes after the last tensor (data section is {} bytes, "
                "tensors cover {})", path_, data_size - pos, data_size, pos);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  DS_USER_CHECK(it != entries_.end(), "safetensors file '{}' has no tensor '{}'", path_, name);
  return it->second;
}

DType SafetensorsFile::dtype(const std::string& name) const {
  const Entry& e = entry(name);
  DType t;
  DS_USER_CHECK(dtype_from_st(e.dtype, t), "safetensors file '{}': tensor '{}' has dtype {}, which dstrain does not "
                "read (F32, BF16, F16, I32, I64, U16, U8)", path_, name, e.dtype);
  return t;
}

Shape SafetensorsFile::shape(const std::string& name) const { return entry(name).shape; }

std::string SafetensorsFile::dtype_string(const std::string& name) const { return entry(name).dtype; }

void SafetensorsFile::read_f32(const std::string& name, int64_t first, int64_t count, float* out) const {
  const Entry& e = entry(name);
  DS_CHECK(e.dtype == "F32", "read_f32('{}'): the tensor is {}", name, e.dtype);
  DS_CHECK(first >= 0 && count >= 0 && static_cast<uint64_t>(first + count) * 4 <= e.end - e.begin,
           "read_f32('{}'): elements [{}, {}) outside the tensor", name, first, first + count);
  if (count <= 0) return;
  copy_out(e.begin + static_cast<uint64_t>(first) * 4, static_cast<size_t>(count) * 4, out);
}

struct SafetensorsFile::ReadRecord {
  struct Span {
    uint64_t begin, end;
    uint32_t crc;
  };
  std::vector<Span> spans;  // in read order; a read continuing the last one extends it
  Progress* progress = nullptr;
  std::unique_ptr<DirectReader> direct;  // O_DIRECT reads where the file system allows them
  uint64_t chunk = 0;                    // > 0: no span crosses a multiple of it
  uint64_t bytes = 0;                    // checksummed so far (reads and gap reads)
  // Bytes [off, off + n) of the file, just read into `data`.
  void add(uint64_t off, const char* data, size_t n) {
    bytes += n;
    if (progress) progress->add(static_cast<int64_t>(n));
    while (n > 0) {
      const size_t k = chunk ? static_cast<size_t>(std::min<uint64_t>(n, chunk - off % chunk)) : n;
      const bool at_start = chunk && off % chunk == 0;  // a new chunk starts a new span
      if (!spans.empty() && spans.back().end == off && !at_start) {
        spans.back().crc = crc32c(data, k, spans.back().crc);
        spans.back().end += k;
      } else {
        spans.push_back({off, off + k, crc32c(data, k)});
      }
      off += k, data += k, n -= k;
    }
  }
};

void SafetensorsFile::read_f32(std::vector<F32Read> reads) const {
  struct Piece {
    uint64_t at;  // data-section offset
    size_t bytes;
    char* out;
  };
  std::vector<Piece> pieces;
  for (const F32Read& r : reads) {
    const Entry& e = entry(r.name);
    DS_CHECK(e.dtype == "F32", "read_f32('{}'): the tensor is {}", r.name, e.dtype);
    DS_CHECK(r.first >= 0 && r.count >= 0 && static_cast<uint64_t>(r.first + r.count) * 4 <= e.end - e.begin,
             "read_f32('{}'): elements [{}, {}) outside the tensor", r.name, r.first, r.first + r.count);
    if (r.count > 0)
      pieces.push_back({e.begin + static_cast<uint64_t>(r.first) * 4, static_cast<size_t>(r.count) * 4,
                        reinterpret_cast<char*>(r.out)});
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.at < b.at; });
  // A tracked O_DIRECT read streams across gaps of up to one window: the
  // checksum needs those bytes anyway, and a TP rank's rows of a weight
  // (a slice of each row) would otherwise be one small request each.
  const uint64_t max_gap = reads_ && reads_->direct ? kStreamGap : 0;
  for (size_t i = 0; i < pieces.size();) {
    size_t j = i + 1;  // [i, j): pieces that follow each other in the file, at most max_gap apart
    while (j < pieces.size() && pieces[j].at >= pieces[j - 1].at + pieces[j - 1].bytes &&
           pieces[j].at - (pieces[j - 1].at + pieces[j - 1].bytes) <= max_gap)
      ++j;
    if (!reads_ || !reads_->direct || j == i + 1) {
      for (; i < j; ++i) copy_out(pieces[i].at, pieces[i].bytes, pieces[i].out);
      continue;
    }
    // One stream over the run; each arriving window is checksummed whole and
    // split among its pieces (bytes between pieces are not copied).
    const uint64_t begin = data_offset_ + pieces[i].at;
    const uint64_t end = data_offset_ + pieces[j - 1].at + pieces[j - 1].bytes;
    size_t k = i;
    reads_->direct->read(begin, end - begin, [&](uint64_t pos, const char* data, size_t n) {
      reads_->add(pos, data, n);
      while (n > 0) {
        const uint64_t at = pos - data_offset_;
        while (at >= pieces[k].at + pieces[k].bytes) ++k;
        size_t m;
        if (at < pieces[k].at) {  // a gap before piece k
          m = static_cast<size_t>(std::min<uint64_t>(n, pieces[k].at - at));
        } else {
          m = static_cast<size_t>(std::min<uint64_t>(n, pieces[k].at + pieces[k].bytes - at));
          std::memcpy(pieces[k].out + (at - pieces[k].at), data, m);
        }
        pos += m, data += m, n -= m;
      }
    });
    i = j;
  }
}

// pread of data-section bytes [at, at + bytes) into dst. The mapping is not
// touched, so what a rank reads of a large checkpoint (or HF weights, tensor
// by tensor) is its copy alone in its resident set, and the kernel copies
// straight from the page cache without a fault per page. A file cut short
// since it was opened is an error naming it.
void SafetensorsFile::copy_out(uint64_t at, size_t bytes, void* dst) const {
  if (!reads_) return pread_exact(data_offset_ + at, bytes, dst);
  auto* out = static_cast<char*>(dst);
  uint64_t off = data_offset_ + at;
  if (reads_->direct) {
    // O_DIRECT, several requests in flight: each arriving window is
    // checksummed while it is in the cache and copied into place.
    reads_->direct->read(off, bytes, [&](uint64_t pos, const char* data, size_t n) {
      std::memcpy(out + (pos - off), data, n);
      reads_->add(pos, data, n);
    });
    return;
  }
  // Through the page cache: read in chunks and checksum each while it is in
  // the cache; the kernel's readahead keeps the disk busy meanwhile.
  constexpr size_t kChunk = size_t(8) << 20;
  while (bytes > 0) {
    const size_t k = std::min(bytes, kChunk);
    pread_exact(off, k, out);
    reads_->add(off, out, k);
    out += k;
    off += k;
    bytes -= k;
  }
}

void SafetensorsFile::pread_exact(uint64_t off, size_t bytes, void* dst) const {
  auto* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t k = ::pread(*fd_, out, std::min<size_t>(bytes, size_t(1) << 30), static_cast<off_t>(off));
    if (k < 0 && errno == EINTR) continue;
    DS_USER_CHECK(k > 0, "safetensors file '{}' cannot be read at byte {}: {}", path_, off,
                  k == 0 ? "the file is shorter than its header says (truncated while open?)" : std::strerror(errno));
    out += k;
    off += static_cast<uint64_t>(k);
    bytes -= static_cast<size_t>(k);
  }
}

void SafetensorsFile::track_reads(Progress* progress, uint64_t chunk) {
  reads_ = std::make_shared<ReadRecord>();
  reads_->progress = progress;
  reads_->chunk = chunk;
  AioConfig cfg;
  cfg.block_size = 4 << 20;
  cfg.queue_depth = 8;
  reads_->direct = DirectReader::open(path_, cfg);
  ::posix_fadvise(*fd_, 0, 0, POSIX_FADV_SEQUENTIAL);  // the largest readahead, as file_crc32c asks
}

uint32_t SafetensorsFile::range_crc(uint64_t lo, uint64_t hi) const {
  // The spans inside [lo, hi) in file order, joined with crc32c_combine;
  // what they leave out (or cover twice) is read from the file now.
  std::vector<ReadRecord::Span> spans;
  for (const auto& s : reads_->spans)
    if (s.begin >= lo && s.end <= hi) spans.push_back(s);
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  uint32_t crc = 0;
  uint64_t pos = lo;  // the CRC covers [lo, pos)
  std::vector<char> buf;
  auto read_to = [&](uint64_t end) {
    if (buf.empty() && end > pos) buf.resize(size_t(4) << 20);
    while (pos < end) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(end - pos, buf.size()));
      pread_exact(pos, k, buf.data());
      crc = crc32c(buf.data(), k, crc);
      reads_->bytes += k;
      if (reads_->progress) reads_->progress->add(static_cast<int64_t>(k));
      pos += k;
    }
  };
  for (const auto& s : spans) {
    if (s.begin > pos) read_to(s.begin);
    if (s.begin == pos) {
      crc = crc32c_combine(crc, s.crc, s.end - s.begin);
      pos = s.end;
    } else if (s.end > pos) {  // overlaps what is covered: checksum its rest from the file
      read_to(s.end);
    }
  }
  read_to(hi);
  return crc;
}

uint32_t SafetensorsFile::checksum() const {
  DS_CHECK(reads_ != nullptr, "SafetensorsFile::checksum: '{}' does not track its reads", path_);
  DS_CHECK(reads_->chunk == 0, "SafetensorsFile::checksum: '{}' tracks chunks; use bad_chunk", path_);
  return range_crc(0, size_);
}

int64_t SafetensorsFile::bad_chunk(const std::vector<uint32_t>& crcs) const {
  DS_CHECK(reads_ != nullptr && reads_->chunk > 0, "SafetensorsFile::bad_chunk: '{}' does not track chunks", path_);
  const uint64_t chunk = reads_->chunk;
  DS_CHECK(crcs.size() == (size_ + chunk - 1) / chunk, "SafetensorsFile::bad_chunk: {} checksums for {} chunks",
           crcs.size(), (size_ + chunk - 1) / chunk);
  std::vector<bool> touched(crcs.size(), false);
  for (uint64_t c = 0; c * chunk < data_offset_; ++c) touched[c] = true;  // the header: what every read relies on
  for (const auto& s : reads_->spans) touched[s.begin / chunk] = true;  // (a span lies in one chunk)
  for (size_t c = 0; c < crcs.size(); ++c)
    if (touched[c] && range_crc(c * chunk, std::min<uint64_t>(size_, (c + 1) * chunk)) != crcs[c])
      return static_cast<int64_t>(c);
  return -1;
}

uint64_t SafetensorsFile::file_offset(const std::string& name) const { return data_offset_ + entry(name).begin; }

uint64_t SafetensorsFile::checksummed_bytes() const { return reads_ ? reads_->bytes : 0; }

Tensor SafetensorsFile::get(const std::string& name) const {
  const Entry& e = entry(name);
  Tensor t = Tensor::empty(e.shape, dtype(name));
  if (e.end > e.begin) copy_out(e.begin, e.end - e.begin, t.raw());
  return t;
}

}  // namespace ds

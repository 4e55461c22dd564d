// A restricted reader and writer of numpy's .npy files, for the integer index
// arrays Megatron saves with np.save (its GPT dataset's doc / sample / shuffle
// index maps). Format versions 1.0, 2.0 and 3.0: magic "\x93NUMPY", two
// version bytes, a little-endian header length (2 bytes in 1.0, 4 in 2.0 and
// 3.0), then a Python dict literal with exactly the keys 'descr',
// 'fortran_order' and 'shape' (any order), padded with spaces and a newline;
// the array's bytes follow. Only little-endian integer arrays of 1 or 2
// dimensions in C order are accepted. The reader memory-maps the file (index
// maps can be GBs), so an open array costs address space, not memory; every
// malformed or unsupported file is one ds::UserError naming it. See
// docs/formats.md.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds::data {

// Element type of an accepted array; numpy's descr is "<i4", "|u1", ...
enum class NpyDType : uint8_t { I8, U8, I16, U16, I32, U32, I64, U64 };

size_t npy_dtype_size(NpyDType t);
const char* npy_dtype_descr(NpyDType t);  // the descr numpy writes: "<i4", "|u1", ...

// What the header of a .npy file says.
struct NpyHeader {
  int major = 1, minor = 0;     // format version
  NpyDType dtype = NpyDType::I64;
  std::vector<int64_t> shape;   // 1 or 2 dimensions
  size_t data_offset = 0;       // bytes before the array data
  int64_t num_elements() const;
};

// Parses the header at the start of `bytes` (the file's first bytes: all of
// it, or at least through the header). `what` names the file in errors, e.g.
// "doc_idx 'maps/x_doc_idx.npy'". Throws UserError on anything outside the
// restricted format; does not look at the data.
NpyHeader parse_npy_header(std::string_view bytes, const std::string& what);

// A read-only, memory-mapped integer array from a .npy file. Cheap to copy
// (copies share the mapping); thread-safe to read.
class NpyArray {
 public:
  NpyArray() = default;
  // Maps `path` and checks its header and that the file holds exactly the
  // data the header describes. `what` names the array in errors ("sample_idx");
  // messages read "<what> '<path>': <problem>".
  static NpyArray open(const std::string& path, const std::string& what = "npy file");

  const std::string& path() const { return path_; }
  NpyDType dtype() const { return header_.dtype; }
  int ndim() const { return static_cast<int>(header_.shape.size()); }
  const std::vector<int64_t>& shape() const { return header_.shape; }
  int64_t size() const { return size_; }  // number of elements
  int major_version() const { return header_.major; }

  // Element i in C order (0 <= i < size(), unchecked), widened to int64; a
  // u8 value above 2^63 - 1 reads as negative. 2-d: at(r, c) is element r * cols + c.
  int64_t at(int64_t i) const;
  int64_t at(int64_t row, int64_t col) const { return at(row * header_.shape[1] + col); }

  struct Mapping;  // an mmap'ed file (defined in the .cpp)

 private:
  std::string path_;
  NpyHeader header_;
  int64_t size_ = 0;
  std::shared_ptr<const Mapping> map_;
  const unsigned char* data_ = nullptr;
};

// The header of a version 1.0 .npy file of the given element type and shape
// (1 or 2 dimensions), as np.save writes it: the dict padded with spaces and a
// newline to a multiple of 64 bytes.
std::string npy_header_bytes(NpyDType dtype, std::span<const int64_t> shape);

// Writes `data` as a C-order .npy array of the element type and the shape
// given, atomically: to a temporary beside `path`, then renamed into place, so
// an error leaves neither a partial file nor the temporary. Errors (a shape
// that does not match data.size(), a failed write) are UserErrors naming `path`.
void write_npy(const std::string& path, std::span<const int32_t> data, std::span<const int64_t> shape);
void write_npy(const std::string& path, std::span<const int64_t> data, std::span<const int64_t> shape);
void write_npy(const std::string& path, std::span<const uint32_t> data, std::span<const int64_t> shape);

// The complete file write_npy writes, in memory (for writing several files as
// one set with ds::StagedFiles).
std::string npy_file_bytes(std::span<const int32_t> data, std::span<const int64_t> shape);
std::string npy_file_bytes(std::span<const int64_t> data, std::span<const int64_t> shape);
std::string npy_file_bytes(std::span<const uint32_t> data, std::span<const int64_t> shape);

}  // namespace ds::data

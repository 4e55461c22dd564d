// Reading and writing Hugging Face safetensors files, the format our exported
// models and --init-from weights use. Layout: 8-byte little-endian header
// length N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets"}, and
// optionally "__metadata__": {string: string}}) padded with spaces to a
// multiple of 8, then the tensor bytes. Offsets are relative to the data start.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/dtype.h"
#include "lib/core/tensor.h"

namespace ds {

class Progress;

// Collects tensors and writes them in one go. The data is read at write(), so
// the tensors must stay alive and unchanged until then. Tensors not on the CPU
// are copied to the CPU by add(). The output depends only on the set of
// (name, tensor) pairs and metadata, not on the order of add() calls: data is
// laid out like the reference implementation (wider dtypes first, then by
// name), which also keeps every tensor aligned to its element size.
struct SafetensorsWriter {
  void add(const std::string& name, const Tensor& cpu_tensor);
  void set_metadata(const std::string& key, const std::string& value);
  // Writes a temp file next to `path`, fsyncs it and renames it into place;
  // on failure nothing is left at `path` (a UserError names the file). The
  // bytes written are added to `progress` (lib/core/progress.h) when given.
  void write(const std::string& path, Progress* progress = nullptr) const;
  // The complete file contents (what write() puts on disk).
  std::string serialize() const;

  // Streaming: a file of F32 tensors declared by name and shape (no data
  // yet); write_streamed asks `next` for each one in file order
  // (streamed_order) and writes it at once, so only one tensor need exist
  // at a time. The file is the one add() of the same tensors would write.
  void declare_f32(const std::string& name, const Shape& shape);
  std::vector<std::string> streamed_order() const;
  void write_streamed(const std::string& path, const std::function<Tensor(const std::string& name)>& next,
                      Progress* progress = nullptr) const;
  // The same with each declared tensor's bytes produced in pieces:
  // emit(name, sink) passes exactly its bytes to sink, in order, in as many
  // pieces as it likes (a tensor larger than memory streams from its tier).
  using EmitBytes = std::function<void(const std::string& name, const std::function<void(std::string_view)>& sink)>;
  void write_streamed_bytes(const std::string& path, const EmitBytes& emit, Progress* progress = nullptr) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    const Tensor* data = nullptr;  // null: declared (streamed)
    uint64_t nbytes() const;
  };
  // The entries in file order and the header (length + JSON) before them.
  std::vector<Entry> file_order() const;
  std::string header_bytes(const std::vector<Entry>& order) const;
  std::vector<std::pair<std::string, Shape>> declared_;

  std::vector<std::pair<std::string, Tensor>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A safetensors file opened for reading (memory-mapped; copies are cheap and
// share the mapping). open() validates the whole header: sizes, dtypes,
// shapes, and that the data offsets tile the data section exactly.
class SafetensorsFile {
 public:
  // Any problem (missing, truncated, malformed) is a UserError naming the file.
  static SafetensorsFile open(const std::string& path);

  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  // A CPU copy of the tensor. Throws UserError for an unknown name or a dtype
  // dstrain has no DType for (e.g. F64).
  Tensor get(const std::string& name) const;
  // Elements [first, first + count) of an F32 tensor (flattened) into out:
  // only those bytes of the file are read.
  void read_f32(const std::string& name, int64_t first, int64_t count, float* out) const;
  // Several such reads at once, in the file's order: reads whose bytes follow
  // each other in the file go to the disk as one stream (a whole model's
  // tensors are one read front to back), so a tracked O_DIRECT read keeps
  // its requests in flight across tensor boundaries. A tracked O_DIRECT
  // stream also runs across gaps of up to kStreamGap bytes between reads
  // (checksummed, not copied), so scattered slices cost one stream.
  static constexpr uint64_t kStreamGap = uint64_t(4) << 20;
  struct F32Read {
    std::string name;
    int64_t first = 0, count = 0;
    float* out = nullptr;
  };
  void read_f32(std::vector<F32Read> reads) const;
  DType dtype(const std::string& name) const;
  Shape shape(const std::string& name) const;
  std::string dtype_string(const std::string& name) const;  // as in the file: "F32", "BF16", ...
  std::map<std::string, std::string> metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // Checksumming as the data is read, so that a checkpoint load reads each
  // file once instead of a checksum pass and then the tensors. After
  // track_reads, the bytes of every read (read_f32, get) are CRC-32C'd as
  // they arrive (and counted in `progress`), whatever the order; checksum()
  // then reads what no read covered (the header, other ranks' parts) and
  // returns the whole file's CRC-32C, the value file_crc32c gives. Copies of
  // this object share the record.
  // chunk > 0: the record also keeps each chunk's bytes apart, for
  // bad_chunk().
  void track_reads(Progress* progress = nullptr, uint64_t chunk = 0);
  bool tracks_reads() const { return reads_ != nullptr; }
  uint32_t checksum() const;
  // With per-chunk checksums (crcs[i]: bytes [i * chunk, (i + 1) * chunk) of
  // the file, the chunk given to track_reads): checks only the chunks a read
  // touched, and those holding the header, reading what the reads left out
  // of them; the rest of the file is never read. Returns the first chunk
  // whose CRC-32C differs, or -1. crcs must number the file's chunks.
  int64_t bad_chunk(const std::vector<uint32_t>& crcs) const;
  // Bytes checksummed so far: read, and read for checksum() / bad_chunk().
  uint64_t checksummed_bytes() const;
  uint64_t file_size() const { return size_; }
  // Where tensor `name`'s bytes start in the file.
  uint64_t file_offset(const std::string& name) const;

 private:
  struct Entry {
    std::string dtype;  // safetensors spelling
    Shape shape;
    uint64_t begin = 0, end = 0;  // relative to the data section (data_offset_)
  };
  const Entry& entry(const std::string& name) const;
  void copy_out(uint64_t at, size_t bytes, void* dst) const;
  void parse_header(const nlohmann::json& header, uint64_t data_size);
  void check_layout(uint64_t data_size) const;

  std::string path_;
  std::shared_ptr<const uint8_t> mapping_;  // the whole file (headers are read from it)
  std::shared_ptr<const int> fd_;           // tensor data is read with pread
  uint64_t size_ = 0;                       // the file's bytes
  uint64_t data_offset_ = 0;                // its offset in the file
  struct ReadRecord;                        // track_reads: the checksummed spans read so far
  std::shared_ptr<ReadRecord> reads_;
  // pread of file bytes [off, off + bytes) into dst; UserError naming the file.
  void pread_exact(uint64_t off, size_t bytes, void* dst) const;
  uint32_t range_crc(uint64_t lo, uint64_t hi) const;  // CRC-32C of file bytes [lo, hi), from the reads
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// "F32" <-> DType::F32 and so on (F32, BF16, F16, I32, I64, U16, U8).
const char* safetensors_dtype_name(DType t);

}  // namespace ds

// Megatron indexed dataset (.bin + .idx): a memory-mapped reader and a writer.
// The .bin file holds the tokens of every sequence back to back; the .idx file
// holds the header (magic "MMIDIDX\0\0", version 1, dtype code), the sequence
// lengths, their byte offsets into .bin and the document index. The layout is
// byte-compatible with Megatron-LM's MMapIndexedDataset, so datasets prepared by
// Megatron's preprocess_data.py load here and ours load there. DeepSpeed's data
// analysis writes the same layout with another dtype-code table (DTypeCodes);
// its index files are read with DTypeCodes::DeepSpeed. See docs/formats.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ds::data {

// Element type of the .bin file. The values 1-8 are Megatron's dtype codes
// (code that prints them keeps working); U32 and U64 have no Megatron code.
// What a header byte means depends on the code table: see DTypeCodes.
enum class TokenDType : uint8_t {
  U8 = 1,
  I8 = 2,
  I16 = 3,
  I32 = 4,
  I64 = 5,
  F64 = 6,
  F32 = 7,
  U16 = 8,
  U32 = 9,
  U64 = 10,
};

// The .idx header's dtype byte under the two tables in use. Megatron-LM's
// indexed_dataset.py and DeepSpeed's copy of it (data_sampling/indexed_dataset.py,
// whose files DeepSpeed's data analysis writes and its data sampler reads:
// metric values and sample ids) agree on codes 1-5 and differ on 6-8:
//   code       1   2   3    4    5    6    7    8
//   Megatron   u8  i8  i16  i32  i64  f64  f32  u16
//   DeepSpeed  u8  i8  i16  i32  i64  u16  u32  u64
enum class DTypeCodes { Megatron, DeepSpeed };
const char* dtype_codes_name(DTypeCodes c);  // "Megatron" | "DeepSpeed"
// The header code of `t` under `codes`, or 0 when that table has none
// (f32 and f64 under DeepSpeed's, u32 and u64 under Megatron's).
uint8_t dtype_code(TokenDType t, DTypeCodes codes);
// The element type of header code `code` under `codes`; nullopt outside 1..8.
std::optional<TokenDType> dtype_from_code(uint8_t code, DTypeCodes codes);

size_t token_dtype_size(TokenDType t);
const char* token_dtype_name(TokenDType t);  // "u16", "i32", ...
// Parses "u8|i8|i16|i32|i64|u16" (also numpy names "uint16", "int32"); throws UserError.
// (The token dtypes dsprep writes: u32 and u64 exist only in DeepSpeed's table.)
TokenDType parse_token_dtype(const std::string& s);
// Megatron's rule: uint16 when the vocabulary has fewer than 65500 entries, else int32.
TokenDType token_dtype_for_vocab(int64_t vocab_size);

// A read-only array inside a mapped file. The .idx arrays start at byte 34, so
// they are not aligned for their element type; elements are read with memcpy.
template <typename T>
class UnalignedArray {
 public:
  UnalignedArray() = default;
  UnalignedArray(const unsigned char* p, size_t n) : p_(p), n_(n) {}
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T operator[](size_t i) const {
    T v;
    std::memcpy(&v, p_ + i * sizeof(T), sizeof(T));
    return v;
  }
  std::vector<T> to_vector() const {
    std::vector<T> v(n_);
    if (n_) std::memcpy(v.data(), p_, n_ * sizeof(T));
    return v;
  }

 private:
  const unsigned char* p_ = nullptr;
  size_t n_ = 0;
};

// One sequence: where its tokens start in the mapped .bin and how many there are.
struct SequenceView {
  const void* data = nullptr;  // first token, of dtype()
  int64_t length = 0;          // number of tokens
};

// Read-only view of a dataset through mmap. Move-only; the mapping is released
// when the object dies, so views returned by sequence() must not outlive it.
class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin, reading the header's dtype code with the
  // `codes` table (Megatron's for token datasets; DeepSpeed's for the files of
  // DeepSpeed's data analysis). Missing or corrupt files throw ds::UserError
  // with one line naming the file and what is wrong.
  static IndexedDataset open(const std::string& prefix, DTypeCodes codes = DTypeCodes::Megatron);

  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;
  ~IndexedDataset();

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  DTypeCodes codes() const { return codes_; }
  int64_t num_sequences() const { return static_cast<int64_t>(sizes_.size()); }
  // Number of documents: doc_idx has one more entry than this (it starts at 0).
  int64_t num_documents() const { return doc_idx_.empty() ? 0 : int64_t(doc_idx_.size()) - 1; }
  SequenceView sequence(int64_t i) const;
  int32_t sequence_length(int64_t i) const { return sizes_[i]; }
  const UnalignedArray<int32_t>& sizes() const { return sizes_; }
  const UnalignedArray<int64_t>& pointers() const { return pointers_; }  // bytes into .bin
  const UnalignedArray<int64_t>& doc_idx() const { return doc_idx_; }
  int64_t num_tokens() const;  // sum of all sequence lengths

  // Copies tokens [offset, offset+count) of sequence i into out as int32.
  // Throws UserError if the dtype is floating point or a token does not fit int32.
  void read_tokens(int64_t i, int64_t offset, int64_t count, int32_t* out) const;

  // Copies elements [offset, offset+count) of sequence i into out as int64, for
  // any integer dtype (metric values may be negative). Throws UserError naming
  // the file for a floating-point dtype, or for a u64 value above INT64_MAX.
  void read_values(int64_t i, int64_t offset, int64_t count, int64_t* out) const;
  // All of sequence i as int64 (read_values over its whole length): a row of
  // an index_to_sample file, the one value of a sample_to_metric row.
  std::vector<int64_t> values(int64_t i) const;

  struct Mapping;  // an mmap'ed file (opaque; defined in the .cpp)

 private:
  IndexedDataset() = default;
  std::string prefix_;
  TokenDType dtype_ = TokenDType::U16;
  DTypeCodes codes_ = DTypeCodes::Megatron;
  std::unique_ptr<Mapping> idx_map_, bin_map_;
  UnalignedArray<int32_t> sizes_;
  UnalignedArray<int64_t> pointers_;
  UnalignedArray<int64_t> doc_idx_;
};

// Largest token id in the dataset (a full scan), or -1 when it is empty. The
// trainer uses it to check that the vocabulary covers the dataset.
int64_t max_token_id(const IndexedDataset& ds);

// Writes PREFIX.bin / PREFIX.idx. Data goes to PREFIX.bin.tmp / PREFIX.idx.tmp and
// is renamed into place by finalize(); if finalize() is never reached (an error
// unwinds the stack) the destructor deletes the temporaries, so no half-written
// dataset is ever left under the real names. Missing parent directories are created.
// The header's dtype code is taken from the `codes` table: a dtype that table has
// no code for (u32 under Megatron's) is a UserError.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, TokenDType dtype, DTypeCodes codes = DTypeCodes::Megatron);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one document made of one sequence. Tokens must fit the dtype.
  void add_document(std::span<const int32_t> tokens);
  // Megatron's finer-grained form: add sequences, then close the document.
  void add_sequence(std::span<const int32_t> tokens);
  // A sequence of values (metric values, sample ids): each must lie in the
  // dtype's range (negative values only in a signed dtype).
  void add_sequence(std::span<const int64_t> values);
  // Closes a document: doc_idx gains the current sequence count. DeepSpeed's
  // files call it once per merged part and once at the end, so their doc_idx
  // may repeat a count.
  void end_document();
  void finalize();

  int64_t num_sequences() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  void abort_files() noexcept;
  void write_sequence(size_t count);  // buf_ holds `count` encoded elements
  std::string prefix_;
  TokenDType dtype_;
  DTypeCodes codes_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<unsigned char> buf_;
  int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace ds::data

// Megatron indexed dataset (.bin + .idx): a memory-mapped reader and a writer.
// The .bin file holds the tokens of every sequence back to back; the .idx file
// holds the header (magic "MMIDIDX\0\0", version 1, dtype code), the sequence
// lengths, their byte offsets into .bin and the document index. The layout is
// byte-compatible with Megatron-LM's MMapIndexedDataset, so datasets prepared by
// Megatron's preprocess_data.py load here and ours load there. See docs/formats.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ds::data {

// Element type of the .bin file, with Megatron's numeric codes.
enum class TokenDType : uint8_t {
  U8 = 1,
  I8 = 2,
  I16 = 3,
  I32 = 4,
  I64 = 5,
  F64 = 6,
  F32 = 7,
  U16 = 8,
};

size_t token_dtype_size(TokenDType t);
const char* token_dtype_name(TokenDType t);  // "u16", "i32", ...
// Parses "u8|i8|i16|i32|i64|u16" (also numpy names "uint16", "int32"); throws UserError.
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
  // Opens PREFIX.idx and PREFIX.bin. Missing or corrupt files throw ds::UserError
  // with one line naming the file and what is wrong.
  static IndexedDataset open(const std::string& prefix);

  IndexedDataset(IndexedDataset&&) noexcept;
  IndexedDataset& operator=(IndexedDataset&&) noexcept;
  ~IndexedDataset();

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
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

  struct Mapping;  // an mmap'ed file (opaque; defined in the .cpp)

 private:
  IndexedDataset() = default;
  std::string prefix_;
  TokenDType dtype_ = TokenDType::U16;
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
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, TokenDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one document made of one sequence. Tokens must fit the dtype.
  void add_document(std::span<const int32_t> tokens);
  // Megatron's finer-grained form: add sequences, then close the document.
  void add_sequence(std::span<const int32_t> tokens);
  void end_document();
  void finalize();

  int64_t num_sequences() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  void abort_files() noexcept;
  std::string prefix_;
  TokenDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> doc_idx_{0};
  std::vector<unsigned char> buf_;
  int64_t num_tokens_ = 0;
  bool finalized_ = false;
};

}  // namespace ds::data

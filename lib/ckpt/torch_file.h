// PyTorch's checkpoint files (torch.save since PyTorch 1.6: a zip archive of
// ARCHIVE/data.pkl, the pickled object, and ARCHIVE/data/KEY, one file per
// storage), read without executing anything: Hugging Face's
// pytorch_model.bin and DeepSpeed's universal checkpoint files.
//
// The pickle is interpreted by a restricted reader that builds plain values
// (None, bool, int, float, str, bytes, list, tuple, dict) and tensors. The
// only callables it accepts are the ones a tensor or a state dict is made of
// (collections.OrderedDict, torch._utils._rebuild_tensor_v2 and
// _rebuild_parameter, the typed storage classes); any other global (a
// class, os.system, ...) is refused with one line naming it and the file.
// The zip must be stored (uncompressed), as torch.save writes it; zip64
// archives (files over 4 GiB) are read. The legacy format (before 1.6) is
// refused. Everything is bounded by the file's size; a malformed file is one
// UserError naming it.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/core/tensor.h"

namespace ds {

// One tensor of the object: a view of a storage (elements, not bytes).
struct TorchTensorInfo {
  std::string storage;      // the storage's key (ARCHIVE/data/KEY)
  std::string dtype_name;   // PyTorch's storage type: "Float", "Half", "BFloat16", "Long", ...
  Shape shape;
  std::vector<int64_t> stride;
  int64_t offset = 0;       // in elements of the storage
};

class TorchFile {
 public:
  static TorchFile open(const std::string& path);

  // The object's tensors by path: dict keys and list indices joined with "."
  // ("model.layers.0.weight", "param"); a bare tensor is "".
  const std::map<std::string, TorchTensorInfo>& tensors() const { return tensors_; }
  // Its other leaves (int, float, bool, str, None) by path, as text.
  const std::map<std::string, std::string>& scalars() const { return scalars_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  // A contiguous CPU copy of tensor `name` in its own dtype (F32, BF16, F16,
  // I32, I64, U8; other dtypes are a UserError naming the tensor).
  Tensor get(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    uint64_t offset = 0, size = 0;  // the member's data in the file
  };
  std::string path_;
  std::shared_ptr<int> fd_;
  uint64_t size_ = 0;
  std::map<std::string, Entry> members_;  // zip member name -> data
  std::string prefix_;                    // "ARCHIVE/"
  std::map<std::string, TorchTensorInfo> tensors_;
  std::map<std::string, std::string> scalars_;

  void read_zip();
  void pread_exact(uint64_t off, size_t n, void* dst) const;
};

}  // namespace ds

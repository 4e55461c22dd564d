// Writing PyTorch's checkpoint format (torch.save since PyTorch 1.6): a
// stored zip archive of archive/data.pkl (a pickle, protocol 2, of an
// OrderedDict from names to tensors, as a state dict pickles),
// archive/data/K (tensor K's float32 bytes, each aligned to 64 bytes in the
// file), archive/byteorder ("little") and archive/version ("3"). torch.load
// reads it (also with weights_only=True: the pickle names only
// collections.OrderedDict, torch._utils._rebuild_tensor_v2 and
// torch.FloatStorage), and so does TorchFile (torch_file.h). Zip64 records
// are written where a size or offset needs them (files over 4 GiB).
// DeepSpeed-Chat's steps save and read their models this way
// (pytorch_model.bin).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/tensor.h"

namespace ds {

class Progress;

// A state dict of F32 tensors declared by name and shape, in the order they
// are declared (the OrderedDict's order and the file's); write_streamed asks
// `next` for each one in that order and writes it at once, so that only one
// tensor need exist at a time.
class TorchSaveWriter {
 public:
  void declare_f32(const std::string& name, const Shape& shape);
  const std::vector<std::string>& streamed_order() const { return names_; }
  // Writes a temporary beside `path` and renames it into place (nothing is
  // left at `path` on failure). zip64_from: the size or offset from which a
  // zip64 field is written (tests lower it to exercise those records).
  void write_streamed(const std::string& path, const std::function<Tensor(const std::string& name)>& next,
                      Progress* progress = nullptr, uint64_t zip64_from = 0xffffffffull) const;

 private:
  std::vector<std::string> names_;
  std::vector<Shape> shapes_;
};

// The CRC-32 (ISO-HDLC, zip's) of n bytes continuing `crc` (0 to start).
uint32_t crc32_zip(const void* data, size_t n, uint32_t crc = 0);

}  // namespace ds

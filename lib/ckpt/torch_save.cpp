// PyTorch's checkpoint format, written (torch_save.h).
#include "lib/ckpt/torch_save.h"

#include <array>
#include <bit>
#include <cstring>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"

namespace ds {

namespace {

// Slice-by-8 tables of the reflected polynomial 0xEDB88320.
struct Crc32Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Crc32Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

// Little-endian appends.
void put(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// ---- the pickle (protocol 2) ------------------------------------------------

void pickle_str(std::string& p, const std::string& s) {
  p.push_back('X');  // BINUNICODE
  put(p, s.size(), 4);
  p += s;
}

void pickle_int(std::string& p, int64_t v) {
  if (v >= 0 && v < 256) {
    p.push_back('K');  // BININT1
    put(p, static_cast<uint64_t>(v), 1);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    p.push_back('J');  // BININT
    put(p, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
  } else {
    p += "\x8a\x08";  // LONG1, 8 bytes of two's complement
    put(p, static_cast<uint64_t>(v), 8);
  }
}

void pickle_tuple(std::string& p, const std::vector<int64_t>& v) {
  p.push_back('(');  // MARK
  for (int64_t x : v) pickle_int(p, x);
  p.push_back('t');  // TUPLE
}

constexpr const char* kOrderedDict = "ccollections\nOrderedDict\n";

// OrderedDict([(name, _rebuild_tensor_v2(storage K, 0, shape, stride, False, OrderedDict())), ...]).
std::string state_dict_pickle(const std::vector<std::string>& names, const std::vector<Shape>& shapes) {
  std::string p = "\x80\x02";  // PROTO 2
  p += kOrderedDict;
  p += ")R";  // EMPTY_TUPLE, REDUCE: OrderedDict()
  if (!names.empty()) p.push_back('(');  // MARK of SETITEMS
  for (size_t k = 0; k < names.size(); ++k) {
    const Shape& s = shapes[k];
    std::vector<int64_t> shape(s.begin(), s.end()), stride(s.size(), 1);
    for (int64_t d = static_cast<int64_t>(s.size()) - 2; d >= 0; --d)
      stride[static_cast<size_t>(d)] = stride[static_cast<size_t>(d) + 1] * s[static_cast<size_t>(d) + 1];
    pickle_str(p, names[k]);
    p += "ctorch._utils\n_rebuild_tensor_v2\n(";
    p += "(";  // the persistent id: ('storage', FloatStorage, key, 'cpu', numel)
    pickle_str(p, "storage");
    p += "ctorch\nFloatStorage\n";
    pickle_str(p, std::to_string(k));
    pickle_str(p, "cpu");
    pickle_int(p, shape_numel(s));
    p += "tQ";  // TUPLE, BINPERSID
    pickle_int(p, 0);  // storage offset
    pickle_tuple(p, shape);
    pickle_tuple(p, stride);
    p += "\x89";  // NEWFALSE: requires_grad
    p += kOrderedDict;
    p += ")R";  // backward hooks: OrderedDict()
    p += "tR";  // TUPLE of the arguments, REDUCE
  }
  if (!names.empty()) p.push_back('u');  // SETITEMS
  p.push_back('.');  // STOP
  return p;
}

// ---- the zip (stored members) -----------------------------------------------

struct Member {
  std::string name;
  uint64_t offset = 0, size = 0;
  uint32_t crc = 0;
};

}  // namespace

uint32_t crc32_zip(const void* data, size_t n, uint32_t crc) {
  static const Crc32Tables tables;
  const auto& t = tables.t;
  const auto* b = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, b, 4);
    std::memcpy(&hi, b + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][hi & 0xff] ^
          t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    b += 8;
    n -= 8;
  }
  while (n--) crc = t[0][(crc ^ *b++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

void TorchSaveWriter::declare_f32(const std::string& name, const Shape& shape) {
  for (const std::string& n : names_) DS_CHECK(n != name, "TorchSaveWriter: '{}' declared twice", name);
  names_.push_back(name);
  shapes_.push_back(shape);
}

void TorchSaveWriter::write_streamed(const std::string& path, const std::function<Tensor(const std::string&)>& next,
                                     Progress* progress, uint64_t zip64_from) const {
  static_assert(std::endian::native == std::endian::little, "torch.save's little-endian storages");
  const std::string pickle = state_dict_pickle(names_, shapes_);
  write_file_atomic_stream(
      path,
      [&](const ByteSink& sink) {
        uint64_t at = 0;
        std::vector<Member> members;
        auto emit = [&](std::string_view bytes) {
          sink(bytes);
          at += bytes.size();
        };
        // One member: its local header (padded with an extra field so that the
        // data starts at a multiple of 64, as torch.save aligns it), then the data.
        auto member = [&](const std::string& name, uint64_t size, uint32_t crc,
                          const std::function<void()>& data) {
          const bool z64 = size >= zip64_from;
          std::string h;
          put(h, 0x04034b50, 4);
          put(h, z64 ? 45 : 20, 2);  // version needed
          put(h, 0, 2);              // flags
          put(h, 0, 2);              // stored
          put(h, 0, 4);              // time, date
          put(h, crc, 4);
          put(h, z64 ? 0xffffffffull : size, 4);
          put(h, z64 ? 0xffffffffull : size, 4);
          const uint64_t fixed = 30 + name.size() + (z64 ? 20 : 0);
          const uint64_t pad = (64 - (at + fixed + 4) % 64) % 64;  // a padding field of 4 + pad bytes
          put(h, name.size(), 2);
          put(h, (z64 ? 20 : 0) + 4 + pad, 2);
          h += name;
          if (z64) {
            put(h, 0x0001, 2);
            put(h, 16, 2);
            put(h, size, 8);
            put(h, size, 8);
          }
          put(h, 0x4246, 2);  // "FB": torch.save's alignment padding
          put(h, pad, 2);
          h.append(pad, 'Z');
          members.push_back({name, at, size, crc});
          emit(h);
          data();
        };
        auto small = [&](const std::string& name, const std::string& bytes) {
          member(name, bytes.size(), crc32_zip(bytes.data(), bytes.size()), [&] { emit(bytes); });
        };
        small("archive/data.pkl", pickle);
        small("archive/byteorder", "little");
        for (size_t k = 0; k < names_.size(); ++k) {
          const Tensor t = next(names_[k]);
          DS_CHECK(t.dtype() == DType::F32 && t.shape() == shapes_[k] && t.device().is_cpu(),
                   "TorchSaveWriter: tensor '{}' came as {} {}, declared F32 {}", names_[k], dtype_name(t.dtype()),
                   shape_str(t.shape()), shape_str(shapes_[k]));
          const std::string_view bytes(static_cast<const char*>(t.raw()), static_cast<size_t>(t.nbytes()));
          member("archive/data/" + std::to_string(k), bytes.size(), crc32_zip(bytes.data(), bytes.size()),
                 [&] { emit(bytes); });
        }
        small("archive/version", "3\n");
        // The central directory, then (where needed) the zip64 end records, then the end record.
        const uint64_t cd_off = at;
        std::string cd;
        for (const Member& m : members) {
          const bool zs = m.size >= zip64_from, zo = m.offset >= zip64_from;
          std::string x;  // zip64 extra: the overflowing fields, in order
          if (zs) put(x, m.size, 8), put(x, m.size, 8);
          if (zo) put(x, m.offset, 8);
          put(cd, 0x02014b50, 4);
          put(cd, (zs || zo) ? 45 : 20, 2);  // made by
          put(cd, (zs || zo) ? 45 : 20, 2);  // needed
          put(cd, 0, 2);
          put(cd, 0, 2);
          put(cd, 0, 4);
          put(cd, m.crc, 4);
          put(cd, zs ? 0xffffffffull : m.size, 4);
          put(cd, zs ? 0xffffffffull : m.size, 4);
          put(cd, m.name.size(), 2);
          put(cd, x.empty() ? 0 : 4 + x.size(), 2);
          put(cd, 0, 2);  // comment
          put(cd, 0, 2);  // disk
          put(cd, 0, 2);  // internal attributes
          put(cd, 0, 4);  // external attributes
          put(cd, zo ? 0xffffffffull : m.offset, 4);
          cd += m.name;
          if (!x.empty()) {
            put(cd, 0x0001, 2);
            put(cd, x.size(), 2);
            cd += x;
          }
        }
        emit(cd);
        const uint64_t n = members.size(), cd_size = cd.size();
        const bool z64 = cd_off >= zip64_from || cd_size >= zip64_from || n >= 0xffff;
        std::string end;
        if (z64) {
          const uint64_t record = at;
          put(end, 0x06064b50, 4);
          put(end, 44, 8);  // the record's size after this field
          put(end, 45, 2);
          put(end, 45, 2);
          put(end, 0, 4);
          put(end, 0, 4);
          put(end, n, 8);
          put(end, n, 8);
          put(end, cd_size, 8);
          put(end, cd_off, 8);
          put(end, 0x07064b50, 4);  // locator
          put(end, 0, 4);
          put(end, record, 8);
          put(end, 1, 4);
        }
        put(end, 0x06054b50, 4);
        put(end, 0, 2);
        put(end, 0, 2);
        put(end, z64 ? 0xffff : n, 2);
        put(end, z64 ? 0xffff : n, 2);
        put(end, z64 ? 0xffffffffull : cd_size, 4);
        put(end, z64 ? 0xffffffffull : cd_off, 4);
        put(end, 0, 2);
        emit(end);
      },
      progress);
}

}  // namespace ds

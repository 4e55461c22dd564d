// TensorBoard event files read back: TFRecord framing (u64 length, masked
// CRC-32C of the length, payload, masked CRC-32C of the payload) around
// `Event` protocol buffers; only Summary.Value.simple_value scalars are kept.
#include <cstring>
#include <fstream>
#include <sstream>

#include "lib/ckpt/crc32c.h"
#include "lib/core/error.h"
#include "lib/plot/runs.h"

namespace ds::plot {
namespace {

template <typename T>
T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// A protocol-buffer reader over [p, end): fields in order, the caller picks.
struct Wire {
  const char* p;
  const char* end;
  const std::string& file;
  int64_t record;

  [[noreturn]] void bad(const char* what) const {
    DS_USER_ERROR("TensorBoard file '{}' record {}: malformed event ({})", file, record, what);
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) bad("truncated varint");
      const uint8_t b = static_cast<uint8_t>(*p++);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    bad("varint longer than 10 bytes");
  }
  const char* take(size_t n) {
    if (static_cast<size_t>(end - p) < n) bad("field past the end");
    const char* q = p;
    p += n;
    return q;
  }
  // Skips a field of this wire type (groups are not used by Event).
  void skip(uint32_t wire) {
    if (wire == 0) varint();
    else if (wire == 1) take(8);
    else if (wire == 2) take(varint());
    else if (wire == 5) take(4);
    else bad("unsupported wire type");
  }
};

// Summary.Value: 1 tag, 2 simple_value (float).
void parse_value(Wire w, int64_t step, std::vector<Scalar>& out) {
  Scalar s;
  s.step = step;
  bool has_value = false;
  while (w.p < w.end) {
    const uint64_t key = w.varint();
    const uint32_t field = static_cast<uint32_t>(key >> 3), wire = key & 7;
    if (field == 1 && wire == 2) {
      const size_t n = w.varint();
      s.tag.assign(w.take(n), n);
    } else if (field == 2 && wire == 5) {
      s.value = load_le<float>(w.take(4));
      has_value = true;
    } else {
      w.skip(wire);
    }
  }
  if (has_value) out.push_back(std::move(s));
}

// Event: 1 wall_time (double), 2 step (int64), 5 summary (Summary: 1 repeated Value).
void parse_event(Wire w, std::vector<Scalar>& out) {
  int64_t step = 0;
  std::vector<std::pair<const char*, size_t>> summaries;
  while (w.p < w.end) {
    const uint64_t key = w.varint();
    const uint32_t field = static_cast<uint32_t>(key >> 3), wire = key & 7;
    if (field == 2 && wire == 0) {
      step = static_cast<int64_t>(w.varint());
    } else if (field == 5 && wire == 2) {
      const size_t n = w.varint();
      summaries.emplace_back(w.take(n), n);
    } else {
      w.skip(wire);
    }
  }
  for (const auto& [p, n] : summaries) {
    Wire s{p, p + n, w.file, w.record};
    while (s.p < s.end) {
      const uint64_t key = s.varint();
      if ((key >> 3) == 1 && (key & 7) == 2) {
        const size_t m = s.varint();
        const char* v = s.take(m);
        parse_value(Wire{v, v + m, w.file, w.record}, step, out);
      } else {
        s.skip(key & 7);
      }
    }
  }
}

}  // namespace

std::vector<Scalar> read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DS_USER_CHECK(in.good(), "TensorBoard file '{}' cannot be opened: {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  std::vector<Scalar> out;
  size_t pos = 0;
  for (int64_t record = 0; pos < data.size(); ++record) {
    if (data.size() - pos < 12) break;  // a record still being written by a live run
    const uint64_t n = load_le<uint64_t>(data.data() + pos);
    DS_USER_CHECK(load_le<uint32_t>(data.data() + pos + 8) == masked_crc32c(data.data() + pos, 8),
                  "TensorBoard file '{}' record {} (byte {}): the length's checksum does not match (not an event "
                  "file, or corrupt)", path, record, pos);
    if (data.size() - pos < 16 || n > data.size() - pos - 16) break;  // a truncated last record
    const char* payload = data.data() + pos + 12;
    DS_USER_CHECK(load_le<uint32_t>(payload + n) == masked_crc32c(payload, n),
                  "TensorBoard file '{}' record {} (byte {}): the payload's checksum does not match (corrupt)", path,
                  record, pos);
    parse_event(Wire{payload, payload + n, path, record}, out);
    pos += 12 + n + 4;
  }
  return out;
}

}  // namespace ds::plot

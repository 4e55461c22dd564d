// World info encoding/decoding (base64 + DeepSpeed-compatible JSON) and rank arithmetic.
#include "launcher/world_info.h"

#include <nlohmann/json.hpp>

#include "lib/core/error.h"

namespace ds::launch {
namespace {

constexpr char kUrlAlphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

int decode_char(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-' || c == '+') return 62;
  if (c == '_' || c == '/') return 63;
  return -1;
}

// JSON string literal as Python's json.dumps (ensure_ascii) writes it.
std::string py_json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c >= 0x7f) out += fmt::format("\\u{:04x}", c);
    else out += static_cast<char>(c);
  }
  return out + "\"";
}

}  // namespace

std::string base64_urlsafe_encode(const std::string& bytes) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                 (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                 static_cast<unsigned char>(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out += kUrlAlphabet[(v >> (6 * k)) & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += kUrlAlphabet[(v >> 18) & 63];
    out += kUrlAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kUrlAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  std::string out;
  unsigned acc = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    int d = decode_char(c);
    DS_USER_CHECK(d >= 0, "world info '{}' is not base64 (bad character '{}')", text, c);
    acc = (acc << 6) | static_cast<unsigned>(d);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::string world_info_json(const ActiveResources& active) {
  std::string out = "{";
  for (size_t n = 0; n < active.size(); ++n) {
    if (n) out += ", ";
    out += py_json_string(active[n].host) + ": [";
    for (size_t i = 0; i < active[n].slots.size(); ++i)
      out += (i ? ", " : "") + std::to_string(active[n].slots[i]);
    out += "]";
  }
  return out + "}";
}

std::string encode_world_info(const ActiveResources& active) {
  return base64_urlsafe_encode(world_info_json(active));
}

ActiveResources decode_world_info(const std::string& b64) {
  std::string text = base64_decode(b64);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const std::exception& e) {
    DS_USER_ERROR("world info '{}' does not decode to JSON: {}", b64, e.what());
  }
  DS_USER_CHECK(j.is_object() && !j.empty(), "world info '{}' is not a non-empty host map", b64);
  ActiveResources out;
  for (const auto& [host, slots] : j.items()) {
    DS_USER_CHECK(slots.is_array() && !slots.empty(),
                  "world info: host '{}' needs a non-empty slot list", host);
    NodeSlots n{host, {}};
    for (const auto& s : slots) {
      DS_USER_CHECK(s.is_number_integer() && s.get<int>() >= 0,
                    "world info: host '{}' has a bad slot {}", host, s.dump());
      n.slots.push_back(s.get<int>());
    }
    out.push_back(std::move(n));
  }
  return out;
}

int first_rank_of_node(const ActiveResources& active, int node_rank) {
  int r = 0;
  for (int n = 0; n < node_rank; ++n) r += static_cast<int>(active.at(n).slots.size());
  return r;
}

int world_size(const ActiveResources& active) {
  return first_rank_of_node(active, static_cast<int>(active.size()));
}

}  // namespace ds::launch

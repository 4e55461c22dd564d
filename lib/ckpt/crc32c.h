// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum every
// checkpoint file carries in state.json and, masked, every TensorBoard
// record. On x86-64 CPUs with SSE4.2 (every one since 2008) the CRC32
// instruction computes it, three independent streams at a time (about 10x the
// table's speed); elsewhere a table-driven version (slicing by 8 bytes, about
// a GB/s). Both give the same value.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ds {

// CRC-32C of n bytes, continuing from `crc` (the value returned for the bytes
// before; 0 to start). crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The CRC-32C of A followed by B from crc1 = crc32c(A), crc2 = crc32c(B) and
// B's length: parts checksummed apart (in any order) give the whole's.
uint32_t crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);
// The table-driven version alone (tests compare the two).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);
// Which one crc32c uses: "sse4.2" or "table".
const char* crc32c_method();

// The masked CRC-32C of n bytes that TFRecord framing stores (TensorBoard
// event files: lib/train/tensorboard.cpp writes it, lib/plot/events.cpp
// checks it): the CRC rotated right by 15 bits, plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t n);

// "crc32c:1a2b3c4d", the spelling state.json uses; parse_crc32c_text returns
// false for anything else.
std::string crc32c_text(uint32_t crc);
bool parse_crc32c_text(const std::string& s, uint32_t& crc);

}  // namespace ds

// The attention implementation a run asks for (training.attention_backend,
// --attention-backend; docs/cuda.md). The CPU backend has one implementation
// and ignores it.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

namespace ds {

// Flash: our fused kernels. Plain: the unfused reference (debugging).
// Cudnn: cuDNN's fused SDPA. Flash2: our register-resident second generation.
enum class AttentionBackend : uint8_t { Flash, Plain, Cudnn, Flash2 };

inline constexpr std::pair<AttentionBackend, const char*> kAttentionBackendNames[] = {
    {AttentionBackend::Flash, "flash"},
    {AttentionBackend::Flash2, "flash2"},
    {AttentionBackend::Plain, "plain"},
    {AttentionBackend::Cudnn, "cudnn"}};

inline const char* attention_backend_name(AttentionBackend b) {
  for (const auto& [k, name] : kAttentionBackendNames)
    if (k == b) return name;
  return "?";
}

// "flash" | "flash2" | "plain" | "cudnn"; nullopt for anything else.
inline std::optional<AttentionBackend> attention_backend_from_name(std::string_view name) {
  for (const auto& [k, n] : kAttentionBackendNames)
    if (name == n) return k;
  return std::nullopt;
}

}  // namespace ds

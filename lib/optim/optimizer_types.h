// DeepSpeed's optimizer.type names dstrain implements, and the class each
// maps to: the table the config reader checks a type against and
// make_optimizer (optimizer.h) builds from. Plain data, no tensors, so the
// config layer (and its fuzz target) needs nothing else of lib/optim.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace ds {

enum class OptimizerKind { AdamW };

// The kind of a registered type (case-insensitive), none for anything else.
std::optional<OptimizerKind> optimizer_kind(std::string_view type);
// The canonical spelling of a registered type ("adamw" -> "AdamW"), "" when
// none; and the list a config error names ("Adam and AdamW").
std::string canonical_optimizer_type(std::string_view type);
std::string optimizer_types_text();

}  // namespace ds

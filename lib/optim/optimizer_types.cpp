// The optimizer type table (optimizer_types.h). A new optimizer adds its
// DeepSpeed name(s) here, an OptimizerKind and its case in make_optimizer.
#include "lib/optim/optimizer_types.h"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace ds {
namespace {

struct Registered {
  const char* type;  // DeepSpeed's spelling
  OptimizerKind kind;
};

// DeepSpeed's "Adam" with its default adam_w_mode is AdamW (decoupled weight
// decay); optimizer_kind(spec) turns it into AdamL2 with adam_w_mode false.
constexpr Registered kRegistry[] = {
    {"Adam", OptimizerKind::AdamW},      {"AdamW", OptimizerKind::AdamW}, {"SGD", OptimizerKind::SGD},
    {"Adagrad", OptimizerKind::Adagrad}, {"Lion", OptimizerKind::Lion},   {"Lamb", OptimizerKind::Lamb},
    {"OneBitAdam", OptimizerKind::OneBitAdam}, {"ZeroOneAdam", OptimizerKind::ZeroOneAdam},
    {"OneBitLamb", OptimizerKind::OneBitLamb},
};

bool same_type(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

const Registered* find(std::string_view type) {
  for (const Registered& r : kRegistry)
    if (same_type(r.type, type)) return &r;
  return nullptr;
}

}  // namespace

std::optional<OptimizerKind> optimizer_kind(std::string_view type) {
  const Registered* r = find(type);
  return r ? std::optional<OptimizerKind>(r->kind) : std::nullopt;
}

std::optional<OptimizerKind> optimizer_kind(const OptimizerSpec& spec) {
  std::optional<OptimizerKind> k = optimizer_kind(spec.type);
  // As DeepSpeed: adam_w_mode false turns "Adam" into L2 Adam; "AdamW" stays AdamW.
  if (k == OptimizerKind::AdamW && same_type(spec.type, "Adam") && !spec.adam_w_mode) k = OptimizerKind::AdamL2;
  return k;
}

std::string canonical_optimizer_type(std::string_view type) {
  const Registered* r = find(type);
  return r ? r->type : "";
}

std::string optimizer_types_text() {
  std::string s;
  const size_t n = std::size(kRegistry);
  for (size_t i = 0; i < n; ++i) s += std::string(i == 0 ? "" : i + 1 == n ? " and " : ", ") + kRegistry[i].type;
  return s;
}

const char* optimizer_kind_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::AdamW: return "AdamW";
    case OptimizerKind::AdamL2: return "Adam";
    case OptimizerKind::SGD: return "SGD";
    case OptimizerKind::Adagrad: return "Adagrad";
    case OptimizerKind::Lion: return "Lion";
    case OptimizerKind::Lamb: return "Lamb";
    case OptimizerKind::OneBitAdam: return "OneBitAdam";
    case OptimizerKind::ZeroOneAdam: return "ZeroOneAdam";
    case OptimizerKind::OneBitLamb: return "OneBitLamb";
  }
  return "?";
}

int optimizer_state_count(const OptimizerSpec& spec) {
  switch (optimizer_kind(spec).value_or(OptimizerKind::AdamW)) {
    case OptimizerKind::SGD: return spec.momentum != 0 ? 1 : 0;
    case OptimizerKind::Adagrad:
    case OptimizerKind::Lion: return 1;
    case OptimizerKind::OneBitLamb: return 3;
    default: return 2;
  }
}

}  // namespace ds

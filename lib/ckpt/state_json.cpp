// state.json validation: every field is checked for type, count and range,
// and the document's own checksum for a flipped bit (required in a state.json
// with a format_version; only older, unversioned ones may lack it).
#include "lib/ckpt/state_json.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/ckpt/crc32c.h"
#include "lib/ckpt/step_tokenizer.h"
#include "lib/core/error.h"
#include "lib/core/json_config.h"

namespace ds {
namespace {

using nlohmann::json;

// A value for an error message: compact, at most ~60 characters.
std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', true, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

struct Reader {
  const json& root;
  const std::string& file;

  [[noreturn]] void fail(const std::string& field, const std::string& want, const json& got) const {
    DS_USER_ERROR("checkpoint file '{}': field '{}' must be {}, got {}", file, field, want, show(got));
  }
  const json* find(const char* key) const {
    auto it = root.find(key);
    return it == root.end() ? nullptr : &*it;
  }
  int64_t integer(const json& v, const std::string& field, int64_t lo, int64_t hi) const {
    const std::string want = fmt::format("an integer in [{}, {}]", lo, hi);
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(hi) || static_cast<int64_t>(u) < lo) fail(field, want, v);
      return static_cast<int64_t>(u);
    }
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) fail(field, want, v);
    return v.get<int64_t>();
  }
  int64_t required(const char* key, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    if (!v) DS_USER_ERROR("checkpoint file '{}': field '{}' is missing", file, key);
    return integer(*v, key, lo, hi);
  }
  int64_t optional(const char* key, int64_t lo, int64_t hi, int64_t fallback) const {
    const json* v = find(key);
    return v ? integer(*v, key, lo, hi) : fallback;
  }
};

Shape read_shape(const Reader& r, const json& v, const std::string& field) {
  if (!v.is_array() || v.empty() || v.size() > kMaxShapeDims)
    r.fail(field, fmt::format("a list of 1 to {} dimensions", kMaxShapeDims), v);
  Shape s;
  int64_t numel = 1;
  for (size_t k = 0; k < v.size(); ++k) {
    const int64_t d = r.integer(v[k], fmt::format("{}[{}]", field, k), 1, kMaxDimension);
    if (numel > kMaxDimension / d) r.fail(field, "a shape of at most 2^40 elements", v);
    numel *= d;
    s.push_back(d);
  }
  return s;
}

void read_layout(const Reader& r, StepState& s) {
  const json* l = r.find("layout");
  if (!l) DS_USER_ERROR("checkpoint file '{}': field 'layout' is missing", r.file);
  if (!l->is_array() || l->empty()) r.fail("layout", "a non-empty list of [name, shape] pairs", *l);
  for (size_t i = 0; i < l->size(); ++i) {
    const json& e = (*l)[i];
    const std::string field = fmt::format("layout[{}]", i);
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || e[0].get_ref<const std::string&>().empty())
      r.fail(field, "a [name, shape] pair", e);
    s.layout.emplace_back(e[0].get<std::string>(), read_shape(r, e[1], field + "[1]"));
  }
}

void read_checksums(const Reader& r, StepState& s) {
  const json* c = r.find("checksums");
  if (!c) return;
  if (!c->is_object()) r.fail("checksums", "an object of file name -> \"crc32c:<8 hex digits>\"", *c);
  for (auto it = c->begin(); it != c->end(); ++it) {
    const std::string& name = it.key();
    const std::string field = "checksums." + name;
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos)
      r.fail("checksums", "keyed by plain file names", json(name));
    uint32_t crc = 0;
    if (!it.value().is_string() || !parse_crc32c_text(it.value().get<std::string>(), crc))
      r.fail(field, "\"crc32c:<8 hex digits>\"", it.value());
    s.checksums[name] = crc;
  }
}

// "chunk_checksums": {file: {"chunk_bytes": N, "crc32c": ["crc32c:<hex>", ...]}},
// each file one with a whole-file checksum.
void read_chunk_checksums(const Reader& r, StepState& s) {
  const json* c = r.find("chunk_checksums");
  if (!c) return;
  const char* want = "an object of file name -> {\"chunk_bytes\": N, \"crc32c\": [\"crc32c:<8 hex digits>\", ...]}";
  if (!c->is_object()) r.fail("chunk_checksums", want, *c);
  for (auto it = c->begin(); it != c->end(); ++it) {
    const std::string field = "chunk_checksums." + it.key();
    if (!s.checksums.count(it.key())) r.fail(field, "a file that has an entry in checksums", json(it.key()));
    const json& e = it.value();
    if (!e.is_object() || e.size() != 2 || !e.contains("chunk_bytes") || !e.contains("crc32c")) r.fail(field, want, e);
    const json& cb = e["chunk_bytes"];
    if (!cb.is_number_unsigned() || cb.get<uint64_t>() < 4096 || cb.get<uint64_t>() > (uint64_t(1) << 40) ||
        cb.get<uint64_t>() % 4096 != 0)
      r.fail(field + ".chunk_bytes", "a multiple of 4096 in [4096, 2^40]", cb);
    const json& list = e["crc32c"];
    if (!list.is_array() || list.empty() || list.size() > (size_t(1) << 24))
      r.fail(field + ".crc32c", "a non-empty array of at most 2^24 checksums", list.is_array() ? json(list.size()) : list);
    StepState::ChunkSums sums;
    sums.chunk_bytes = cb.get<uint64_t>();
    for (const json& v : list) {
      uint32_t crc = 0;
      if (!v.is_string() || !parse_crc32c_text(v.get<std::string>(), crc))
        r.fail(field + ".crc32c", "\"crc32c:<8 hex digits>\" entries", v);
      sums.crcs.push_back(crc);
    }
    s.chunk_checksums[it.key()] = std::move(sums);
  }
}

// "tokenizer": {"tokenizer_type": name, field: file, ...}. Each file is one of
// the names a copy has and carries a checksum, so a crafted state.json can
// name nothing but a verified file of its own step directory.
void read_tokenizer(const Reader& r, StepState& s) {
  const json* t = r.find("tokenizer");
  if (!t) return;
  const char* want = "an object {\"tokenizer_type\": name, \"vocab_file\" | \"merge_file\" | \"tokenizer_model\": "
                     "file name}";
  if (!t->is_object() || !t->contains("tokenizer_type") || t->size() < 2) r.fail("tokenizer", want, *t);
  for (auto it = t->begin(); it != t->end(); ++it) {
    const std::string field = "tokenizer." + it.key();
    if (!it.value().is_string() || it.value().get_ref<const std::string&>().size() > 64)
      r.fail(field, "a string of at most 64 characters", it.value());
    const std::string& v = it.value().get_ref<const std::string&>();
    if (it.key() == "tokenizer_type") {
      s.tokenizer_type = v;
      continue;
    }
    if (it.key() != "vocab_file" && it.key() != "merge_file" && it.key() != "tokenizer_model")
      r.fail("tokenizer", want, json(it.key()));
    if (!is_step_tokenizer_name(v))
      r.fail(field, "vocab.json, merges.txt, tokenizer.model or tokenizer.json", it.value());
    if (!s.checksums.count(v))
      DS_USER_ERROR("checkpoint file '{}': field '{}' names '{}', which has no checksum", r.file, field, v);
    s.tokenizer_files[it.key()] = v;
  }
}

// The document's own checksum: CRC-32C of its compact dump without the field.
// Required from format_version 1 on (every writer of a versioned state.json
// writes it, so a missing one was removed); only an unversioned (older)
// state.json may lack it.
void verify_self_checksum(const Reader& r, json& doc) {
  const int64_t version = r.optional("format_version", 1, std::numeric_limits<int64_t>::max(), 0);
  DS_USER_CHECK(version <= kStateFormatVersion, "checkpoint file '{}' has format_version {}, this build reads up "
                "to {} (written by a newer dstrain?)", r.file, version, kStateFormatVersion);
  auto it = doc.find("state_checksum");
  if (it == doc.end()) {
    DS_USER_CHECK(version == 0, "checkpoint file '{}' has no state_checksum, which every state.json of "
                  "format_version {} carries (removed or hand-edited?); refusing to load it unverified", r.file,
                  version);
    return;
  }
  uint32_t want = 0;
  if (!it->is_string() || !parse_crc32c_text(it->get<std::string>(), want))
    r.fail("state_checksum", "\"crc32c:<8 hex digits>\"", *it);
  doc.erase(it);
  const std::string text = doc.dump();
  const uint32_t got = crc32c(text.data(), text.size());
  DS_USER_CHECK(got == want, "checkpoint file '{}' is corrupt: its contents have checksum {}, state_checksum says {}",
                r.file, crc32c_text(got), crc32c_text(want));
}

int64_t member(const Reader& r, const json& o, const char* key, int64_t lo, int64_t hi) {
  const auto it = o.find(key);
  if (it == o.end()) DS_USER_ERROR("checkpoint file '{}': field 'lr_scheduler.{}' is missing", r.file, key);
  return r.integer(*it, std::string("lr_scheduler.") + key, lo, hi);
}

double finite_member(const Reader& r, const json& o, const char* key) {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0)
    r.fail(std::string("lr_scheduler.") + key, "a finite non-negative number", it == o.end() ? json() : *it);
  return it->get<double>();
}

// "lr_scheduler": the schedule's counters and (Megatron schedule) its values.
void read_lr_scheduler(const Reader& r, TrainState& t) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const json* o = r.find("lr_scheduler");
  if (!o) {  // older checkpoints: the trainer derives the counters (samples -1: unknown)
    t.lr_clock.steps = std::max<int64_t>(0, t.iteration - t.skipped_steps);
    t.lr_clock.samples = -1;
    return;
  }
  if (!o->is_object()) r.fail("lr_scheduler", "an object", *o);
  t.lr_clock.steps = member(r, *o, "steps", 0, kMax);
  t.lr_clock.samples = member(r, *o, "num_steps", 0, kMax);
  t.lr_clock.tokens = member(r, *o, "num_tokens", 0, kMax);
  t.lr_clock.warmup_end_tokens = member(r, *o, "warmup_end_tokens", -1, kMax);
  if (!o->contains("max_lr")) return;
  LrScheduleValues v;
  v.max_lr = finite_member(r, *o, "max_lr");
  v.min_lr = finite_member(r, *o, "min_lr");
  v.warmup_samples = member(r, *o, "lr_warmup_steps", 0, kMax);
  v.decay_samples = member(r, *o, "lr_decay_steps", 0, kMax);
  v.warmup_tokens = member(r, *o, "lr_warmup_tokens", -1, kMax);
  v.decay_tokens = member(r, *o, "lr_decay_tokens", -1, kMax);
  const auto st = o->find("lr_decay_style");
  if (st == o->end() || !st->is_string() ||
      (*st != "constant" && *st != "linear" && *st != "cosine"))
    r.fail("lr_scheduler.lr_decay_style", "\"constant\", \"linear\" or \"cosine\"", st == o->end() ? json() : *st);
  v.decay_style = st->get<std::string>();
  t.lr_schedule = v;
}

}  // namespace

json lr_scheduler_json(const TrainState& st) {
  const LrClock& c = st.lr_clock;
  json j = {{"steps", c.steps}, {"num_steps", c.samples}, {"num_tokens", c.tokens},
            {"warmup_end_tokens", c.warmup_end_tokens}};
  if (const auto& v = st.lr_schedule) {
    j["max_lr"] = v->max_lr;
    j["min_lr"] = v->min_lr;
    j["lr_warmup_steps"] = v->warmup_samples;
    j["lr_decay_steps"] = v->decay_samples;
    j["lr_warmup_tokens"] = v->warmup_tokens;
    j["lr_decay_tokens"] = v->decay_tokens;
    j["lr_decay_style"] = v->decay_style;
  }
  return j;
}

StepState parse_step_state(std::string_view text, const std::string& file) {
  StepState s;
  json doc = parse_json_text(text, "checkpoint file '" + file + "'");
  DS_USER_CHECK(doc.is_object(), "checkpoint file '{}' must hold a JSON object, got {}", file, show(doc));
  const Reader r{doc, file};
  verify_self_checksum(r, doc);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  s.train.iteration = r.required("iteration", 0, kMax);
  s.train.consumed_samples = r.required("consumed_samples", 0, kMax);
  s.train.consumed_tokens = r.optional("consumed_tokens", 0, kMax, -1);
  s.train.skipped_steps = r.optional("skipped_steps", 0, kMax, 0);
  s.train.good_steps = r.optional("good_steps", 0, kMax, 0);
  s.train.hysteresis_left = r.optional("hysteresis_left", 0, kMax, 0);
  if (const json* ls = r.find("loss_scale")) {
    if (!ls->is_number() || !std::isfinite(ls->get<double>()) || ls->get<double>() <= 0)
      r.fail("loss_scale", "a finite positive number", *ls);
    s.train.loss_scale = ls->get<double>();
  }
  read_lr_scheduler(r, s.train);
  s.shards = static_cast<int>(r.required("optimizer_shards", 1, kMaxParallelSize));
  s.sizes.tp = static_cast<int>(r.optional("tensor_model_parallel_size", 1, kMaxParallelSize, 1));
  s.sizes.pp = static_cast<int>(r.optional("pipeline_model_parallel_size", 1, kMaxParallelSize, 1));
  s.sizes.vp = static_cast<int>(r.optional("virtual_pipeline_stages", 1, kMaxParallelSize, 1));
  s.sizes.ep = static_cast<int>(r.optional("expert_parallel_size", 1, kMaxParallelSize, 1));
  read_layout(r, s);
  read_checksums(r, s);
  read_chunk_checksums(r, s);
  DS_USER_CHECK(!s.checksums.empty() || !doc.contains("format_version"), "checkpoint file '{}' has no file "
                "checksums, which every state.json with a format_version carries (removed or hand-edited?)", file);
  read_tokenizer(r, s);
  if (const json* c = r.find("config")) {
    if (!c->is_object()) r.fail("config", "an object", *c);
    s.config = *c;
  }
  s.raw = std::move(doc);
  return s;
}

std::string step_state_text(const nlohmann::json& state) {
  DS_CHECK(state.is_object() && !state.contains("state_checksum"), "step_state_text: bad state object");
  json doc = state;
  doc["format_version"] = kStateFormatVersion;
  const std::string compact = doc.dump();
  doc["state_checksum"] = crc32c_text(crc32c(compact.data(), compact.size()));
  return doc.dump(1);
}

}  // namespace ds

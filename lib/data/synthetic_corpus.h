// A deterministic generator of English-like demo text, written for this project
// so that the demo and the tests need no downloaded or third-party corpus.
// A small probabilistic grammar (a few hundred words) produces paragraphs about
// one topic each, with a protagonist whose pronoun stays consistent, number
// agreement ("one cat" / "three cats"), counting sequences and dialogue. The
// structure is regular enough that a small GPT's loss falls visibly within minutes.
// Paragraphs are separated by one blank line (dsprep's plain-text document rule).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ds::data {

// Calls `sink` with successive chunks (each one whole paragraph followed by a
// blank line) until at least `target_bytes` bytes were produced. Same seed ->
// same bytes on every machine.
void generate_corpus(uint64_t seed, int64_t target_bytes,
                     const std::function<void(std::string_view)>& sink);
std::string generate_corpus(uint64_t seed, int64_t target_bytes);

}  // namespace ds::data

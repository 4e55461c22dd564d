// The demo-corpus grammar: word lists grouped by topic, sentence templates that
// draw from the paragraph's topic and protagonist, and the paragraph loop.
// All wording here is original to this project.
#include "lib/data/synthetic_corpus.h"

#include <algorithm>
#include <array>
#include <vector>

#include "lib/core/rng.h"

namespace ds::data {

namespace {

struct Noun {
  const char* one;
  const char* many;
};
struct Verb {
  const char* base;
  const char* past;
};
struct Person {
  const char* name;
  bool she;
};
struct Topic {
  const char* place;                // "the harbor"
  std::vector<Noun> things;         // objects found there
  std::vector<Verb> actions;        // transitive: "<name> <past> the <thing>"
  std::vector<const char*> traits;  // adjectives for the things
  std::vector<const char*> sounds;  // intransitive past: "the wind <sound>"
  const char* ambient;              // subject of the sounds
};

const std::vector<Person> kPeople = {
    {"Anna", true},  {"Tomas", false}, {"Mira", true},  {"Oskar", false}, {"Lena", true},
    {"Pavel", false}, {"Iris", true},  {"Jonas", false}, {"Nora", true},  {"Felix", false},
    {"Greta", true}, {"Hugo", false},  {"Clara", true}, {"Milo", false},  {"Ada", true},
    {"Bruno", false}, {"Vera", true},  {"Emil", false}, {"Rosa", true},   {"Karl", false},
};

const std::vector<Topic> kTopics = {
    {"the harbor",
     {{"boat", "boats"}, {"net", "nets"}, {"rope", "ropes"}, {"fish", "fish"},
      {"anchor", "anchors"}, {"sail", "sails"}, {"gull", "gulls"}, {"crate", "crates"}},
     {{"pull", "pulled"}, {"mend", "mended"}, {"paint", "painted"}, {"tie", "tied"},
      {"load", "loaded"}, {"count", "counted"}},
     {"wet", "heavy", "blue", "old", "salty", "long"},
     {"rose", "howled", "fell quiet", "changed direction"}, "the wind"},
    {"the forest",
     {{"tree", "trees"}, {"mushroom", "mushrooms"}, {"fox", "foxes"}, {"path", "paths"},
      {"branch", "branches"}, {"stone", "stones"}, {"owl", "owls"}, {"berry", "berries"}},
     {{"follow", "followed"}, {"gather", "gathered"}, {"watch", "watched"},
      {"climb", "climbed"}, {"find", "found"}, {"carry", "carried"}},
     {"tall", "green", "quiet", "dark", "mossy", "small"},
     {"whispered", "grew still", "creaked", "moved softly"}, "the old wood"},
    {"the kitchen",
     {{"pot", "pots"}, {"onion", "onions"}, {"loaf", "loaves"}, {"spoon", "spoons"},
      {"apple", "apples"}, {"bowl", "bowls"}, {"cake", "cakes"}, {"kettle", "kettles"}},
     {{"wash", "washed"}, {"cut", "cut"}, {"bake", "baked"}, {"stir", "stirred"},
      {"fill", "filled"}, {"warm", "warmed"}},
     {"hot", "sweet", "fresh", "round", "clean", "golden"},
     {"hissed", "bubbled", "smelled of bread", "grew warm"}, "the stove"},
    {"the market",
     {{"basket", "baskets"}, {"coin", "coins"}, {"cheese", "cheeses"}, {"stall", "stalls"},
      {"lamp", "lamps"}, {"carpet", "carpets"}, {"melon", "melons"}, {"hat", "hats"}},
     {{"buy", "bought"}, {"sell", "sold"}, {"weigh", "weighed"}, {"choose", "chose"},
      {"wrap", "wrapped"}, {"trade", "traded"}},
     {"cheap", "bright", "fine", "strange", "yellow", "cheerful"},
     {"grew loud", "filled with people", "went on", "slowly emptied"}, "the crowd"},
    {"the workshop",
     {{"hammer", "hammers"}, {"nail", "nails"}, {"chair", "chairs"}, {"plank", "planks"},
      {"wheel", "wheels"}, {"box", "boxes"}, {"clock", "clocks"}, {"saw", "saws"}},
     {{"build", "built"}, {"fix", "fixed"}, {"sand", "sanded"}, {"measure", "measured"},
      {"polish", "polished"}, {"repair", "repaired"}},
     {"broken", "sturdy", "wooden", "narrow", "shiny", "new"},
     {"rang", "ticked", "hummed", "went silent"}, "the machine"},
    {"the school",
     {{"book", "books"}, {"letter", "letters"}, {"map", "maps"}, {"desk", "desks"},
      {"pencil", "pencils"}, {"lesson", "lessons"}, {"song", "songs"}, {"word", "words"}},
     {{"read", "read"}, {"write", "wrote"}, {"copy", "copied"}, {"learn", "learned"},
      {"draw", "drew"}, {"open", "opened"}},
     {"difficult", "short", "funny", "careful", "thin", "famous"},
     {"rang twice", "echoed", "was opened", "closed early"}, "the bell"},
    {"the garden",
     {{"flower", "flowers"}, {"bean", "beans"}, {"bee", "bees"}, {"seed", "seeds"},
      {"leaf", "leaves"}, {"rose", "roses"}, {"bucket", "buckets"}, {"fence", "fences"}},
     {{"plant", "planted"}, {"water", "watered"}, {"pick", "picked"}, {"dig", "dug"},
      {"trim", "trimmed"}, {"pull", "pulled"}},
     {"red", "tiny", "dry", "tangled", "ripe", "white"},
     {"buzzed", "dripped", "turned gold", "grew warm"}, "the afternoon"},
    {"the station",
     {{"train", "trains"}, {"ticket", "tickets"}, {"bag", "bags"}, {"bench", "benches"},
      {"clock", "clocks"}, {"platform", "platforms"}, {"map", "maps"}, {"suitcase", "suitcases"}},
     {{"wait for", "waited for"}, {"board", "boarded"}, {"check", "checked"},
      {"lift", "lifted"}, {"miss", "missed"}, {"drag", "dragged"}},
     {"late", "crowded", "empty", "grey", "fast", "distant"},
     {"whistled", "arrived", "rattled past", "was delayed"}, "the night train"},
};

const std::vector<const char*> kAdverbs = {"slowly", "quickly", "carefully", "happily",
                                           "quietly", "again", "at last", "without a word"};
const std::vector<const char*> kTimes = {"In the morning", "After lunch", "Later that day",
                                         "In the evening", "Before dawn", "On Sunday",
                                         "At noon", "That winter"};
const std::vector<const char*> kWeather = {"cold", "warm", "windy", "rainy", "bright", "grey"};
const std::array<const char*, 10> kNumbers = {"one", "two",   "three", "four", "five",
                                              "six", "seven", "eight", "nine", "ten"};
const std::vector<const char*> kFeelings = {"tired", "glad", "curious", "hungry", "proud",
                                            "worried", "calm", "surprised"};

template <typename T>
const T& pick(Rng& rng, const std::vector<T>& v) {
  return v[rng.below(v.size())];
}

std::string capitalize(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

// Per-paragraph state: who acts, where, and a friend who may answer.
struct Scene {
  const Topic* topic;
  Person hero;
  Person friend_;
  int mentions = 0;  // the hero is named first, then referred to by pronoun
};

std::string subject(Scene& s) {
  return s.mentions++ == 0 ? s.hero.name : (s.hero.she ? "she" : "he");
}

std::string thing_phrase(Rng& rng, const Topic& t, bool with_trait) {
  std::string p = "the ";
  if (with_trait) p += std::string(pick(rng, t.traits)) + " ";
  return p + pick(rng, t.things).one;
}

// Every random draw below is its own statement: the order of evaluation of the
// operands of '+' is unspecified, and the text must not depend on the compiler.
std::string sentence(Rng& rng, Scene& s) {
  const Topic& t = *s.topic;
  const char* poss = s.hero.she ? "her" : "his";
  const uint64_t kind = rng.below(9);
  if (kind == 0) {
    const std::string who = capitalize(subject(s));
    const char* verb = pick(rng, t.actions).past;
    const bool trait = rng.below(2);
    const std::string what = thing_phrase(rng, t, trait);
    return who + " " + verb + " " + what + " " + pick(rng, kAdverbs) + ".";
  }
  if (kind == 1) {
    const auto n = static_cast<size_t>(rng.below(kNumbers.size()));
    const Noun& noun = pick(rng, t.things);
    const char* trait = pick(rng, t.traits);
    return std::string("There ") + (n == 0 ? "was " : "were ") + kNumbers[n] + " " + trait +
           " " + (n == 0 ? noun.one : noun.many) + " in " + t.place + ".";
  }
  if (kind == 2) {
    const char* sound = pick(rng, t.sounds);
    const std::string who = subject(s);
    return capitalize(t.ambient) + " " + sound + ", and " + who + " felt " +
           pick(rng, kFeelings) + ".";
  }
  if (kind == 3) {
    const Noun& noun = pick(rng, t.things);
    const char* near = noun.one;
    while (near == noun.one) near = pick(rng, t.things).one;
    return std::string("\"Where is the ") + noun.one + "?\" asked " + s.hero.name + ". \"The " +
           noun.one + " is near the " + near + ",\" said " + s.friend_.name + ".";
  }
  if (kind == 4) {
    const size_t start = rng.below(4);
    const size_t len = 3 + rng.below(4);
    const std::string who = capitalize(subject(s));
    std::string out = who + " counted the " + pick(rng, t.things).many + ":";
    for (size_t k = start; k < start + len; ++k)
      out += std::string(k == start ? " " : ", ") + kNumbers[k];
    return out + ".";
  }
  if (kind == 5) {
    const char* weather = pick(rng, kWeather);
    const std::string who = subject(s);
    return std::string("Because the day was ") + weather + ", " + who + " stayed in " + t.place +
           " with " + s.friend_.name + ".";
  }
  if (kind == 6) {
    const char* when = pick(rng, kTimes);
    const std::string who = subject(s);
    const char* verb = pick(rng, t.actions).base;
    return std::string(when) + ", " + who + " went to " + t.place + " to " + verb + " " +
           thing_phrase(rng, t, false) + ".";
  }
  if (kind == 7) {
    const std::string who = capitalize(subject(s));
    const char* gift = pick(rng, t.things).one;
    const char* verb = pick(rng, t.actions).past;
    return who + " gave " + poss + " " + gift + " to " + s.friend_.name + ", who " + verb +
           " it " + pick(rng, kAdverbs) + ".";
  }
  const char* trait = pick(rng, t.traits);
  const char* things = pick(rng, t.things).many;
  return "The " + std::string(trait) + " " + things + " were " + (rng.below(2) ? "not " : "") +
         "for sale.";
}

std::string paragraph(Rng& rng) {
  Scene s;
  s.topic = &pick(rng, kTopics);
  s.hero = pick(rng, kPeople);
  do s.friend_ = pick(rng, kPeople); while (s.friend_.name == s.hero.name);
  const char* when = pick(rng, kTimes);
  std::string out = std::string(when) + ", " + s.hero.name + " was in " + s.topic->place + ".";
  s.mentions = 1;
  const int n = 3 + static_cast<int>(rng.below(5));
  for (int k = 0; k < n; ++k) {
    out += (k % 4 == 3) ? "\n" : " ";
    out += sentence(rng, s);
  }
  return out + "\n\n";
}

}  // namespace

void generate_corpus(uint64_t seed, int64_t target_bytes,
                     const std::function<void(std::string_view)>& sink) {
  Rng rng(splitmix64(seed ^ 0x6a09e667f3bcc908ull));
  int64_t written = 0;
  while (written < target_bytes) {
    std::string p = paragraph(rng);
    written += static_cast<int64_t>(p.size());
    sink(p);
  }
}

std::string generate_corpus(uint64_t seed, int64_t target_bytes) {
  std::string out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(target_bytes, 0)) + 1024);
  generate_corpus(seed, target_bytes, [&](std::string_view p) { out.append(p); });
  return out;
}

}  // namespace ds::data

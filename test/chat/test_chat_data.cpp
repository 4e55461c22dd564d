// DeepSpeed-Chat's data phases (lib/chat/data_split.h) against numpy and
// Python themselves: test/chat/split_ref.py runs DeepSpeed-Chat's split
// arithmetic and numpy's legacy RandomState(seed).shuffle for many seeds,
// sizes (including the sizes where Python's round() meets a half and the
// boundaries shift) and splits, and every phase's indices must be the same,
// in the same order. Bad --data_split values are one line. Skips when
// /usr/bin/python3 cannot import numpy.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "lib/chat/data_split.h"
#include "lib/chat/pairs.h"
#include "lib/chat/phase_data.h"
#include "lib/chat/unsup_data.h"
#include "lib/core/error.h"
#include "test/popen_lines.h"
#include "test/skip.h"

using namespace ds;
using Catch::Matchers::Contains;

namespace {

// Runs split_ref.py on `cases`; returns its exit code, and its lines in `out`.
int reference(const std::vector<std::string>& cases, std::vector<std::string>& out) {
  const char* src = std::getenv("DS_SOURCE_DIR");
  std::string cmd = "/usr/bin/python3 " + std::string(src ? src : ".") + "/test/chat/split_ref.py";
  for (const std::string& c : cases) cmd += " '" + c + "'";
  return test::popen_lines(cmd + " 2>&1", out);
}

}  // namespace

TEST_CASE("DeepSpeed-Chat's phases: the same examples, in the same order, as numpy and Python give") {
  struct Case {
    uint32_t seed;
    int64_t n;
    std::string split;
  };
  std::vector<Case> cases;
  for (uint32_t seed : {0u, 1u, 42u, 1234u, 4294967295u})
    for (int64_t n : {1, 2, 3, 10, 17, 100, 1001, 50000})
      for (const char* split : {"2,4,4", "10,0,0", "6,2,2", "1,1,1", "0.5,0.25,0.25"}) cases.push_back({seed, n, split});
  cases.push_back({7, 5, "1,1"});        // 2.5 rounds to 2, the other to 2: shifted by one
  cases.push_back({7, 7, "1,1,1,1"});    // quarters of 7: 1.75 each, rounded up, shifted back
  cases.push_back({9, 300000, "3,3,4"});  // a larger permutation (rejection sampling over wider masks)
  std::vector<std::string> args;
  for (const Case& c : cases) {
    std::string s = c.split;
    for (char& ch : s)
      if (ch == ',') ch = ';';
    const int parts = static_cast<int>(chat::parse_data_split(c.split, "--data_split").size());
    for (int phase = 0; phase < parts; ++phase)
      args.push_back(std::to_string(c.seed) + ":" + std::to_string(c.n) + ":" + s + ":" + std::to_string(phase));
  }
  std::vector<std::string> want;
  const int rc = reference(args, want);
  if (rc == 77) DS_SKIP((want.empty() ? std::string("no numpy") : want[0]));
  REQUIRE(rc == 0);
  REQUIRE(want.size() == args.size());
  size_t k = 0;
  for (const Case& c : cases) {
    const std::vector<double> w = chat::parse_data_split(c.split, "--data_split");
    for (int phase = 0; phase < static_cast<int>(w.size()); ++phase, ++k) {
      INFO(args[k]);
      std::ostringstream got;
      const std::vector<int64_t> idx = chat::phase_indices(w, phase, c.seed, c.n);
      for (size_t i = 0; i < idx.size(); ++i) got << (i ? " " : "") << idx[i];
      REQUIRE(got.str() == want[k]);
    }
  }
}

TEST_CASE("--data_split values that are not weights are one line naming them") {
  for (const char* bad : {"", "2,,4", "2,4,x", "-1,2", "0,0,0", "nan,1", "inf,1", "2;4;4"}) {
    INFO(bad);
    try {
      chat::parse_data_split(bad, "--data_split");
      FAIL("accepted");
    } catch (const UserError& e) {
      CHECK_THAT(e.what(), Contains("--data_split '" + std::string(bad) + "'"));
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
  CHECK(chat::parse_data_split("2,4,4", "x") == std::vector<double>{2, 4, 4});
  CHECK(chat::split_boundaries({2, 4, 4}, 10) == std::vector<int64_t>{0, 2, 6, 10});
}

TEST_CASE("local/jsonfile examples: JSON Lines or an array; texts as DeepSpeed-Chat builds them") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dstrain_chatpairs_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  };
  const std::string lines = write("train.json",
                                  "{\"prompt\": \"Human: hi Assistant:\", \"chosen\": \"hello\", \"rejected\": \"go away\"}\n"
                                  "\n"
                                  "{\"prompt\": \"Human: q\", \"chosen\": null, \"rejected\": \"r\", \"extra\": [1, 2]}\r\n"
                                  "{\"chosen\": \"only\"}");
  const std::vector<chat::ChatExample> ex = chat::read_pair_file(lines);
  REQUIRE(ex.size() == 3);
  CHECK(chat::prompt_text(ex[0]) == std::optional<std::string>(" Human: hi Assistant:"));
  CHECK(chat::chosen_text(ex[0]) == std::optional<std::string>(" hello"));
  CHECK(chat::rejected_text(ex[0]) == std::optional<std::string>(" go away"));
  CHECK(chat::prompt_and_chosen(ex[0]) == std::optional<std::string>(" Human: hi Assistant: hello"));
  CHECK(chat::prompt_and_rejected(ex[0]) == std::optional<std::string>(" Human: hi Assistant: go away"));
  CHECK_FALSE(chat::prompt_and_chosen(ex[1]).has_value());  // chosen null: DeepSpeed-Chat skips it
  CHECK(chat::prompt_and_rejected(ex[1]) == std::optional<std::string>(" Human: q r"));
  CHECK_FALSE(chat::prompt_text(ex[2]).has_value());
  const std::string array = write("eval.json", "  [{\"prompt\": \"a\", \"chosen\": \"b\"}, {\"prompt\": \"c\"}]");
  const std::vector<chat::ChatExample> ev = chat::read_pair_file(array);
  REQUIRE(ev.size() == 2);
  CHECK(chat::prompt_and_chosen(ev[0]) == std::optional<std::string>(" a b"));
  struct Bad {
    const char* text;
    const char* says;
  };
  for (const Bad& b : {Bad{"{\"prompt\": 3}", "line 1: field 'prompt' is number"},
                       Bad{"{\"prompt\": \"a\"}\n[1]", "line 2: expected a JSON object"},
                       Bad{"{\"prompt\": \"a\"\n", "line 1"}, Bad{"[{\"chosen\": {}}]", "element 0: field 'chosen'"}}) {
    INFO(b.text);
    const std::string f = write("bad.json", b.text);
    try {
      chat::read_pair_file(f);
      FAIL("accepted");
    } catch (const UserError& e) {
      CHECK_THAT(e.what(), Contains(f) && Contains(b.says));
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
  CHECK_THROWS_WITH(chat::read_pair_file((dir / "missing.json").string()), Contains("missing.json"));
  fs::remove_all(dir);
}

TEST_CASE("a step's examples: each dataset split, several blended, as DeepSpeed-Chat's create_prompt_dataset") {
  struct Case {
    uint32_t seed;
    std::string split;
    int phase;
    std::vector<int64_t> sizes;
  };
  const std::vector<Case> cases = {{1234, "2,4,4", 1, {50}},          {1234, "2,4,4", 2, {50, 31}},
                                   {7, "10,0,0", 1, {13, 200, 9}},    {42, "6,2,2", 3, {1000, 1}},
                                   {4294967295u, "1,1", 2, {17, 17}}};
  std::vector<std::string> args;
  for (const Case& c : cases) {
    std::string split = c.split, sizes;
    for (char& ch : split)
      if (ch == ',') ch = ';';
    for (int64_t n : c.sizes) {
      if (!sizes.empty()) sizes += ';';
      sizes += std::to_string(n);
    }
    args.push_back("blend:" + std::to_string(c.seed) + ":" + split + ":" + std::to_string(c.phase) + ":" + sizes);
  }
  std::vector<std::string> want;
  const int rc = reference(args, want);
  if (rc == 77) DS_SKIP((want.empty() ? std::string("no numpy") : want[0]));
  REQUIRE(rc == 0);
  REQUIRE(want.size() == cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    INFO(args[k]);
    std::vector<chat::PhaseExamples> parts;
    for (size_t d = 0; d < c.sizes.size(); ++d) {
      std::vector<chat::ChatExample> train(static_cast<size_t>(c.sizes[d]));
      for (size_t i = 0; i < train.size(); ++i) train[i].prompt = std::to_string(d) + "." + std::to_string(i);
      parts.push_back(chat::phase_examples(train, train, chat::parse_data_split(c.split, "x"), c.phase, c.seed));
    }
    const chat::PhaseExamples got = chat::blend(parts, c.seed);
    std::string line;
    for (const chat::ChatExample& e : got.train) line += (line.empty() ? "" : " ") + *e.prompt;
    CHECK(line == want[k]);
    std::string eval_line;  // eval is split and blended the same way (here the same examples)
    for (const chat::ChatExample& e : got.eval) eval_line += (eval_line.empty() ? "" : " ") + *e.prompt;
    CHECK(eval_line == want[k]);
  }
}

TEST_CASE("--sft_only_data_path: appended to the step's examples and shuffled, as create_prompt_dataset") {
  struct Case {
    uint32_t seed;
    std::vector<int64_t> sizes, sft;
  };
  const std::vector<Case> cases = {{1234, {50}, {7, 3}}, {7, {13, 20}, {5}}, {4294967295u, {9}, {0, 4}}};
  std::vector<std::string> args;
  auto joined = [](const std::vector<int64_t>& v) {
    std::string s;
    for (int64_t n : v) s += (s.empty() ? "" : ";") + std::to_string(n);
    return s;
  };
  for (const Case& c : cases)
    args.push_back("sftonly:" + std::to_string(c.seed) + ":2;4;4:1:" + joined(c.sizes) + ":" + joined(c.sft));
  std::vector<std::string> want;
  const int rc = reference(args, want);
  if (rc == 77) DS_SKIP((want.empty() ? std::string("no numpy") : want[0]));
  REQUIRE(rc == 0);
  REQUIRE(want.size() == cases.size());
  auto named = [](const std::string& prefix, int64_t n) {
    std::vector<chat::ChatExample> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i].prompt = prefix + std::to_string(i);
    return v;
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    INFO(args[k]);
    std::vector<chat::PhaseExamples> parts, sft;
    for (size_t d = 0; d < c.sizes.size(); ++d) {
      const auto v = named(std::to_string(d) + ".", c.sizes[d]);
      parts.push_back(chat::phase_examples(v, v, {2, 4, 4}, 1, c.seed));
    }
    for (size_t d = 0; d < c.sft.size(); ++d) {
      const auto v = named("s" + std::to_string(d) + ".", c.sft[d]);
      sft.push_back(chat::phase_examples(v, v, {10, 0, 0}, 1, c.seed));
    }
    const chat::PhaseExamples got = chat::append_sft_only(chat::blend(parts, c.seed), sft, c.seed);
    for (const auto* v : {&got.train, &got.eval}) {
      std::string line;
      for (const chat::ChatExample& e : *v) line += (line.empty() ? "" : " ") + *e.prompt;
      CHECK(line == want[k]);
    }
  }
}

TEST_CASE("local/jsonfile is found in data/ of the working directory, its parent or grandparent") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("dstrain_chatroot_" + std::to_string(::getpid()));
  const fs::path step = root / "training" / "step1_supervised_finetuning";
  fs::create_directories(step);
  CHECK_THROWS_WITH(chat::find_local_jsonfile_dir(step.string()),
                    Contains("no data/train.json and data/eval.json in " + (step / "data").string()));
  fs::create_directories(root / "data");
  std::ofstream(root / "data" / "train.json") << "{}\n";
  CHECK_THROWS(chat::find_local_jsonfile_dir(step.string()));  // eval.json missing
  std::ofstream(root / "data" / "eval.json") << "{}\n";
  CHECK(chat::find_local_jsonfile_dir(step.string()) == root.string());
  CHECK(chat::find_local_jsonfile_dir(root.string()) == root.string());
  fs::remove_all(root);
}

// Step 3's unsupervised data (lib/chat/unsup_data.h): a local dataset folder
// as datasets.load_dataset(FOLDER, "default") reads it (checked once against
// datasets 2.21: the same texts and the same 84 blocks for 1,101 lines with
// \r, \r\n and \n line breaks), and group_texts over map's 1000-example batches.
TEST_CASE("unsupervised data: a local folder's train split, lines or records, and group_texts' blocks") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dstrain_unsup_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    fs::create_directories((dir / name).parent_path());
    std::ofstream(dir / name, std::ios::binary) << text;
  };
  auto texts = [&] { return chat::read_unsupervised_texts(dir.string(), "default", "--unsupervised_dataset_name"); };
  SECTION("text files: universal newlines, empty lines kept, none after the last break; the train split only") {
    write("wiki_train.txt", "one\r\ntwo\rthree\n\nfive\n");
    write("wiki_test.txt", "held out\n");
    write("README.md", "# card\n");
    CHECK(texts() == std::vector<std::string>{"one", "two", "three", "", "five"});
  }
  SECTION("no file names a split: every data file, in name order") {
    write("b.txt", "b1\nb2");
    write("a.txt", "a1\n");
    CHECK(texts() == std::vector<std::string>{"a1", "b1", "b2"});
  }
  SECTION("JSON Lines and arrays: the \"text\" field") {
    write("train-00.jsonl", "{\"text\": \"x\", \"id\": 1}\n\n{\"text\": \"y\"}\n");
    write("train-01.json", "[{\"text\": \"z\"}]");
    CHECK(texts() == std::vector<std::string>{"x", "y", "z"});
  }
  struct Bad {
    std::vector<std::pair<std::string, std::string>> files;
    const char* says;
  };
  for (const Bad& b : {Bad{{{"data_test.txt", "a\n"}}, "holds no train split data file"},
                       Bad{{{"train.txt", "a\n"}, {"train.json", "{\"text\": \"b\"}"}}, "mixes .txt and .json"},
                       Bad{{{"train.csv", "a\n"}}, "not a .txt, .json or .jsonl"},
                       Bad{{{"train.json", "{\"body\": \"b\"}"}}, "no \"text\" field"},
                       Bad{{{"train.json", "{\"text\": 3}"}}, "expected a string"},
                       Bad{{{"sub/train.txt", "a\n"}}, "subfolder 'sub'"}}) {
    INFO(b.says);
    fs::remove_all(dir);
    for (const auto& [name, text] : b.files) write(name, text);
    CHECK_THROWS_WITH(texts(), Contains(b.says));
  }
  fs::remove_all(dir);
  write("train.txt", "a\n");
  CHECK_THROWS_WITH(chat::read_unsupervised_texts(dir.string(), "wikitext-2-raw-v1", "--unsupervised_dataset_name"),
                    Contains("'wikitext-2-raw-v1'") && Contains("'default'"));
  CHECK_THROWS_WITH(chat::read_unsupervised_texts("wikitext", "wikitext-2-raw-v1", "--unsupervised_dataset_name"),
                    Contains("'wikitext' is not a local folder"));
  fs::remove_all(dir);

  // group_texts: per batch of examples, the concatenation cut into blocks, the remainder dropped; a batch
  // shorter than a block gives one short block, an empty one none.
  const std::vector<std::vector<int32_t>> ids = {{1, 2, 3}, {4}, {5, 6, 7, 8, 9}, {10}, {}, {11, 12}};
  CHECK(chat::group_texts(ids, 4, 1000) ==
        std::vector<std::vector<int32_t>>{{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}});
  CHECK(chat::group_texts(ids, 4, 3) ==
        std::vector<std::vector<int32_t>>{{1, 2, 3, 4}, {5, 6, 7, 8}, {10, 11, 12}});
  CHECK(chat::group_texts({{}, {}}, 4, 1).empty());
}

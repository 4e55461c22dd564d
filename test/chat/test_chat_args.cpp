// DeepSpeed-Chat's command lines read as argparse reads them
// (lib/chat/chat_args.h): values after the flag or after '=', unique
// prefixes, store_true flags, nargs='*' lists, choices, Python's int() and
// float(), and argparse's error lines; Python's float repr.
#include <catch2/catch.hpp>

#include "lib/chat/chat_args.h"
#include "lib/core/error.h"

using namespace ds::chat;
using Catch::Matchers::Contains;

namespace {

std::vector<ArgSpec> specs() {
  return {{"--data_path", ArgKind::List, {}, {}, false, {"Dahoas/rm-static"}},
          {"--model_name_or_path", ArgKind::Str, std::nullopt, {}, true},
          {"--per_device_train_batch_size", ArgKind::Int, "16"},
          {"--per_device_eval_batch_size", ArgKind::Int, "16"},
          {"--learning_rate", ArgKind::Float, "1e-3"},
          {"--dtype", ArgKind::Str, "fp16", {"fp16", "bf16"}},
          {"--offload", ArgKind::Flag},
          {"--output_dir", ArgKind::Str, std::nullopt}};
}

ParsedArgs parse(std::vector<std::string> argv) { return parse_args(specs(), argv, "dschat sft"); }

}  // namespace

TEST_CASE("argparse's reading: values, '=', prefixes, flags, lists and defaults") {
  const ParsedArgs a = parse({"--model_name_or_path", "m", "--per_device_train", "4", "--learning_rate=9.65e-6",
                              "--data_path", "a", "b", "--offload", "--dtype", "bf16"});
  CHECK(*a.str("--model_name_or_path") == "m");
  CHECK(*a.integer("--per_device_train_batch_size") == 4);  // a unique prefix
  CHECK(*a.integer("--per_device_eval_batch_size") == 16);
  CHECK(*a.real("--learning_rate") == Approx(9.65e-6));
  CHECK(a.list("--data_path") == std::vector<std::string>{"a", "b"});
  CHECK(a.flag("--offload"));
  CHECK(*a.str("--dtype") == "bf16");
  CHECK(!a.str("--output_dir"));  // None
  CHECK(a.given("--learning_rate"));
  CHECK(!a.given("--output_dir"));
  const ParsedArgs d = parse({"--model_name_or_path=x", "--data_path"});
  CHECK(d.list("--data_path").empty());  // nargs='*' with no values
  CHECK(!d.flag("--offload"));
  CHECK(parse({"--model_name_or_path", "x"}).list("--data_path") == std::vector<std::string>{"Dahoas/rm-static"});
  CHECK(*parse({"--model_name_or_path", "x", "--learning_rate", "-1"}).real("--learning_rate") == -1.0);
}

TEST_CASE("argparse's errors, one line each") {
  CHECK_THROWS_WITH(parse({}), Contains("dschat sft: the following arguments are required: --model_name_or_path"));
  CHECK_THROWS_WITH(parse({"--model_name_or_path", "m", "--bogus", "1"}),
                    Contains("unrecognized arguments: --bogus 1"));
  CHECK_THROWS_WITH(parse({"--model_name_or_path", "m", "--per_device", "4"}),
                    Contains("ambiguous option: --per_device could match --per_device_train_batch_size, "
                             "--per_device_eval_batch_size"));
  CHECK_THROWS_WITH(parse({"--model_name_or_path", "m", "--per_device_train_batch_size", "four"}),
                    Contains("argument --per_device_train_batch_size: invalid int value: 'four'"));
  CHECK_THROWS_WITH(parse({"--model_name_or_path", "m", "--learning_rate", "1e"}),
                    Contains("argument --learning_rate: invalid float value: '1e'"));
  CHECK_THROWS_WITH(parse({"--model_name_or_path", "m", "--dtype", "fp8"}),
                    Contains("argument --dtype: invalid choice: 'fp8' (choose from 'fp16', 'bf16')"));
  CHECK_THROWS_WITH(parse({"--model_name_or_path"}), Contains("argument --model_name_or_path: expected one argument"));
  CHECK_THROWS_WITH(parse({"--model_name_or_path", "m", "--offload=1"}),
                    Contains("argument --offload: ignored explicit argument '1'"));
}

TEST_CASE("--help lists every flag with its default") {
  CHECK(wants_help({"--model_name_or_path", "m", "--help"}));
  CHECK(wants_help({"-h"}));
  CHECK(!wants_help({"--model_name_or_path", "m"}));
  const std::string u = usage(specs(), "dschat sft");
  CHECK_THAT(u, Contains("--per_device_train_batch_size INT (default: 16)"));
  CHECK_THAT(u, Contains("--dtype {fp16,bf16} (default: fp16)"));
  CHECK_THAT(u, Contains("--model_name_or_path VALUE (required)"));
  CHECK_THAT(u, Contains("--data_path [VALUE ...] (default: Dahoas/rm-static)"));
  CHECK_THAT(u, Contains("--offload (flag)"));
  CHECK_THAT(u, Contains("--output_dir VALUE (default: None)"));
}

TEST_CASE("Python's int(), float() and repr()") {
  CHECK(python_int(" 7 ") == 7);
  CHECK(python_int("+3") == 3);
  CHECK(python_int("-12") == -12);
  CHECK(python_int("1_000") == 1000);
  CHECK(!python_int("1__0"));
  CHECK(!python_int("_1"));
  CHECK(!python_int("1.0"));
  CHECK(!python_int(""));
  CHECK(!python_int("99999999999999999999"));
  CHECK(python_float("1e-3") == 1e-3);
  CHECK(python_float(".5") == 0.5);
  CHECK(python_float("5.") == 5.0);
  CHECK(python_float("1_0.2_5") == 10.25);
  CHECK(std::isinf(*python_float("-Infinity")));
  CHECK(std::isnan(*python_float("nan")));
  CHECK(!python_float("1e"));
  CHECK(!python_float("."));
  CHECK(!python_float("0x10"));
  CHECK(python_repr(0.1) == "0.1");
  CHECK(python_repr(3.0) == "3.0");
  CHECK(python_repr(1e-5) == "1e-05");
  CHECK(python_repr(1e16) == "1e+16");
  CHECK(python_repr(1e15) == "1000000000000000.0");
  CHECK(python_repr(49460.7734375) == "49460.7734375");
  CHECK(python_repr(static_cast<double>(10.808935165405273f)) == "10.808935165405273");
  CHECK(python_repr(INFINITY) == "inf");
}

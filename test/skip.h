// DS_SKIP(message): this test case cannot run here (no GPU, no sshd, no
// namespaces, missing ../shared data...). It prints "SKIP: <message>" and
// returns from the test case; the shared main (test/catch_main.cpp) then exits
// with 77, which ctest (SKIP_RETURN_CODE 77, set by ds_test) reports as
// "skipped", never as passed. A binary that mixes cases that can run with
// cases that may skip registers the latter as their own ctest entries
// (ds_test SPLIT), so a skip never hides a pass.
#pragma once
#include <sstream>
#include <string>

namespace ds::test {

inline constexpr int kSkipExitCode = 77;

void note_skip(const std::string& reason);  // prints the SKIP line and records it
int skip_count();                           // skips recorded in this process

}  // namespace ds::test

#define DS_SKIP(message)                       \
  do {                                         \
    std::ostringstream ds_skip_message_;       \
    ds_skip_message_ << message;               \
    ::ds::test::note_skip(ds_skip_message_.str()); \
    return;                                    \
  } while (0)

// run_main: the exit policy every program shares (dstrain, dsgen, dsprep,
// dsconvert, dsplot and dsrun's own failures): the body's return value on
// success; 1 with one line "PROG: error: ..." for an error the user can fix
// (ds::UserError, or host memory running out: std::bad_alloc); 2 with
// "PROG: internal error: ..." for anything else (a bug). Command-line parse
// errors are the apps' own (CLI11 prints --help), exit 1 as user errors.
// It also catches SIGXFSZ, so a write past a file size limit (ulimit -f)
// fails with EFBIG and takes the error path that removes temporaries.
#pragma once
#include <functional>

namespace ds {

int run_main(const char* prog, const std::function<int()>& body);

}  // namespace ds

// dsrun: DeepSpeed-runner-compatible launcher (see docs/dsrun.md). All logic lives in launcher/.
#include "launcher/head.h"

int main(int argc, char** argv) { return ds::launch::dsrun_main(argc, argv); }

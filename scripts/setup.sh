#!/usr/bin/env bash
# Installs everything dsrun/dstrain need to build and test, from Debian packages.
# Idempotent: packages already present are skipped by apt-get.
#   scripts/setup.sh          build + test dependencies
#   scripts/setup.sh --bench  also the peers used by bench/ (PyTorch 2.x from PyPI in
#                             .deps/torch-bench, openmpi, hyperfine)
set -euo pipefail

pkgs=(
  # build
  build-essential cmake ninja-build pkg-config
  libcli11-dev nlohmann-json3-dev libfmt-dev catch2 libssh-dev libssl-dev
  libopenblas-dev libgloo-dev
  # oneDNN: the CPU backend's bf16 GEMM source (bench/cpu/bench_gemm_sources measures it)
  libdnnl-dev
  # io_uring for the NVMe offload tier (lib/io), and fio, its bandwidth peer
  liburing-dev fio
  # dsplot's PNG output: librsvg renders the SVG it writes (with cairo), in DejaVu Sans
  librsvg2-dev fonts-dejavu-core
  # SentencePiece tokenizers (tokenizer.model), and spm_train for their tests
  libsentencepiece-dev sentencepiece
  # tests with real components
  openssh-server openssh-client pdsh iproute2 numactl procps
  slurm-wlm munge
  # fuzz targets (fuzz/: clang + libFuzzer with ASan/UBSan)
  clang libclang-rt-dev
  # Hugging Face interop test (transformers loads our export)
  python3-torch python3-numpy python3-pip
)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(openmpi-bin hyperfine python3-venv)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# transformers for the interop test, from PyPI into .deps/python (not a system
# install; numpy is left to Debian's, which torch was built against). Best
# effort: without it, test_hf_interop prints a skip line.
HF_DIR="$(cd "$(dirname "$0")/.." && pwd)/.deps/python"
if ! PYTHONPATH="$HF_DIR" /usr/bin/python3 -c "import transformers" 2>/dev/null; then
  if /usr/bin/python3 -m pip install -q --disable-pip-version-check --break-system-packages \
       --target "$HF_DIR" "transformers==4.36.2" >/dev/null 2>&1; then
    rm -rf "$HF_DIR"/numpy "$HF_DIR"/numpy-* "$HF_DIR"/numpy.libs "$HF_DIR"/bin
  else
    echo "setup: warning: could not install transformers from PyPI; test_hf_interop will skip"
  fi
fi
# TensorBoard's reader for test_tensorboard, from PyPI into its own directory
# (.deps/tensorboard: it brings a numpy that torch's Debian build must not see).
# Best effort: without it, test_tensorboard skips.
TB_DIR="$(cd "$(dirname "$0")/.." && pwd)/.deps/tensorboard"
if ! PYTHONPATH="$TB_DIR" /usr/bin/python3 -c "import tensorboard" 2>/dev/null; then
  /usr/bin/python3 -m pip install -q --disable-pip-version-check --break-system-packages \
      --target "$TB_DIR" "tensorboard==2.21.0" >/dev/null 2>&1 ||
    echo "setup: warning: could not install tensorboard from PyPI; test_tensorboard will skip"
fi
# The reference tokenizers for test_tokenizers_ref (the sentencepiece and
# tokenizers packages, ids compared one by one with ours), from PyPI into
# .deps/tokref. Best effort: without them, test_tokenizers_ref skips.
TOK_DIR="$(cd "$(dirname "$0")/.." && pwd)/.deps/tokref"
if ! PYTHONPATH="$TOK_DIR" /usr/bin/python3 -c "import sentencepiece, tokenizers" 2>/dev/null; then
  /usr/bin/python3 -m pip install -q --disable-pip-version-check --break-system-packages \
      --target "$TOK_DIR" "sentencepiece==0.2.0" "tokenizers==0.20.3" >/dev/null 2>&1 ||
    echo "setup: warning: could not install sentencepiece/tokenizers from PyPI; test_tokenizers_ref will skip"
fi
# transformers' LlamaTokenizer needs sentencepiece and (legacy false) protobuf:
# the reference of test_chat_sft's LLaMA case, from PyPI into .deps/llamaref.
# Best effort: without them, that case skips.
LLAMA_DIR="$(cd "$(dirname "$0")/.." && pwd)/.deps/llamaref"
if ! PYTHONPATH="$LLAMA_DIR" /usr/bin/python3 -c "import sentencepiece, google.protobuf" 2>/dev/null; then
  /usr/bin/python3 -m pip install -q --disable-pip-version-check --break-system-packages \
      --target "$LLAMA_DIR" "sentencepiece==0.2.0" "protobuf==4.25.3" >/dev/null 2>&1 ||
    echo "setup: warning: could not install sentencepiece/protobuf from PyPI; test_chat_sft's LLaMA case will skip"
fi
# The benchmarks' PyTorch peer (bench/train/run.sh): PyTorch 2.x from PyPI in
# its own virtual environment (Debian's python3-torch is 1.13: no SDPA, no
# torch.compile, no CPU bf16 autocast worth measuring).
if [[ "${1:-}" == "--bench" ]]; then
  BENCH_PY="$(cd "$(dirname "$0")/.." && pwd)/.deps/torch-bench"
  if ! "$BENCH_PY/bin/python" -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
    python3 -m venv "$BENCH_PY"
    "$BENCH_PY/bin/pip" install -q --disable-pip-version-check torch numpy
  fi
fi
echo "setup: all dependencies present"

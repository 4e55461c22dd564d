// The CPU backend's op table, registered with the dispatcher
// (lib/ops/op_table.h) by a static initializer before main. Nothing refers to
// this file by name, so programs link ds_cpu whole (the CMake target
// ds_ops_cpu): a plain static link would leave it, and every kernel, out.
#include "lib/cpu/cpu_ops.h"
#include "lib/ops/op_table.h"

namespace ds::cpu {
namespace {

const ops::OpTable kOps = {
    .n_ops = ops::kOpCount,
#define DS_OP_TABLE_ENTRY(name, Args) .name = &::ds::cpu::name,
    DS_OP_LIST(DS_OP_TABLE_ENTRY)
#undef DS_OP_TABLE_ENTRY
    .lowp = {.embedding_forward = &lowp::embedding_forward,
             .matmul_forward = &lowp::matmul_forward,
             .matmul_backward = &lowp::matmul_backward,
             .attention_forward = &lowp::attention_forward,
             .attention_backward = &lowp::attention_backward,
             .kv_attention = &lowp::kv_attention,
             .gelu_forward = &lowp::gelu_forward,
             .gelu_backward = &lowp::gelu_backward,
             .add = &lowp::add,
             .cross_entropy = &lowp::cross_entropy},
    .lowp_description = &lowp::description,
};

const bool kRegistered = (ops::register_cpu_ops(kOps), true);

}  // namespace
}  // namespace ds::cpu

// index.json: which file and offset holds each piece of each logical tensor. Shared by the save plan
// (writing) and Checkpoint (reading), which both insist that a tensor's pieces cover it exactly once.
#pragma once

#include "forge/ckpt/checkpoint.h"
#include "forge/common/error.h"

#include <functional>

#include <map>
#include <string>

namespace forge::ckpt::detail {

inline constexpr uint64_t kPieceAlign = 64;
inline uint64_t align_up(uint64_t x) {
  return (x + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
}

Json index_to_json(const std::map<std::string, TensorEntry>& tensors);
// Parses and checks coverage; errors are forge::Error(code) naming `where`.
std::map<std::string, TensorEntry> index_from_json(const Json& j, const std::string& where);

// Throws forge::Error(code) when the pieces' runs overlap or leave a gap, naming the tensor and the first
// offending element; `who(i)` describes piece i ("rank 3") for the message.
void check_coverage(const TensorEntry& t, ExitCode code, const std::function<std::string(size_t)>& who);

}  // namespace forge::ckpt::detail

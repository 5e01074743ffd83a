// Whole files written so that a reader, or a crash, finds the old file or
// the new one, never part of one: the bytes go to a temporary file beside
// the target (the same filesystem), which is synced, renamed over the
// target, and the directory synced so that the rename lasts. What the RL
// stack keeps on disk goes through it: checkpoints' safetensors and
// manifests, the run report.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

#include "troupe/status.h"

namespace troupe::rl::io {

/// Writes the concatenation of `pieces` to `path` atomically and durably
/// (above). On failure nothing is left beside the target and the target
/// is as it was, except where the rename succeeded and only the directory's
/// sync failed (said so). Errors: ErrorCode::storage, the message "<errno
/// text> (<what was being done>)" for the caller to put in its context.
/// Thread-safe: two writers of one path never share a temporary file.
Status write_atomically(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces);

/// The same for one piece of text.
Status write_atomically(const std::filesystem::path& path, std::string_view text);

}  // namespace troupe::rl::io

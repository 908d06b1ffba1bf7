// The identity of a shared KV tier's folder, so that a router can tell which replicas read the same blocks.
//
// Every replica that mounts the same shared directory (one machine, or NFS, CephFS, a bucket mount across
// machines, where paths and inode numbers differ) finds the same file `<folder>/.tier-id` holding a random
// non-zero 64-bit id in hex. The first replica creates it: written under a temporary name and linked into
// place, which fails when another replica got there first (then its id is read), so racing replicas agree.
// The folder is `dir/<compat>` (block_file.h), so replicas whose blocks are not interchangeable (another
// model, dtype or backend) never share an id. Replicas advertise it in their KV events' config event
// (Contract 2, `shared_tier`).
// Thread-safety: a free function; any thread.
#pragma once

#include <cstdint>
#include <filesystem>

namespace kvfleet::kvtier {

// The folder's id, created if missing; 0 when the file can be neither read nor created (the tier then has no
// identity: routers do not count its blocks for other replicas).
std::uint64_t folder_identity(const std::filesystem::path& folder);

}  // namespace kvfleet::kvtier

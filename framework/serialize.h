// A versioned binary format for named tensors, and through it for modules.
//
// Layout of format version 1 (all integers little-endian):
//
//   offset  size  field
//   0       8     magic "STILLPT1"
//   8       4     format version, uint32 (= 1)
//   12      8     total length in bytes of the whole record, uint64,
//                 including the magic and the checksum
//   20      8     entry count, uint64
//   28      ...   entries, each:
//                   uint32  name length L (1 <= L <= kMaxTensorNameLength)
//                   L       name bytes (UTF-8, not terminated)
//                   uint8   dtype: 1 = float32, 2 = float64
//                   uint32  rank r (0 <= r <= 4)
//                   r x int64 extents, outermost first (>= 0)
//                   numel * sizeof(dtype) bytes of row-major IEEE-754 values,
//                   little-endian
//   end-8   8     checksum, uint64: FNV-1a 64 over every byte before it
//
// The total length comes first so that (1) a truncated file is reported as
// truncated rather than as a confusing parse error, (2) the checksum can be
// verified before any entry is trusted, and (3) a record embedded in a larger
// stream (a checkpoint) can be read without knowing what follows it.
//
// Every reader failure is a stillpoint::Error whose message names the source
// (the file path, or the name passed to the in-memory readers) and says what
// is wrong: missing file, truncated, wrong magic, unsupported version,
// checksum mismatch, or an impossible rank, extent, name or count.
//
// Files are written atomically: the bytes go to `path + ".tmp"`, are flushed
// to disk, and the temporary is renamed over `path`. A crash or an error
// therefore never leaves a half-written file at `path` and never damages an
// existing one (a stale ".tmp" may remain after a crash, and is overwritten
// by the next save).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "framework/module.h"
#include "framework/tensor.h"

namespace stillpoint {

inline constexpr char kTensorFileMagic[] = "STILLPT1";  // 8 bytes, no terminator stored
inline constexpr uint32_t kTensorFormatVersion = 1;
inline constexpr uint32_t kMaxTensorNameLength = 4096;

// ---- files

// Writes tensors to path atomically (see above). Names must be non-empty,
// unique and at most kMaxTensorNameLength bytes; every tensor must be
// defined. Throws an Error naming path if it cannot be written.
void SaveTensors(const std::string& path, const NamedTensors& tensors);
// Reads a file written by SaveTensors, in the stored order.
NamedTensors LoadTensors(const std::string& path);

// Saves module.NamedValues(); loads with Module::LoadParameters (strict:
// names and shapes must match; float32/float64 are converted). On a mismatch
// the module is unchanged and the error names the file.
void SaveModule(const std::string& path, const Module& module);
void LoadModule(const std::string& path, Module* module);

// ---- bytes and streams (for embedding in checkpoints)

std::string SerializeTensors(const NamedTensors& tensors);
// Parses exactly one record that fills all of bytes (trailing bytes are an
// error). source_name_for_errors appears in every error message.
NamedTensors DeserializeTensors(const std::string& bytes,
                                const std::string& source_name_for_errors);

// Appends one record to out; throws if the stream fails.
void WriteTensors(std::ostream& out, const NamedTensors& tensors);
// Reads one record from in, consuming exactly its bytes (so records can be
// followed by other data).
NamedTensors ReadTensors(std::istream& in, const std::string& source_name_for_errors);

std::string SerializeModule(const Module& module);
void DeserializeModule(const std::string& bytes,
                       const std::string& source_name_for_errors,
                       Module* module);

// ---- helpers shared with checkpoint writers

// Writes bytes to TemporaryPathFor(path), flushes it to disk (fsync) and
// renames it over path. On failure removes the temporary it created and
// throws an Error naming path and the system's reason; an existing file at
// path is left untouched. Refuses (Error) when path is a device node, FIFO
// or socket (a directory fails at the rename): only a regular file or a
// symlink (the link itself) is replaced.
void WriteFileAtomically(const std::string& path, const std::string& bytes);
// The temporary WriteFileAtomically writes first: path + ".tmp.<pid>",
// unique to the writing process.
std::string TemporaryPathFor(const std::string& path);
// A cap on the bytes one reader takes from one file (after decompression),
// so an endless or huge input (/dev/zero, a FIFO, a gzip bomb) is an Error
// naming the file and the cap instead of std::bad_alloc. `raised_by` names
// the config key or flag that raises the cap, for the message ("" when
// nothing does). Every reader of user files takes one: data files read
// through ReadFileMaybeGzip (training/data/dataset.h) with the limit of
// task.max_file_mib (DataReadLimit, training/data/dataset_registry.h).
struct ReadLimit {
  static constexpr uint64_t kDefaultMaxMib = 1024;
  uint64_t max_bytes = kDefaultMaxMib << 20;
  std::string raised_by;
};
// Throws the Error of a file beyond its limit: "PATH: more than N MiB (the
// cap of KEY; raise KEY to read it)".
[[noreturn]] void ThrowReadLimitExceeded(const std::string& path, const ReadLimit& limit);

// The whole content of a file; throws an Error naming path if it cannot be
// opened or read, or holds more than limit.max_bytes.
std::string ReadFileBytes(const std::string& path, const ReadLimit& limit = ReadLimit());
// At most the first `count` bytes of a file (fewer if it is shorter); for
// readers that check a header before they take the rest.
std::string ReadFilePrefix(const std::string& path, std::size_t count);

// 64-bit FNV-1a. Pass a previous result as `hash` to continue over more bytes.
inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;
uint64_t Fnv1a64(const void* data, std::size_t size, uint64_t hash = kFnv1a64Offset);

}  // namespace stillpoint

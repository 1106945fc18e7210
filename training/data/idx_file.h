// IDX files, the format of the MNIST family (Fashion-MNIST's
// train-images-idx3-ubyte.gz and friends): a 4-byte magic number (two zero
// bytes, a type code, the number of dimensions), one big-endian uint32 per
// dimension, then the values in row-major order.
//
// Only unsigned-byte arrays (type code 0x08) are read: that is what the
// image and label files hold. Everything a header promises is checked: the
// magic number, the number of dimensions the caller expects, each dimension
// positive, and the data exactly as long as the dimensions say (a truncated
// file or one with trailing bytes is an error). Errors name the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "framework/serialize.h"  // ReadLimit

namespace stillpoint {

struct IdxArray {
  std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
  std::vector<uint8_t> values;  // product(dims) bytes, row-major
};

// The largest array ReadIdxFile accepts by default: Fashion-MNIST's
// training images are 47 MB.
constexpr int64_t kMaxIdxBytes = int64_t{1} << 28;

// Parses the bytes of an IDX file (already decompressed). `name` names the
// file in errors; `expected_dims` > 0 requires that many dimensions;
// `max_bytes` bounds the data a header may promise. Throws stillpoint::Error.
IdxArray ParseIdx(std::string_view bytes, const std::string& name, int expected_dims,
                  int64_t max_bytes = kMaxIdxBytes);

// Reads and parses an IDX file, plain or gzip-compressed: at most
// limit.max_bytes (decompressed; task.max_file_mib for a task's files), and
// no header may promise more data than that.
IdxArray ReadIdxFile(const std::string& path, int expected_dims,
                     const ReadLimit& limit = ReadLimit());

}  // namespace stillpoint

#include "training/data/idx_file.h"

#include <algorithm>
#include <cstdint>

#include "framework/check.h"
#include "training/data/dataset.h"

namespace stillpoint {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;

uint32_t BigEndian32(std::string_view bytes, std::size_t offset) {
  uint32_t value = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    value = (value << 8) | static_cast<uint8_t>(bytes[offset + i]);
  }
  return value;
}

}  // namespace

IdxArray ParseIdx(std::string_view bytes, const std::string& name, int expected_dims,
                  int64_t max_bytes) {
  SP_CHECK(bytes.size() >= 4, name, ": not an IDX file: ", bytes.size(),
           " bytes, shorter than the 4-byte magic number");
  const uint8_t type = static_cast<uint8_t>(bytes[2]);
  const int rank = static_cast<uint8_t>(bytes[3]);
  SP_CHECK(bytes[0] == 0 && bytes[1] == 0 && type == kUnsignedByte && rank >= 1, name,
           ": not an IDX file of unsigned bytes: magic number 0x",
           [&] {
             static const char* digits = "0123456789abcdef";
             std::string hex;
             for (int i = 0; i < 4; ++i) {
               const uint8_t b = static_cast<uint8_t>(bytes[i]);
               hex += digits[b >> 4];
               hex += digits[b & 15];
             }
             return hex;
           }(),
           " (expected 0x000008NN, NN the number of dimensions)");
  SP_CHECK(expected_dims <= 0 || rank == expected_dims, name, ": an IDX array of ", rank,
           " dimensions, expected ", expected_dims);
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  SP_CHECK(bytes.size() >= header, name, ": truncated: the header of ", rank,
           " dimensions needs ", header, " bytes, the file has ", bytes.size());
  IdxArray array;
  int64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    const int64_t dim = BigEndian32(bytes, 4 + 4 * static_cast<std::size_t>(d));
    SP_CHECK(dim >= 1, name, ": dimension ", d, " is 0");
    SP_CHECK(dim <= max_bytes / count, name, ": the header promises more than ", max_bytes,
             " bytes of data (dimensions so far ", count, " x ", dim, ")");
    count *= dim;
    array.dims.push_back(dim);
  }
  const int64_t data = static_cast<int64_t>(bytes.size() - header);
  SP_CHECK(data >= count, name, ": truncated: the header promises ", count,
           " bytes of data, the file has ", data);
  SP_CHECK(data == count, name, ": ", data - count,
           " bytes after the data the header promises (", count, " bytes)");
  array.values.assign(reinterpret_cast<const uint8_t*>(bytes.data()) + header,
                      reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size());
  return array;
}

IdxArray ReadIdxFile(const std::string& path, int expected_dims, const ReadLimit& limit) {
  const std::string bytes = ReadFileMaybeGzip(path, limit);
  return ParseIdx(bytes, path, expected_dims,
                  static_cast<int64_t>(std::min<uint64_t>(limit.max_bytes, INT64_MAX)));
}

}  // namespace stillpoint

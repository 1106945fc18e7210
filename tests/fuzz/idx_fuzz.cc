// Fuzzes the IDX reader (Fashion-MNIST's files, training/data/idx_file.h) and
// the patch tokens made from what it reads: any content either parses into
// an array exactly as long as its header says, or is an Error. Inputs that
// start with the gzip magic go through the file reader, so truncated and
// corrupted gzip streams are covered too.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "framework/check.h"
#include "training/data/fashion_mnist_reader.h"
#include "training/data/idx_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stillpoint;
  static const std::string path =
      (std::filesystem::temp_directory_path() /
       ("stillpoint_idx_fuzz_" + std::to_string(static_cast<long>(::getpid())) + ".idx"))
          .string();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // Small caps keep each input fast: a header may promise at most 1 MiB.
  constexpr int64_t kCap = 1 << 20;
  for (int dims : {0, 1, 3}) {
    try {
      const IdxArray array = ParseIdx(bytes, "fuzz", dims, kCap);
      int64_t count = 1;
      for (int64_t d : array.dims) count *= d;
      if (count != static_cast<int64_t>(array.values.size())) std::abort();
      if (array.dims.size() == 3) {
        const IdxArray labels{{array.dims[0]}, std::vector<uint8_t>(array.dims[0], 1)};
        try {
          PatchImages(array, labels, 2, 4, "fuzz");
        } catch (const Error&) {
        }
      }
    } catch (const Error&) {
    }
  }
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(size));
    }
    try {
      ReadLimit limit;
      limit.max_bytes = static_cast<uint64_t>(kCap);
      ReadIdxFile(path, 0, limit);
    } catch (const Error&) {
    }
  }
  return 0;
}

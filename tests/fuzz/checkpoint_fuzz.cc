// Fuzzes the checkpoint reader: any bytes either load or are an Error.
// Each input is read from memory and from a file (LoadCheckpoint, which
// checks the header before it reads the rest), as given (mostly stopped by
// the length and checksum checks), and from memory again with its length
// field and checksum made right, so the metadata and tensor records behind
// them are reached too.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "framework/serialize.h"
#include "training/checkpoint.h"

namespace {

void Read(const std::string& bytes) {
  try {
    stillpoint::DeserializeCheckpoint(bytes, "fuzz.ckpt");
  } catch (const stillpoint::Error&) {
  }
}

// The file reader too: it checks the header and reads only the length the
// header states (LoadCheckpoint).
void Load(const std::string& bytes) {
  static const std::string path =
      (std::filesystem::temp_directory_path() /
       ("stillpoint_ckpt_fuzz_" + std::to_string(static_cast<long>(::getpid())) + ".ckpt"))
          .string();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    stillpoint::LoadCheckpoint(path);
  } catch (const stillpoint::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  Read(bytes);
  Load(bytes);
  // Header: magic (8), version (4), total length (8), metadata length (4).
  if (bytes.size() >= 24) {
    const uint64_t total = bytes.size() + 8;
    for (int i = 0; i < 8; ++i) bytes[12 + i] = static_cast<char>((total >> (8 * i)) & 0xff);
    const uint64_t checksum = stillpoint::Fnv1a64(bytes.data(), bytes.size());
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((checksum >> (8 * i)) & 0xff));
    Read(bytes);
  }
  return 0;
}

// Fuzzes the CSV and gzip readers (training datasets, retrieval matrices):
// any file content either loads or is an Error. Inputs that start with the
// gzip magic are decompressed first, so truncated and corrupted streams are
// covered along with the CSV they hold; one reading is under a 4 KiB cap.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "training/data/dataset.h"
#include "training/retrieve.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stillpoint;
  static const std::string path =
      (std::filesystem::temp_directory_path() /
       ("stillpoint_csv_fuzz_" + std::to_string(static_cast<long>(::getpid())) + ".csv"))
          .string();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  // The same content under a small size cap too, so a (decompressed)
  // stream crossing the cap reaches ReadFileMaybeGzip's refusal.
  ReadLimit small;
  small.max_bytes = 4096;
  small.raised_by = "task.max_file_mib";
  const CsvDatasetOptions token_ids{path, 2, 0, 4, 4};
  const CsvDatasetOptions features{path, 2, 1, 0, 4};
  const CsvDatasetOptions capped{path, 2, 0, 4, 4, small};
  for (const CsvDatasetOptions& options : {token_ids, features, capped}) {
    try {
      LoadCsvDataset(options);
    } catch (const Error&) {
    }
  }
  for (const DType dtype : {DType::kFloat32, DType::kFloat64}) {
    try {
      ReadCsvMatrix(path, dtype);
    } catch (const Error&) {
    }
  }
  return 0;
}

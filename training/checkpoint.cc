#include "training/checkpoint.h"

#include <yaml-cpp/yaml.h>

#include <cstring>
#include <sstream>

#include "framework/serialize.h"

namespace stillpoint {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'I', 'L', 'L', 'C', 'K', 'P'};
// magic + version + total length + metadata length.
constexpr std::size_t kHeaderSize = 8 + 4 + 8 + 4;
constexpr std::size_t kChecksumSize = 8;
// The most a checkpoint's length field may state (1 TiB): beyond, the field
// is damaged, and reading that much from a FIFO would not end.
constexpr uint64_t kMaxCheckpointBytes = uint64_t{1} << 40;

void Append(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t Read(const std::string& bytes, std::size_t offset, int count) {
  uint64_t value = 0;
  for (int i = 0; i < count; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

}  // namespace

std::string SerializeCheckpoint(const CheckpointState& state) {
  YAML::Emitter meta;
  meta << YAML::BeginMap << YAML::Key << "step" << YAML::Value << state.step << YAML::Key
       << "data_epoch" << YAML::Value << state.data_epoch << YAML::Key << "data_offset"
       << YAML::Value << state.data_offset << YAML::Key << "rng_state" << YAML::Value
       << state.rng_state;
  if (!state.random_streams.empty()) {
    meta << YAML::Key << "random_streams" << YAML::Value << YAML::BeginMap;
    for (const auto& [name, stream] : state.random_streams) {
      meta << YAML::Key << name << YAML::Value << stream;
    }
    meta << YAML::EndMap;
  }
  meta << YAML::Key << "config" << YAML::Value << YAML::Literal << state.config_yaml
       << YAML::EndMap;
  const std::string meta_text = meta.c_str();
  const std::string model = SerializeTensors(state.model);
  const std::string optimizer = SerializeTensors(state.optimizer);
  const std::string solver_state = SerializeTensors(state.solver_state);
  const uint64_t total = kHeaderSize + meta_text.size() + model.size() + optimizer.size() +
                         solver_state.size() + kChecksumSize;
  std::string bytes(kMagic, sizeof(kMagic));
  Append(&bytes, kCheckpointFormatVersion, 4);
  Append(&bytes, total, 8);
  Append(&bytes, meta_text.size(), 4);
  bytes += meta_text;
  bytes += model;
  bytes += optimizer;
  bytes += solver_state;
  Append(&bytes, Fnv1a64(bytes.data(), bytes.size()), 8);
  return bytes;
}

CheckpointState DeserializeCheckpoint(const std::string& bytes, const std::string& source) {
  auto fail = [&](const std::string& what) {
    throw Error("checkpoint '" + source + "': " + what);
  };
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    fail("not a stillpoint checkpoint (wrong magic)");
  }
  if (bytes.size() < kHeaderSize + kChecksumSize) fail("truncated (header incomplete)");
  const uint64_t version = Read(bytes, 8, 4);
  if (version != 1 && version != kCheckpointFormatVersion) {
    fail("unsupported format version " + std::to_string(version) + " (this build reads " +
         std::to_string(kCheckpointFormatVersion) + ")");
  }
  const uint64_t total = Read(bytes, 12, 8);
  if (bytes.size() < total) {
    fail("truncated: " + std::to_string(bytes.size()) + " of " + std::to_string(total) +
         " bytes present");
  }
  if (bytes.size() > total) fail("has trailing bytes after the checksum");
  const uint64_t stored = Read(bytes, total - kChecksumSize, 8);
  if (Fnv1a64(bytes.data(), total - kChecksumSize) != stored) {
    fail("checksum mismatch: the file is corrupted");
  }
  const uint64_t meta_length = Read(bytes, 20, 4);
  if (kHeaderSize + meta_length > total - kChecksumSize) fail("corrupted metadata length");
  CheckpointState state;
  try {
    YAML::Node meta = YAML::Load(bytes.substr(kHeaderSize, meta_length));
    state.step = meta["step"].as<int64_t>();
    state.data_epoch = meta["data_epoch"].as<int64_t>();
    state.data_offset = meta["data_offset"].as<int64_t>();
    state.rng_state = meta["rng_state"].as<std::string>();
    state.config_yaml = meta["config"].as<std::string>();
    if (const YAML::Node streams = meta["random_streams"]) {
      for (auto it = streams.begin(); it != streams.end(); ++it) {
        state.random_streams[it->first.as<std::string>()] = it->second.as<std::string>();
      }
    }
  } catch (const YAML::Exception& e) {
    fail(std::string("unreadable metadata: ") + e.what());
  }
  // Checksummed, yet written by something else or edited: a count below 0
  // would be logged as "step -5/20" and trained from.
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"step", state.step},
                                    {"data_epoch", state.data_epoch},
                                    {"data_offset", state.data_offset}}) {
    if (value < 0) fail(std::string("metadata: ") + name + " is " + std::to_string(value) +
                        ", below 0; the file was not written by stillpoint train");
  }
  std::istringstream records(bytes.substr(kHeaderSize + meta_length,
                                          total - kChecksumSize - kHeaderSize - meta_length));
  state.model = ReadTensors(records, source + " (model)");
  state.optimizer = ReadTensors(records, source + " (optimizer)");
  if (version >= 2) state.solver_state = ReadTensors(records, source + " (solver state)");
  return state;
}

void SaveCheckpoint(const std::string& path, const CheckpointState& state) {
  WriteFileAtomically(path, SerializeCheckpoint(state));
}

CheckpointState LoadCheckpoint(const std::string& path) {
  // The header first: any other file (/dev/zero, a FIFO, a dataset given by
  // mistake) fails at its magic without being read whole, and the length
  // the header states bounds what is read (one byte more tells trailing
  // bytes apart).
  const std::string header = ReadFilePrefix(path, kHeaderSize);
  if (header.size() < kHeaderSize || std::memcmp(header.data(), kMagic, 8) != 0) {
    DeserializeCheckpoint(header, path);  // throws: wrong magic or truncated
  }
  const uint64_t total = Read(header, 12, 8);
  if (total < kHeaderSize + kChecksumSize || total > kMaxCheckpointBytes) {
    throw Error("checkpoint '" + path + "': corrupted length field (" + std::to_string(total) +
                " bytes)");
  }
  return DeserializeCheckpoint(ReadFilePrefix(path, static_cast<std::size_t>(total) + 1), path);
}

}  // namespace stillpoint

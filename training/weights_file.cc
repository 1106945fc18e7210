#include "training/weights_file.h"

#include <yaml-cpp/yaml.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "framework/serialize.h"
#include "training/config/config.h"
#include "training/metrics.h"

namespace stillpoint {
namespace {

static_assert(sizeof(float) == 4 && sizeof(double) == 8);

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The tensor's values as little-endian bytes of its own dtype (x86 and
// ARM64 are little-endian).
std::string RawBytes(const Tensor& tensor) {
  const std::vector<double> values = tensor.ToVector();
  std::string bytes;
  if (tensor.dtype() == DType::kFloat32) {
    bytes.resize(values.size() * 4);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float v = static_cast<float>(values[i]);
      std::memcpy(&bytes[4 * i], &v, 4);
    }
  } else {
    bytes.resize(values.size() * 8);
    std::memcpy(bytes.data(), values.data(), bytes.size());
  }
  return bytes;
}

Tensor FromRaw(const std::string& path, const std::string& name, const std::vector<int64_t>& dims,
               DType dtype, const char* data, std::size_t size) {
  int64_t numel = 1;
  for (int64_t d : dims) numel *= d;
  const std::size_t width = dtype == DType::kFloat32 ? 4 : 8;
  if (static_cast<std::size_t>(numel) * width != size) {
    throw ConfigError(path + ": tensor '" + name + "' holds " + std::to_string(size) +
                      " bytes, its shape needs " + std::to_string(numel * width));
  }
  std::vector<double> values(static_cast<std::size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    if (dtype == DType::kFloat32) {
      float v;
      std::memcpy(&v, data + 4 * i, 4);
      values[i] = v;
    } else {
      std::memcpy(&values[i], data + 8 * i, 8);
    }
  }
  return Tensor::FromVector(Shape(dims), values, dtype);
}

void PutU16(std::string* out, uint32_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>((v >> 8) & 0xff));
}
void PutU32(std::string* out, uint32_t v) {
  PutU16(out, v & 0xffff);
  PutU16(out, v >> 16);
}
uint32_t GetU16(const std::string& s, std::size_t at) {
  return static_cast<uint8_t>(s[at]) | (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 1])) << 8);
}
uint32_t GetU32(const std::string& s, std::size_t at) {
  return GetU16(s, at) | (GetU16(s, at + 2) << 16);
}

std::string NpyBytes(const Tensor& tensor) {
  std::string shape = "(";
  for (int i = 0; i < tensor.shape().rank(); ++i) {
    shape += std::to_string(tensor.shape().dim(i)) + (tensor.shape().rank() == 1 ? "," : "");
    if (i + 1 < tensor.shape().rank()) shape += ", ";
  }
  shape += ")";
  std::string header = std::string("{'descr': '") +
                       (tensor.dtype() == DType::kFloat32 ? "<f4" : "<f8") +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a
  // multiple of 64 bytes and ended by a newline.
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  PutU16(&out, static_cast<uint32_t>(header.size()));
  return out + header + RawBytes(tensor);
}

Tensor ParseNpy(const std::string& path, const std::string& name, const std::string& npy) {
  if (npy.size() < 10 || npy.compare(0, 6, "\x93NUMPY") != 0) {
    throw ConfigError(path + ": entry '" + name + ".npy' is not a .npy array");
  }
  const int major = static_cast<uint8_t>(npy[6]);
  const std::size_t length = major == 1 ? GetU16(npy, 8) : GetU32(npy, 8);
  const std::size_t start = major == 1 ? 10 : 12;
  if (start + length > npy.size()) throw ConfigError(path + ": '" + name + ".npy' is cut short");
  const std::string header = npy.substr(start, length);
  DType dtype;
  if (header.find("'<f4'") != std::string::npos) {
    dtype = DType::kFloat32;
  } else if (header.find("'<f8'") != std::string::npos) {
    dtype = DType::kFloat64;
  } else {
    throw ConfigError(path + ": '" + name + ".npy' is not float32 or float64 little-endian (" +
                      header + ")");
  }
  if (header.find("'fortran_order': True") != std::string::npos) {
    throw ConfigError(path + ": '" + name + ".npy' is in Fortran order; save it in C order");
  }
  const std::size_t open = header.find('(', header.find("'shape'"));
  const std::size_t close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos) {
    throw ConfigError(path + ": '" + name + ".npy' has no shape");
  }
  std::vector<int64_t> dims;
  std::stringstream shape(header.substr(open + 1, close - open - 1));
  std::string item;
  while (std::getline(shape, item, ',')) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    dims.push_back(std::stoll(item));
  }
  return FromRaw(path, name, dims, dtype, npy.data() + start + length,
                 npy.size() - start - length);
}

std::string Inflate(const std::string& path, const std::string& data, std::size_t size) {
  std::string out(size, '\0');
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) throw ConfigError(path + ": zlib init failed");
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  stream.avail_in = static_cast<uInt>(data.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  const int status = inflate(&stream, Z_FINISH);
  inflateEnd(&stream);
  if (status != Z_STREAM_END) throw ConfigError(path + ": a compressed entry does not inflate");
  return out;
}

NamedTensors ReadNpz(const std::string& path, const std::string& zip) {
  // The end-of-central-directory record, searched from the end (it may be
  // followed by a comment).
  std::size_t end = std::string::npos;
  for (std::size_t at = zip.size() >= 22 ? zip.size() - 22 : 0;; --at) {
    if (GetU32(zip, at) == 0x06054b50) {
      end = at;
      break;
    }
    if (at == 0 || zip.size() - at > 22 + 65535) break;
  }
  if (zip.size() < 22 || end == std::string::npos) {
    throw ConfigError(path + ": not a zip archive (.npz)");
  }
  const uint32_t entries = GetU16(zip, end + 10);
  std::size_t at = GetU32(zip, end + 16);
  NamedTensors tensors;
  for (uint32_t k = 0; k < entries; ++k) {
    if (at + 46 > zip.size() || GetU32(zip, at) != 0x02014b50) {
      throw ConfigError(path + ": damaged zip central directory");
    }
    const uint32_t method = GetU16(zip, at + 10);
    const uint32_t compressed = GetU32(zip, at + 20), size = GetU32(zip, at + 24);
    const uint32_t name_length = GetU16(zip, at + 28), extra = GetU16(zip, at + 30),
                   comment = GetU16(zip, at + 32), local = GetU32(zip, at + 42);
    std::string name = zip.substr(at + 46, name_length);
    at += 46 + name_length + extra + comment;
    if (local + 30 > zip.size() || GetU32(zip, local) != 0x04034b50) {
      throw ConfigError(path + ": damaged zip entry '" + name + "'");
    }
    const std::size_t data = local + 30 + GetU16(zip, local + 26) + GetU16(zip, local + 28);
    if (data + compressed > zip.size()) throw ConfigError(path + ": '" + name + "' is cut short");
    if (EndsWith(name, ".npy")) name.resize(name.size() - 4);
    std::string npy = zip.substr(data, compressed);
    if (method == 8) {
      npy = Inflate(path, npy, size);
    } else if (method != 0) {
      throw ConfigError(path + ": entry '" + name + "' uses zip method " + std::to_string(method) +
                        " (stored and deflated are read)");
    }
    tensors.emplace_back(name, ParseNpy(path, name, npy));
  }
  return tensors;
}

NamedTensors ReadSafetensors(const std::string& path, const std::string& bytes) {
  if (bytes.size() < 8) throw ConfigError(path + ": too short for safetensors");
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > bytes.size() - 8) throw ConfigError(path + ": header is cut short");
  YAML::Node header;
  try {
    header = YAML::Load(bytes.substr(8, header_size));
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ": malformed safetensors header (" + e.msg + ")");
  }
  const std::size_t base = 8 + header_size;
  NamedTensors tensors;
  for (const auto& entry : header) {
    const std::string name = entry.first.as<std::string>();
    if (name == "__metadata__") continue;
    const std::string dtype_name = entry.second["dtype"].as<std::string>();
    DType dtype;
    if (dtype_name == "F32") {
      dtype = DType::kFloat32;
    } else if (dtype_name == "F64") {
      dtype = DType::kFloat64;
    } else {
      throw ConfigError(path + ": tensor '" + name + "' is " + dtype_name +
                        " (F32 and F64 are read)");
    }
    std::vector<int64_t> dims;
    for (const auto& d : entry.second["shape"]) dims.push_back(d.as<int64_t>());
    const uint64_t begin = entry.second["data_offsets"][0].as<uint64_t>();
    const uint64_t stop = entry.second["data_offsets"][1].as<uint64_t>();
    if (begin > stop || base + stop > bytes.size()) {
      throw ConfigError(path + ": tensor '" + name + "' lies outside the file");
    }
    tensors.emplace_back(name, FromRaw(path, name, dims, dtype, bytes.data() + base + begin,
                                       stop - begin));
  }
  return tensors;
}

}  // namespace

void WriteSafetensors(const std::string& path, const NamedTensors& tensors) {
  std::string header = "{\"__metadata__\": {\"format\": \"pt\"}";
  std::string data;
  for (const auto& [name, tensor] : tensors) {
    const std::string bytes = RawBytes(tensor);
    header += ", " + JsonString(name) + ": {\"dtype\": \"" +
              (tensor.dtype() == DType::kFloat32 ? "F32" : "F64") + "\", \"shape\": [";
    for (int i = 0; i < tensor.shape().rank(); ++i) {
      header += (i ? ", " : "") + std::to_string(tensor.shape().dim(i));
    }
    header += "], \"data_offsets\": [" + std::to_string(data.size()) + ", " +
              std::to_string(data.size() + bytes.size()) + "]}";
    data += bytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const uint64_t size = header.size();
  std::memcpy(out.data(), &size, 8);
  WriteFileAtomically(path, out + header + data);
}

void WriteNpz(const std::string& path, const NamedTensors& tensors) {
  std::string zip, central;
  for (const auto& [name, tensor] : tensors) {
    const std::string file = name + ".npy";
    const std::string npy = NpyBytes(tensor);
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(npy.data()), static_cast<uInt>(npy.size())));
    const uint32_t offset = static_cast<uint32_t>(zip.size());
    auto common = [&](std::string* out) {
      PutU16(out, 20);  // version needed: 2.0
      PutU16(out, 0);   // flags
      PutU16(out, 0);   // stored
      PutU16(out, 0);   // time
      PutU16(out, 0x21);  // date: 1980-01-01
      PutU32(out, crc);
      PutU32(out, static_cast<uint32_t>(npy.size()));
      PutU32(out, static_cast<uint32_t>(npy.size()));
      PutU16(out, static_cast<uint32_t>(file.size()));
      PutU16(out, 0);  // extra field length
    };
    PutU32(&zip, 0x04034b50);
    common(&zip);
    zip += file + npy;
    PutU32(&central, 0x02014b50);
    PutU16(&central, 20);  // made by
    common(&central);
    PutU16(&central, 0);  // comment length
    PutU16(&central, 0);  // disk
    PutU16(&central, 0);  // internal attributes
    PutU32(&central, 0);  // external attributes
    PutU32(&central, offset);
    central += file;
  }
  const uint32_t central_offset = static_cast<uint32_t>(zip.size());
  zip += central;
  PutU32(&zip, 0x06054b50);
  PutU16(&zip, 0);
  PutU16(&zip, 0);
  PutU16(&zip, static_cast<uint32_t>(tensors.size()));
  PutU16(&zip, static_cast<uint32_t>(tensors.size()));
  PutU32(&zip, static_cast<uint32_t>(central.size()));
  PutU32(&zip, central_offset);
  PutU16(&zip, 0);
  WriteFileAtomically(path, zip);
}

NamedTensors ReadWeightsFile(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw ConfigError("cannot open weights file '" + path + "'");
  }
  const std::string bytes = ReadFileBytes(path);
  try {
    if (EndsWith(path, ".safetensors")) return ReadSafetensors(path, bytes);
    if (EndsWith(path, ".npz")) return ReadNpz(path, bytes);
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ": malformed (" + e.msg + ")");
  } catch (const std::invalid_argument&) {
    throw ConfigError(path + ": malformed shape");
  }
  throw ConfigError("weights file '" + path + "': expected a .safetensors or .npz file");
}

}  // namespace stillpoint

#include "framework/serialize.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <istream>
#include <limits>
#include <ostream>
#include <set>
#include <sstream>

namespace stillpoint {
namespace {

constexpr std::size_t kMagicSize = 8;
// magic + version + total length
constexpr std::size_t kPrefixSize = kMagicSize + 4 + 8;
// prefix + entry count
constexpr std::size_t kHeaderSize = kPrefixSize + 8;
constexpr std::size_t kChecksumSize = 8;
constexpr std::size_t kMinRecordSize = kHeaderSize + kChecksumSize;
// name length + 1-byte name + dtype + rank: the smallest possible entry.
constexpr std::size_t kMinEntrySize = 4 + 1 + 1 + 4;
constexpr std::size_t kLengthOffset = kMagicSize + 4;

constexpr uint8_t kDTypeCodeFloat32 = 1;
constexpr uint8_t kDTypeCodeFloat64 = 2;

uint8_t DTypeCode(DType dtype) {
  return dtype == DType::kFloat64 ? kDTypeCodeFloat64 : kDTypeCodeFloat32;
}

// ---------------------------------------------------------------- encoding

void AppendLittleEndian(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t ReadLittleEndian(const unsigned char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

// Copies count elements of element_size bytes, reversing each element's bytes
// on a big-endian host (the format is little-endian).
void CopyLittleEndian(void* destination,
                      const void* source,
                      std::size_t count,
                      std::size_t element_size) {
  if (count == 0) return;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(destination, source, count * element_size);
  } else {
    const auto* in = static_cast<const unsigned char*>(source);
    auto* out = static_cast<unsigned char*>(destination);
    for (std::size_t i = 0; i < count; ++i) {
      for (std::size_t b = 0; b < element_size; ++b) {
        out[i * element_size + b] = in[i * element_size + element_size - 1 - b];
      }
    }
  }
}

std::string Hex(uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(16) << std::setfill('0') << value;
  return out.str();
}

// Bytes shown as text, with non-printable ones escaped, for "found ..." messages.
std::string Printable(const unsigned char* data, std::size_t size) {
  std::ostringstream out;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] >= 0x20 && data[i] < 0x7f && data[i] != '\\' && data[i] != '"') {
      out << static_cast<char>(data[i]);
    } else {
      out << "\\x" << std::hex << std::setw(2) << std::setfill('0') << static_cast<int>(data[i])
          << std::dec;
    }
  }
  return out.str();
}

void CheckEntries(const NamedTensors& tensors, const char* op) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, tensor] = tensors[i];
    SP_CHECK(!name.empty(), op, ": tensor ", i, " has an empty name");
    SP_CHECK(name.size() <= kMaxTensorNameLength, op, ": tensor ", i, " has a name of ",
             name.size(), " bytes (the limit is ", kMaxTensorNameLength, ")");
    SP_CHECK(names.insert(name).second, op, ": the name '", name, "' appears twice");
    SP_CHECK(tensor.defined(), op, ": tensor '", name, "' is empty (undefined)");
  }
}

// ---------------------------------------------------------------- decoding

// Reads one record from a byte range, with every failure reported as
// "reading tensors from 'source': ...".
class RecordReader {
 public:
  RecordReader(const unsigned char* data, std::size_t size, const std::string& source)
      : data_(data), size_(size), source_(source) {}

  template <typename... Args>
  [[noreturn]] void Fail(const Args&... pieces) const {
    throw Error(detail::StrCat("reading tensors from '", source_, "': ", pieces...));
  }

  // Checks magic and version on the first `size_` bytes (which may be fewer
  // than a header) and returns the declared total length.
  uint64_t CheckPrefix() const {
    if (size_ == 0) Fail("truncated: no data (0 bytes)");
    const std::size_t magic_bytes = std::min(size_, kMagicSize);
    if (std::memcmp(data_, kTensorFileMagic, magic_bytes) != 0) {
      Fail("wrong magic: expected \"", kTensorFileMagic, "\", found \"",
           Printable(data_, magic_bytes), "\" (not a stillpoint tensor file)");
    }
    if (size_ < kPrefixSize) {
      Fail("truncated: only ", size_, " bytes, shorter than the ", kPrefixSize, "-byte header");
    }
    const uint64_t version = ReadLittleEndian(data_ + kMagicSize, 4);
    if (version != kTensorFormatVersion) {
      Fail("unsupported format version ", version, " (this build reads version ",
           kTensorFormatVersion, ")");
    }
    const uint64_t length = ReadLittleEndian(data_ + kLengthOffset, 8);
    if (length < kMinRecordSize) {
      Fail("corrupted: the header declares a length of ", length,
           " bytes, less than the smallest possible record (", kMinRecordSize, " bytes)");
    }
    return length;
  }

  // Parses a whole record that must fill exactly the byte range.
  NamedTensors Parse() {
    const uint64_t length = CheckPrefix();
    if (length > size_) {
      Fail("truncated: the header declares ", length, " bytes but only ", size_, " are present");
    }
    if (length < size_) {
      Fail("corrupted: ", size_ - length, " unexpected bytes after the end of the record (the ",
           "header declares ", length, " bytes, the data has ", size_, ")");
    }
    const std::size_t body_end = size_ - kChecksumSize;
    const uint64_t stored = ReadLittleEndian(data_ + body_end, 8);
    const uint64_t computed = Fnv1a64(data_, body_end);
    if (stored != computed) {
      Fail("checksum mismatch: stored ", Hex(stored), ", computed ", Hex(computed),
           " (the data is corrupted)");
    }

    position_ = kPrefixSize;
    end_ = body_end;
    const uint64_t count = Unsigned(8, "the entry count");
    if (count > (end_ - position_) / kMinEntrySize) {
      Fail("corrupted: an entry count of ", count, " cannot fit in ", size_, " bytes");
    }
    NamedTensors tensors;
    tensors.reserve(count);
    std::set<std::string> names;
    for (uint64_t i = 0; i < count; ++i) {
      tensors.push_back(Entry(i));
      if (!names.insert(tensors.back().first).second) {
        Fail("corrupted: the name '", tensors.back().first, "' appears twice");
      }
    }
    if (position_ != end_) {
      Fail("corrupted: ", end_ - position_, " unexplained bytes after the last entry");
    }
    return tensors;
  }

 private:
  void Need(std::size_t bytes, const std::string& what) const {
    if (bytes > end_ - position_) {
      Fail("corrupted: ", what, " needs ", bytes, " bytes at offset ", position_, " but only ",
           end_ - position_, " remain before the checksum");
    }
  }

  uint64_t Unsigned(int bytes, const std::string& what) {
    Need(bytes, what);
    const uint64_t value = ReadLittleEndian(data_ + position_, bytes);
    position_ += bytes;
    return value;
  }

  std::pair<std::string, Tensor> Entry(uint64_t index) {
    const std::string entry = detail::StrCat("entry ", index);
    const uint64_t name_length = Unsigned(4, entry + "'s name length");
    if (name_length == 0 || name_length > kMaxTensorNameLength) {
      Fail("corrupted: ", entry, " has a name of ", name_length, " bytes (allowed: 1 to ",
           kMaxTensorNameLength, ")");
    }
    Need(name_length, entry + "'s name");
    std::string name(reinterpret_cast<const char*>(data_ + position_), name_length);
    position_ += name_length;
    const std::string label = detail::StrCat(entry, " ('", name, "')");

    const uint64_t dtype_code = Unsigned(1, label + "'s dtype");
    DType dtype;
    if (dtype_code == kDTypeCodeFloat32) {
      dtype = DType::kFloat32;
    } else if (dtype_code == kDTypeCodeFloat64) {
      dtype = DType::kFloat64;
    } else {
      Fail("corrupted: ", label, " has unknown dtype code ", dtype_code,
           " (known: ", int{kDTypeCodeFloat32}, " = float32, ", int{kDTypeCodeFloat64},
           " = float64)");
    }

    const uint64_t rank = Unsigned(4, label + "'s rank");
    if (rank > static_cast<uint64_t>(Shape::kMaxRank)) {
      Fail("corrupted: ", label, " has rank ", rank, " (at most ", Shape::kMaxRank,
           " is supported)");
    }
    std::vector<int64_t> dims(rank);
    int64_t numel = 1;
    for (uint64_t axis = 0; axis < rank; ++axis) {
      const int64_t extent = static_cast<int64_t>(Unsigned(8, label + "'s extents"));
      if (extent < 0) Fail("corrupted: ", label, " has a negative extent ", extent);
      dims[axis] = extent;
      if (extent != 0 && numel > std::numeric_limits<int64_t>::max() / extent) {
        Fail("corrupted: ", label, " has an absurd size (extents overflow 64 bits)");
      }
      numel *= extent;
    }
    const Shape shape(dims);
    const std::size_t element_size = SizeOf(dtype);
    if (static_cast<uint64_t>(numel) > (end_ - position_) / element_size) {
      Fail("corrupted: ", label, " of shape ", shape, " and dtype ", ToString(dtype), " needs ",
           static_cast<unsigned long long>(numel), " x ", element_size, " bytes of data but only ",
           end_ - position_, " remain before the checksum");
    }
    Tensor tensor(shape, dtype);
    DispatchDType(dtype, [&](auto zero) {
      using T = decltype(zero);
      CopyLittleEndian(tensor.data<T>(), data_ + position_, static_cast<std::size_t>(numel),
                       element_size);
    });
    position_ += static_cast<std::size_t>(numel) * element_size;
    return {std::move(name), std::move(tensor)};
  }

  const unsigned char* data_;
  std::size_t size_;
  const std::string& source_;
  std::size_t position_ = 0;
  std::size_t end_ = 0;
};

[[noreturn]] void ThrowSystemError(const std::string& context, int error_number) {
  throw Error(detail::StrCat(context, ": ", std::strerror(error_number)));
}

}  // namespace

// ---------------------------------------------------------------- checksum

uint64_t Fnv1a64(const void* data, std::size_t size, uint64_t hash) {
  constexpr uint64_t kPrime = 1099511628211ull;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= kPrime;
  }
  return hash;
}

// ---------------------------------------------------------------- bytes

std::string SerializeTensors(const NamedTensors& tensors) {
  CheckEntries(tensors, "SerializeTensors");
  std::size_t total = kMinRecordSize;
  for (const auto& [name, tensor] : tensors) {
    total += 4 + name.size() + 1 + 4 + 8 * tensor.rank() + tensor.nbytes();
  }

  std::string out;
  out.reserve(total);
  out.append(kTensorFileMagic, kMagicSize);
  AppendLittleEndian(&out, kTensorFormatVersion, 4);
  AppendLittleEndian(&out, total, 8);
  AppendLittleEndian(&out, tensors.size(), 8);
  for (const auto& [name, tensor] : tensors) {
    AppendLittleEndian(&out, name.size(), 4);
    out.append(name);
    AppendLittleEndian(&out, DTypeCode(tensor.dtype()), 1);
    AppendLittleEndian(&out, tensor.rank(), 4);
    for (int axis = 0; axis < tensor.rank(); ++axis) {
      AppendLittleEndian(&out, static_cast<uint64_t>(tensor.dim(axis)), 8);
    }
    const std::size_t offset = out.size();
    out.resize(offset + tensor.nbytes());
    // A reference, not the binding itself, in the lambda: clang 14 (the fuzz
    // build's compiler) does not capture structured bindings.
    const Tensor& value = tensor;
    DispatchDType(value.dtype(), [&](auto zero) {
      using T = decltype(zero);
      if (value.numel() == 0) return;  // an empty tensor may have no storage
      CopyLittleEndian(out.data() + offset, value.data<T>(),
                       static_cast<std::size_t>(value.numel()), sizeof(T));
    });
  }
  AppendLittleEndian(&out, Fnv1a64(out.data(), out.size()), 8);
  SP_CHECK(out.size() == total, "SerializeTensors: internal error: wrote ", out.size(),
           " bytes, expected ", total);
  return out;
}

NamedTensors DeserializeTensors(const std::string& bytes,
                                const std::string& source_name_for_errors) {
  RecordReader reader(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
                      source_name_for_errors);
  return reader.Parse();
}

void WriteTensors(std::ostream& out, const NamedTensors& tensors) {
  const std::string bytes = SerializeTensors(tensors);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  SP_CHECK(out.good(), "WriteTensors: the stream failed after writing a record of ", bytes.size(),
           " bytes");
}

NamedTensors ReadTensors(std::istream& in, const std::string& source_name_for_errors) {
  std::string bytes(kPrefixSize, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(kPrefixSize));
  bytes.resize(static_cast<std::size_t>(in.gcount()));
  const uint64_t length = RecordReader(reinterpret_cast<const unsigned char*>(bytes.data()),
                                       bytes.size(), source_name_for_errors)
                              .CheckPrefix();
  // The declared length is not trusted yet (the checksum comes last), so
  // read in bounded chunks rather than allocating `length` up front.
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  while (bytes.size() < length) {
    const std::size_t want = std::min<uint64_t>(kChunk, length - bytes.size());
    const std::size_t have = bytes.size();
    bytes.resize(have + want);
    in.read(bytes.data() + have, static_cast<std::streamsize>(want));
    const std::size_t got = static_cast<std::size_t>(in.gcount());
    if (got < want) {
      throw Error(detail::StrCat("reading tensors from '", source_name_for_errors,
                                 "': truncated: the header declares ", length,
                                 " bytes but the stream ended after ", have + got));
    }
  }
  return DeserializeTensors(bytes, source_name_for_errors);
}

std::string SerializeModule(const Module& module) { return SerializeTensors(module.NamedValues()); }

void DeserializeModule(const std::string& bytes,
                       const std::string& source_name_for_errors,
                       Module* module) {
  SP_CHECK(module != nullptr, "DeserializeModule: module is null");
  const NamedTensors tensors = DeserializeTensors(bytes, source_name_for_errors);
  try {
    module->LoadParameters(tensors);
  } catch (const Error& error) {
    throw Error(detail::StrCat("loading ", module->Name(), " from '", source_name_for_errors,
                               "': ", error.what()));
  }
}

// ---------------------------------------------------------------- files

std::string TemporaryPathFor(const std::string& path) {
  return detail::StrCat(path, ".tmp.", static_cast<long>(::getpid()));
}

void WriteFileAtomically(const std::string& path, const std::string& bytes) {
  // The writer's pid in the name: two processes saving the same file (two
  // runs pointed at one directory) never write into, rename or remove each
  // other's temporary.
  const std::string temporary = TemporaryPathFor(path);
  const std::string context = detail::StrCat("cannot write '", path, "'");
  // The rename would replace whatever is at path: only a regular file (or a
  // symlink, replaced as a link) may be; never a device node, FIFO or socket
  // (as root, `export --out /dev/full` replaced the device). A directory
  // cannot be replaced by a file's rename: that fails below.
  struct stat existing {};
  if (::lstat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode) &&
      !S_ISLNK(existing.st_mode) && !S_ISDIR(existing.st_mode)) {
    throw Error(detail::StrCat(context, ": it is a device, FIFO or socket, which stillpoint "
                               "never replaces (only regular files)"));
  }
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) ThrowSystemError(detail::StrCat(context, ": cannot create '", temporary, "'"), errno);

  // From here on, every failure removes the temporary.
  auto fail = [&](const std::string& what, int error_number) {
    ::close(fd);
    ::unlink(temporary.c_str());
    ThrowSystemError(detail::StrCat(context, ": ", what), error_number);
  };
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(detail::StrCat("writing '", temporary, "' failed after ", written, " of ", bytes.size(),
                          " bytes"),
           errno);
    }
    written += static_cast<std::size_t>(n);
  }
  // fsync before rename: otherwise a power loss after the rename could leave
  // a file with the new name and not yet the new content.
  if (::fsync(fd) != 0) fail(detail::StrCat("flushing '", temporary, "' failed"), errno);
  if (::close(fd) != 0) {
    const int error_number = errno;
    ::unlink(temporary.c_str());
    ThrowSystemError(detail::StrCat(context, ": closing '", temporary, "' failed"), error_number);
  }

  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    ::unlink(temporary.c_str());
    throw Error(detail::StrCat(context, ": renaming '", temporary, "' failed: ", error.message()));
  }
  // Best effort: make the rename itself durable.
  std::string directory = std::filesystem::path(path).parent_path().string();
  if (directory.empty()) directory = ".";
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void ThrowReadLimitExceeded(const std::string& path, const ReadLimit& limit) {
  const uint64_t mib = limit.max_bytes >> 20;
  const std::string size =
      mib > 0 ? detail::StrCat(mib, " MiB") : detail::StrCat(limit.max_bytes, " bytes");
  throw Error(limit.raised_by.empty()
                  ? detail::StrCat("'", path, "': more than ", size, ", the most this reader takes")
                  : detail::StrCat("'", path, "': more than ", size, " (the cap of ",
                                   limit.raised_by, "; raise ", limit.raised_by,
                                   " to read it)"));
}

namespace {

// Reads at most `count` bytes of the file at path (all of it when it is
// shorter); `size_hint` is set to the size a regular file reports (or -1).
// With `whole_or_nothing`, a regular file longer than count is not read.
std::string ReadUpTo(const std::string& path, uint64_t count, bool whole_or_nothing,
                     int64_t* size_hint) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ThrowSystemError(detail::StrCat("cannot open '", path, "' for reading"), errno);
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error_number = errno;
    ::close(fd);
    ThrowSystemError(detail::StrCat("cannot read '", path, "'"), error_number);
  }
  if (S_ISDIR(info.st_mode)) {
    ::close(fd);
    ThrowSystemError(detail::StrCat("cannot read '", path, "'"), EISDIR);
  }
  *size_hint = S_ISREG(info.st_mode) ? static_cast<int64_t>(info.st_size) : -1;
  std::string bytes;
  if (whole_or_nothing && *size_hint >= 0 && static_cast<uint64_t>(*size_hint) > count) {
    ::close(fd);  // the caller's cap refuses it; nothing read
    return bytes;
  }
  if (*size_hint > 0) {
    bytes.reserve(static_cast<std::size_t>(std::min<uint64_t>(*size_hint, count)));
  }
  char chunk[1 << 16];
  while (bytes.size() < count) {
    const std::size_t want =
        static_cast<std::size_t>(std::min<uint64_t>(sizeof(chunk), count - bytes.size()));
    const ssize_t n = ::read(fd, chunk, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      ::close(fd);
      ThrowSystemError(detail::StrCat("reading '", path, "' failed"), error_number);
    }
    if (n == 0) break;
    bytes.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return bytes;
}

}  // namespace

std::string ReadFileBytes(const std::string& path, const ReadLimit& limit) {
  // One byte past the cap tells a file at the cap from one beyond it.
  const uint64_t want = limit.max_bytes == std::numeric_limits<uint64_t>::max()
                            ? limit.max_bytes
                            : limit.max_bytes + 1;
  int64_t size = -1;
  std::string bytes = ReadUpTo(path, want, /*whole_or_nothing=*/true, &size);
  if ((size >= 0 && static_cast<uint64_t>(size) > limit.max_bytes) ||
      bytes.size() > limit.max_bytes) {
    ThrowReadLimitExceeded(path, limit);
  }
  return bytes;
}

std::string ReadFilePrefix(const std::string& path, std::size_t count) {
  int64_t size = -1;
  return ReadUpTo(path, count, /*whole_or_nothing=*/false, &size);
}

void SaveTensors(const std::string& path, const NamedTensors& tensors) {
  std::string bytes;
  try {
    bytes = SerializeTensors(tensors);
  } catch (const Error& error) {
    throw Error(detail::StrCat("SaveTensors('", path, "'): ", error.what()));
  }
  WriteFileAtomically(path, bytes);
}

NamedTensors LoadTensors(const std::string& path) {
  return DeserializeTensors(ReadFileBytes(path), path);
}

void SaveModule(const std::string& path, const Module& module) {
  SaveTensors(path, module.NamedValues());
}

void LoadModule(const std::string& path, Module* module) {
  SP_CHECK(module != nullptr, "LoadModule: module is null (loading '", path, "')");
  DeserializeModule(ReadFileBytes(path), path, module);
}

}  // namespace stillpoint

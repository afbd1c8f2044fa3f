// DLPack capsules for the Python package (cuda_sharded_jit/_dlpack.py checks the arguments and
// decides; this file only builds and reads the C structures), both ways:
//   dlpack_export: a shard (or a field of a record shard) as a "dltensor_versioned" capsule
//     (DLManagedTensorVersioned, DLPack 1.x) or a legacy "dltensor" one (DLManagedTensor);
//     the capsule holds a reference to the Python object that keeps the shard's memory alive
//     (the ShardView, which holds its ShardedArray) until the consumer's deleter runs, or until
//     the capsule is destroyed unconsumed (its name still unchanged).
//   dlpack_import: a producer's capsule taken over (renamed "used_dltensor[_versioned]", as the
//     Python specification asks of a consumer) by a DLPackImport, which reports the tensor's
//     fields and calls the producer's deleter exactly once: at release() or when it goes.
//
// Why C++ rather than ctypes in Python: a consumer may call our deleter from any thread and at
// any time, also while the interpreter shuts down. A ctypes callback is a thunk object that
// lives in a module's globals (freed when modules are torn down, before late tensors die) and
// whose first act is to take the GIL, so nothing can check first whether Python is still
// there. These functions live in the extension, which is never unloaded, and drop the
// owner's reference under the GIL, taking it only on a thread that lacks it and never once the
// interpreter is finalizing (the reference then dies with it). The capsule destructor must
// tell a consumed capsule from an unconsumed one by its name, which nanobind's capsule type
// hides from its destructor, hence the CPython capsule API here. CUDA-free, like the rest of
// the bindings.
#include "dlpack.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using namespace nb::literals;

namespace csj::bindings {
namespace {

// The DLPack 1.x ABI (dlpack.h), spelled out: the header is not among the build's inputs, and
// these layouts are frozen (a new major version would be a new struct).
namespace dl {
struct Version {
  std::uint32_t major;
  std::uint32_t minor;
};
struct Device {
  std::int32_t device_type;  // DLDeviceType, an int-sized enum
  std::int32_t device_id;
};
struct DataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  std::int32_t ndim;
  DataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; NULL: compact row-major (legacy producers)
  std::uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  std::uint64_t flags;
  Tensor dl_tensor;
};
constexpr std::int32_t kCUDA = 2;
constexpr std::uint64_t kFlagReadOnly = 1u << 0;
constexpr std::uint64_t kFlagIsCopied = 1u << 1;
// The version our capsules carry: nothing in them is newer than DLPack 1.0.
constexpr Version kExportVersion{1, 0};
constexpr std::uint32_t kReadMajor = 1;

static_assert(sizeof(Tensor) == 48 && offsetof(Tensor, ndim) == 16 && offsetof(Tensor, dtype) == 20 &&
                  offsetof(Tensor, shape) == 24 && offsetof(Tensor, byte_offset) == 40,
              "DLTensor layout");
static_assert(sizeof(ManagedTensor) == 64 && offsetof(ManagedTensor, deleter) == 56, "DLManagedTensor layout");
static_assert(sizeof(ManagedTensorVersioned) == 80 && offsetof(ManagedTensorVersioned, flags) == 24 &&
                  offsetof(ManagedTensorVersioned, dl_tensor) == 32,
              "DLManagedTensorVersioned layout");
}  // namespace dl

constexpr const char* kVersionedName = "dltensor_versioned";
constexpr const char* kLegacyName = "dltensor";
constexpr const char* kUsedVersionedName = "used_dltensor_versioned";
constexpr const char* kUsedLegacyName = "used_dltensor";

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// ---- export ----------------------------------------------------------------------------

// One exported shard: both struct forms (one is used), its one-element shape and stride, and
// the strong reference to the owner. manager_ctx points here.
struct Export {
  dl::ManagedTensorVersioned versioned{};
  dl::ManagedTensor legacy{};
  std::int64_t shape = 0;
  std::int64_t stride = 1;
  PyObject* owner = nullptr;
};

// Drops the owner's reference, with any caller's exception kept aside: dropping it may free
// the array (and run its finalizer), and a capsule destructor may run with one pending.
void drop_owner(PyObject* owner) {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* pending = PyErr_GetRaisedException();
  Py_DECREF(owner);
  PyErr_SetRaisedException(pending);
#else
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  Py_DECREF(owner);
  PyErr_Restore(type, value, traceback);
#endif
}

// The deleter's work, from whichever thread the consumer calls it: with the GIL held (a
// Python consumer, or module teardown at exit) the reference is dropped at once; from another
// thread the GIL is taken first, unless the interpreter is finalizing (taking it then would
// stop the thread): then, as once it is gone, the reference is left to die with it.
void release_export(Export* exported) noexcept {
  if (exported->owner && Py_IsInitialized()) {
    if (PyGILState_Check()) {
      drop_owner(exported->owner);
    } else if (!finalizing()) {
      PyGILState_STATE state = PyGILState_Ensure();
      drop_owner(exported->owner);
      PyGILState_Release(state);
    }
  }
  delete exported;
}

void delete_versioned(dl::ManagedTensorVersioned* self) {
  if (self) release_export(static_cast<Export*>(self->manager_ctx));
}

void delete_legacy(dl::ManagedTensor* self) {
  if (self) release_export(static_cast<Export*>(self->manager_ctx));
}

// A capsule is destroyed: if no consumer renamed it, nobody else will call the deleter.
void destroy_versioned_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kVersionedName)) return;  // consumed
  auto* managed = static_cast<dl::ManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kVersionedName));
  if (managed && managed->deleter) managed->deleter(managed);
}

void destroy_legacy_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kLegacyName)) return;
  auto* managed = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(capsule, kLegacyName));
  if (managed && managed->deleter) managed->deleter(managed);
}

nb::object dlpack_export(nb::handle owner, std::uintptr_t data, std::int32_t device_id, std::int64_t size,
                         std::int64_t stride, std::uint8_t code, std::uint8_t bits, bool versioned) {
  if (size < 0 || stride < 1) throw std::invalid_argument("dlpack_export: size must be >= 0 and stride >= 1");
  auto exported = std::make_unique<Export>();
  exported->shape = size;
  exported->stride = stride;
  dl::Tensor tensor{};
  tensor.data = reinterpret_cast<void*>(data);
  tensor.device = {dl::kCUDA, device_id};
  tensor.ndim = 1;
  tensor.dtype = {code, bits, 1};
  tensor.shape = &exported->shape;
  tensor.strides = &exported->stride;  // never NULL: DLPack 1.2 asks for strides whenever ndim > 0
  tensor.byte_offset = 0;
  void* pointer = nullptr;
  if (versioned) {
    exported->versioned.version = dl::kExportVersion;
    exported->versioned.manager_ctx = exported.get();
    exported->versioned.deleter = &delete_versioned;
    exported->versioned.flags = 0;  // writable, and no copy
    exported->versioned.dl_tensor = tensor;
    pointer = &exported->versioned;
  } else {
    exported->legacy.dl_tensor = tensor;
    exported->legacy.manager_ctx = exported.get();
    exported->legacy.deleter = &delete_legacy;
    pointer = &exported->legacy;
  }
  PyObject* capsule = PyCapsule_New(pointer, versioned ? kVersionedName : kLegacyName,
                                    versioned ? &destroy_versioned_capsule : &destroy_legacy_capsule);
  if (!capsule) throw nb::python_error();
  Py_INCREF(owner.ptr());
  exported.release()->owner = owner.ptr();
  return nb::steal(capsule);
}

// ---- import ----------------------------------------------------------------------------

// A producer's managed tensor, owned from the moment its capsule is renamed: the deleter runs
// once, whether the import is kept, refused by a later check, or released early.
class DLPackImport {
 public:
  explicit DLPackImport(nb::handle capsule) {
    if (!PyCapsule_CheckExact(capsule.ptr())) {
      throw nb::type_error(("expected a DLPack capsule, got " +
                            std::string(nb::type_name(capsule.type()).c_str()))
                               .c_str());
    }
    const char* name = PyCapsule_GetName(capsule.ptr());
    const std::string found = name ? name : "";
    if (found == kVersionedName) {
      versioned_ = true;
    } else if (found != kLegacyName) {
      if (found == kUsedVersionedName || found == kUsedLegacyName) {
        throw std::invalid_argument("its DLPack capsule was consumed already (named '" + found +
                                    "'): a capsule is read once, ask the producer for a new one");
      }
      throw std::invalid_argument("a capsule named '" + found +
                                  "' is no DLPack capsule ('dltensor_versioned' or 'dltensor')");
    }
    void* pointer = PyCapsule_GetPointer(capsule.ptr(), name);
    if (!pointer) throw nb::python_error();
    if (PyCapsule_SetName(capsule.ptr(), versioned_ ? kUsedVersionedName : kUsedLegacyName) != 0) {
      throw nb::python_error();
    }
    managed_.store(pointer);  // ours from here on: a throw below calls the deleter first
    try {
      read(pointer);
    } catch (...) {
      release();
      throw;
    }
  }

  DLPackImport(const DLPackImport&) = delete;
  DLPackImport& operator=(const DLPackImport&) = delete;
  ~DLPackImport() { release(); }

  // Calls the producer's deleter, once (later calls do nothing).
  void release() noexcept {
    void* pointer = managed_.exchange(nullptr);
    if (!pointer) return;
    if (versioned_) {
      auto* managed = static_cast<dl::ManagedTensorVersioned*>(pointer);
      if (managed->deleter) managed->deleter(managed);
    } else {
      auto* managed = static_cast<dl::ManagedTensor*>(pointer);
      if (managed->deleter) managed->deleter(managed);
    }
  }

  bool released() const { return managed_.load() == nullptr; }
  bool versioned() const { return versioned_; }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> version() const { return version_; }
  std::uint64_t flags() const { return flags_; }
  bool read_only() const { return (flags_ & dl::kFlagReadOnly) != 0; }
  bool copied() const { return (flags_ & dl::kFlagIsCopied) != 0; }
  std::uintptr_t data() const { return data_; }
  std::uint64_t byte_offset() const { return byte_offset_; }
  std::pair<std::int32_t, std::int32_t> device() const { return device_; }
  std::tuple<int, int, int> dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  const std::optional<std::vector<std::int64_t>>& strides() const { return strides_; }

 private:
  // Copies the tensor's fields, checking what every consumer relies on.
  void read(void* pointer) {
    const dl::Tensor* tensor = nullptr;
    if (versioned_) {
      auto* managed = static_cast<dl::ManagedTensorVersioned*>(pointer);
      version_ = {managed->version.major, managed->version.minor};
      if (managed->version.major != dl::kReadMajor) {
        // Another major version lays the struct out otherwise: only the deleter may be touched
        // (read's caller calls it)
        throw std::invalid_argument("DLPack " + std::to_string(version_->first) + "." +
                                    std::to_string(version_->second) + " tensor: this library reads DLPack " +
                                    std::to_string(dl::kReadMajor) + ".x");
      }
      flags_ = managed->flags;
      tensor = &managed->dl_tensor;
    } else {
      tensor = &static_cast<dl::ManagedTensor*>(pointer)->dl_tensor;
    }
    if (tensor->ndim < 0) throw std::invalid_argument("DLPack tensor with ndim " + std::to_string(tensor->ndim));
    if (tensor->ndim > 0 && !tensor->shape) throw std::invalid_argument("DLPack tensor without a shape");
    data_ = reinterpret_cast<std::uintptr_t>(tensor->data);
    byte_offset_ = tensor->byte_offset;
    device_ = {tensor->device.device_type, tensor->device.device_id};
    dtype_ = {tensor->dtype.code, tensor->dtype.bits, tensor->dtype.lanes};
    shape_.assign(tensor->shape, tensor->shape + tensor->ndim);
    if (tensor->strides) strides_.emplace(tensor->strides, tensor->strides + tensor->ndim);
  }

  std::atomic<void*> managed_{nullptr};
  bool versioned_ = false;
  std::optional<std::pair<std::uint32_t, std::uint32_t>> version_;
  std::uint64_t flags_ = 0;  // a legacy tensor has none
  std::uintptr_t data_ = 0;
  std::uint64_t byte_offset_ = 0;
  std::pair<std::int32_t, std::int32_t> device_{0, 0};
  std::tuple<int, int, int> dtype_{0, 0, 0};
  std::vector<std::int64_t> shape_;
  std::optional<std::vector<std::int64_t>> strides_;
};

}  // namespace

void bind_dlpack(nb::module_& m) {
  m.def("dlpack_export", &dlpack_export, "owner"_a, "data"_a, "device_id"_a, "size"_a, "stride"_a, "code"_a,
        "bits"_a, "versioned"_a,
        "A 1-D CUDA tensor of `size` elements `stride` apart at `data` as a DLPack capsule "
        "(versioned or legacy) holding a reference to `owner` until its deleter runs.");
  nb::class_<DLPackImport>(m, "DLPackImport",
                           "A producer's DLPack tensor, taken over from its capsule; the producer's deleter "
                           "runs once, at release() or when this object goes.")
      .def_prop_ro("released", &DLPackImport::released)
      .def_prop_ro("versioned", &DLPackImport::versioned)
      .def_prop_ro("version", &DLPackImport::version)
      .def_prop_ro("flags", &DLPackImport::flags)
      .def_prop_ro("read_only", &DLPackImport::read_only)
      .def_prop_ro("copied", &DLPackImport::copied)
      .def_prop_ro("data", &DLPackImport::data)
      .def_prop_ro("byte_offset", &DLPackImport::byte_offset)
      .def_prop_ro("device", &DLPackImport::device)
      .def_prop_ro("dtype", &DLPackImport::dtype)
      .def_prop_ro("shape", &DLPackImport::shape)
      .def_prop_ro("strides", &DLPackImport::strides)
      .def("release", &DLPackImport::release);
  m.def(
      "dlpack_import", [](nb::handle capsule) { return std::make_unique<DLPackImport>(capsule); }, "capsule"_a,
      "Takes over a DLPack capsule (renaming it used_...): a DLPackImport.");
}

}  // namespace csj::bindings

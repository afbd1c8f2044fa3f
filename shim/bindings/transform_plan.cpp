// Transform plans: the host side of a repeated transform call in C++.
//
// A notebook or solver loop calls `transform(op, a, b, out=c)` with the same operator and
// types thousands of times, on arrays of a few thousand elements, where the call's host time is
// the whole cost. The Python package checks the first call in full (types, groups, shard sizes,
// scalars, the compile or cache hit) and keeps what it found as a TransformPlan on the operator:
// the arguments' kinds and dtypes, the group, out's dtype, and each place's kernel resolved.
// A later call hands its arguments to TransformPlan.launch, which takes them only when each is
// exactly of the kind the plan recorded (the same array class, group, shard sizes and dtype; a
// scalar of the same Python or NumPy type that fits its slot), packs the scalars and launches.
// Anything else returns False before anything runs, and the package takes its full path, which
// raises the documented error or makes a new plan. So the plan never decides an error.
#include "transform_plan.hpp"

#include <Python.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "csj/dtype.hpp"
#include "csj/sharded_array.hpp"
#include "csj/transform.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace csj::bindings {
namespace {

// How one argument travels: an array, or a scalar packed into an 8-byte slot.
enum class Kind { array, python_float, python_int, numpy_scalar };

struct Position {
  Kind kind;
  nb::object expected;  // array: its numpy dtype; numpy scalar: its type
  DType slot = DType::float64;  // a scalar's slot type
};

// The 8-byte slot of `value` as `slot`, or false when it does not fit (the full path then
// raises the error).
bool pack_slot(PyObject* value, Kind kind, DType slot, unsigned char* to) {
  std::memset(to, 0, 8);
  auto put = [&](auto number) { std::memcpy(to, &number, sizeof(number)); };
  const bool is_float = slot == DType::float32 || slot == DType::float64;
  if (is_float) {
    const double number = kind == Kind::python_float ? PyFloat_AS_DOUBLE(value) : PyFloat_AsDouble(value);
    if (number == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    // a NumPy float32 scalar converts to double exactly, and back; a Python float is float64
    if (slot == DType::float32) put(static_cast<float>(number));
    else put(number);
    return true;
  }
  PyObject* index = kind == Kind::python_int ? (Py_INCREF(value), value) : PyNumber_Index(value);
  if (!index) {
    PyErr_Clear();
    return false;
  }
  bool fits = true;
  if (slot == DType::uint64 || slot == DType::uint32) {
    const unsigned long long number = PyLong_AsUnsignedLongLong(index);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      fits = false;
    } else if (slot == DType::uint32) {
      fits = number <= std::numeric_limits<std::uint32_t>::max();
      if (fits) put(static_cast<std::uint32_t>(number));
    } else {
      put(static_cast<std::uint64_t>(number));
    }
  } else {
    int overflow = 0;
    const long long number = PyLong_AsLongLongAndOverflow(index, &overflow);
    if (overflow || (number == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      fits = false;
    } else if (slot == DType::int32) {
      fits = number >= std::numeric_limits<std::int32_t>::min() && number <= std::numeric_limits<std::int32_t>::max();
      if (fits) put(static_cast<std::int32_t>(number));
    } else {
      put(static_cast<std::int64_t>(number));
    }
  }
  Py_DECREF(index);
  return fits;
}

class TransformPlan {
 public:
  // `kinds`: per argument, ("array", dtype), ("float", None) (a float64 slot), ("int", None)
  // (an int64 slot) or ("numpy", type, its dtype's name). `libraries`: one per place.
  TransformPlan(nb::handle array_type, nb::object group, nb::object out_dtype, const nb::list& kinds,
                nb::list libraries, bool indexed)
      : array_type_(nb::borrow(array_type)), group_(nb::steal(check(PyWeakref_NewRef(group.ptr(), nullptr)))),
        out_dtype_(std::move(out_dtype)), libraries_(std::move(libraries)) {
    for (nb::handle entry : kinds) {
      nb::tuple kind = nb::cast<nb::tuple>(entry);
      const std::string name = nb::cast<std::string>(kind[0]);
      Position position{Kind::array, nb::borrow(kind[1])};
      if (name == "array") {
        ++arrays_;
      } else {
        if (name == "float") {
          position.kind = Kind::python_float;
        } else if (name == "int") {
          position.kind = Kind::python_int;
          position.slot = DType::int64;
        } else if (name == "numpy") {
          position.kind = Kind::numpy_scalar;
          position.slot = dtype_from_name(nb::cast<std::string>(kind[2]));
          if (position.slot == DType::record) throw std::invalid_argument("kinds: a scalar is a number, not a record");
        } else {
          throw std::invalid_argument("kinds: unknown kind '" + name + "'");
        }
        ++scalars_;
      }
      positions_.push_back(std::move(position));
    }
    const auto& place_group = nb::cast<const PlaceGroup&>(group.attr("_impl"));
    std::vector<const KernelLibrary*> resolved;
    for (nb::handle library : libraries_) resolved.push_back(nb::cast<const KernelLibrary*>(library));
    kernels_ = transform_kernels(resolved, place_group, indexed);
  }

  // Launches the transform when `args` and `out` are exactly what the plan recorded; False,
  // with nothing run, when they are not.
  bool launch(const nb::tuple& args, nb::handle out) {
    // the group, held weakly: a plan must not keep a group (its streams and memory) alive
    const nb::object group = nb::steal(PyObject_CallNoArgs(group_.ptr()));
    if (!group.is_valid()) {
      PyErr_Clear();
      return false;
    }
    ShardedArray* out_impl = nullptr;
    if (args.size() != positions_.size() || !matches_array(out, group.ptr(), out_dtype_.ptr(), nullptr, &out_impl)) {
      return false;
    }
    PyObject* sizes = attribute(out, shard_sizes_name());
    if (!sizes) return false;
    ArrayList inputs;
    inputs.reserve(arrays_);
    std::string packed(scalars_ * 8, '\0');
    std::size_t slot = 0;
    for (std::size_t k = 0; k < positions_.size(); ++k) {
      const Position& position = positions_[k];
      PyObject* value = args[k].ptr();
      if (position.kind == Kind::array) {
        ShardedArray* impl = nullptr;
        if (!matches_array(value, group.ptr(), position.expected.ptr(), sizes, &impl)) return false;
        // the caller's arguments hold the array for the whole call: a pointer that owns nothing
        inputs.emplace_back(std::shared_ptr<ShardedArray>(), impl);
        continue;
      }
      const bool exact = position.kind == Kind::python_float ? PyFloat_CheckExact(value)
                         : position.kind == Kind::python_int ? PyLong_CheckExact(value)
                                                             : Py_TYPE(value) == reinterpret_cast<PyTypeObject*>(
                                                                                     position.expected.ptr());
      if (!exact ||
          !pack_slot(value, position.kind, position.slot, reinterpret_cast<unsigned char*>(packed.data()) + 8 * slot++)) {
        return false;
      }
    }
    nb::gil_scoped_release release;
    transform(kernels_, inputs, *out_impl, packed);
    return true;
  }

 private:
  static PyObject* shard_sizes_name() {
    static PyObject* name = PyUnicode_InternFromString("_shard_sizes");
    return name;
  }

  // A borrowed reference to an attribute every ShardedArray has (its __slots__), or null:
  // the slot keeps it, as ShardedArray never rebinds _impl, _group, _dtype or _shard_sizes.
  static PyObject* attribute(nb::handle object, PyObject* name) {
    PyObject* value = PyObject_GetAttr(object.ptr(), name);
    if (!value) {
      PyErr_Clear();
      return nullptr;
    }
    Py_DECREF(value);  // the object's slot keeps it
    return value;
  }

  static ShardedArray* impl_of(nb::handle array) {
    static PyObject* name = PyUnicode_InternFromString("_impl");
    PyObject* impl = attribute(array, name);
    ShardedArray* result = nullptr;
    if (impl && nb::try_cast<ShardedArray*>(nb::handle(impl), result)) return result;
    return nullptr;
  }

  // `value` is an array of the plan's class and of `group` with dtype `dtype` (and, unless
  // `sizes` is null, those shard sizes); its shim array in `impl` when asked for.
  bool matches_array(nb::handle value, PyObject* group, PyObject* dtype, PyObject* sizes,
                     ShardedArray** impl = nullptr) const {
    static PyObject* group_name = PyUnicode_InternFromString("_group");
    static PyObject* dtype_name = PyUnicode_InternFromString("_dtype");
    if (Py_TYPE(value.ptr()) != reinterpret_cast<PyTypeObject*>(array_type_.ptr())) return false;
    if (attribute(value, group_name) != group) return false;
    PyObject* own = attribute(value, dtype_name);
    if (!own || (own != dtype && PyObject_RichCompareBool(own, dtype, Py_EQ) != 1)) {
      PyErr_Clear();
      return false;
    }
    if (sizes) {
      PyObject* own_sizes = attribute(value, shard_sizes_name());
      if (!own_sizes || (own_sizes != sizes && PyObject_RichCompareBool(own_sizes, sizes, Py_EQ) != 1)) {
        PyErr_Clear();
        return false;
      }
    }
    if (impl) {
      *impl = impl_of(value);
      if (!*impl) return false;
    }
    return true;
  }

  static PyObject* check(PyObject* made) {
    if (!made) throw nb::python_error();
    return made;
  }

  nb::object array_type_;
  nb::object group_;  // a weak reference to the group
  nb::object out_dtype_;
  nb::list libraries_;  // holds the libraries the kernels belong to
  std::vector<Position> positions_;
  std::size_t arrays_ = 0, scalars_ = 0;
  TransformKernels kernels_;
};

}  // namespace

void bind_transform_plan(nb::module_& m) {
  nb::class_<TransformPlan>(m, "TransformPlan")
      .def(nb::init<nb::handle, nb::object, nb::object, const nb::list&, nb::list, bool>(),
           "array_type"_a, "group"_a, "out_dtype"_a, "kinds"_a, "libraries"_a, "indexed"_a)
      .def("launch", &TransformPlan::launch, "args"_a, "out"_a);
}

}  // namespace csj::bindings

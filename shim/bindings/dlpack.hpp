// DLPack capsules for the Python package, both ways (dlpack.cpp says what and why there).
#pragma once

#include <nanobind/nanobind.h>

namespace csj::bindings {

// Adds dlpack_export, dlpack_import and the DLPackImport class to the module.
void bind_dlpack(nanobind::module_& m);

}  // namespace csj::bindings

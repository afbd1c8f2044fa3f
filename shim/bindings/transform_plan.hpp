// Transform plans for the Python package (transform_plan.cpp says what and why there).
#pragma once

#include <nanobind/nanobind.h>

namespace csj::bindings {

// Adds the TransformPlan class to the module.
void bind_transform_plan(nanobind::module_& m);

}  // namespace csj::bindings

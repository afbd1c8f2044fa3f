// Capture of a group's queued work into one CUDA graph, and its replay. CUDA-free header.
//
// capture_begin puts place 0's stream into capture (relaxed mode) and makes every other
// place's stream wait for it, which draws them into the same capture; the calls that follow
// record their kernels, copies and cross-place waits instead of running them. capture_end
// joins every stream back into place 0's, ends the capture and instantiates the graph. A
// replay launches it on place 0's stream after the work already queued on every place, and
// every place's later work follows it.
#pragma once

#include <memory>

#include "csj/place_group.hpp"

namespace csj {

class CapturedGraph {
 public:
  CapturedGraph(std::shared_ptr<PlaceGroup> group, void* graph, void* exec);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  // Queues one run of the graph (nothing waited for on the host).
  void replay() const;
  // Nodes of the graph (kernels, copies, memory operations, waits).
  std::size_t nodes() const;

 private:
  std::shared_ptr<PlaceGroup> group_;
  void* graph_;  // cudaGraph_t
  void* exec_;   // cudaGraphExec_t
};

void capture_begin(const PlaceGroup& group);
// std::runtime_error naming what broke the capture (a call that waited on the host, for one);
// the streams are out of capture afterwards either way.
std::unique_ptr<CapturedGraph> capture_end(const std::shared_ptr<PlaceGroup>& group);
// Ends a capture whose recording failed, dropping what it recorded; never throws.
void capture_abandon(const PlaceGroup& group) noexcept;

}  // namespace csj

// Capture of a group's work into one CUDA graph and its replay (csj/capture.hpp). The graph
// spans every place's stream: the fork and join are event waits, as every cross-place step of
// the algorithms is, so it records them as dependencies between the places' nodes.
#include "csj/capture.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_check.hpp"

namespace csj {
namespace {

using detail::check;

cudaStream_t stream_of(const PlaceGroup& group, std::size_t place) {
  return reinterpret_cast<cudaStream_t>(group.stream(place));
}

// Every other place's stream joins place 0's: its work so far comes before what follows there.
void join_into_first(const PlaceGroup& group) {
  for (std::size_t place = 1; place < group.size(); ++place) {
    detail::wait_for(stream_of(group, 0), stream_of(group, place), group.device(place));
  }
}

// Every other place's stream waits for place 0's: what follows there comes after its work.
void fork_from_first(const PlaceGroup& group) {
  for (std::size_t place = 1; place < group.size(); ++place) {
    detail::DeviceGuard guard(group.device(place));
    detail::wait_for(stream_of(group, place), stream_of(group, 0), group.device(0));
  }
}

}  // namespace

CapturedGraph::CapturedGraph(std::shared_ptr<PlaceGroup> group, void* graph, void* exec)
    : group_(std::move(group)), graph_(graph), exec_(exec) {}

CapturedGraph::~CapturedGraph() {
  // a replay still running is not cut short: its executable goes once it has run
  detail::DeviceGuard guard(group_->device(0));
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  cudaGetLastError();
}

void CapturedGraph::replay() const {
  const PlaceGroup& group = *group_;
  detail::DeviceGuard guard(group.device(0));
  join_into_first(group);  // after everything already queued on every place
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream_of(group, 0)), "cudaGraphLaunch");
  fork_from_first(group);
}

std::size_t CapturedGraph::nodes() const {
  std::size_t count = 0;
  check(cudaGraphGetNodes(static_cast<cudaGraph_t>(graph_), nullptr, &count), "cudaGraphGetNodes");
  return count;
}

void capture_begin(const PlaceGroup& group) {
  detail::DeviceGuard guard(group.device(0));
  const cudaStream_t first = stream_of(group, 0);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(first, &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone) {
    throw std::invalid_argument("capture: the group's streams are already being captured");
  }
  join_into_first(group);  // work queued before the capture is not part of it
  check(cudaStreamBeginCapture(first, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
  try {
    fork_from_first(group);
  } catch (...) {
    capture_abandon(group);
    throw;
  }
}

std::unique_ptr<CapturedGraph> capture_end(const std::shared_ptr<PlaceGroup>& group) {
  detail::DeviceGuard guard(group->device(0));
  const cudaStream_t first = stream_of(*group, 0);
  cudaError_t joined = cudaSuccess;
  try {
    join_into_first(*group);
  } catch (const std::exception&) {
    joined = cudaErrorStreamCaptureInvalidated;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(first, &graph);
  if (joined != cudaSuccess || ended != cudaSuccess || graph == nullptr) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw std::runtime_error(std::string("capture: the recording broke (") +
                             cudaGetErrorString(ended != cudaSuccess ? ended : joined) +
                             "): a call waited on the host, or used another group's streams");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  if (made != cudaSuccess) {
    cudaGraphDestroy(graph);
    detail::throw_cuda_error(made, "cudaGraphInstantiate");
  }
  return std::make_unique<CapturedGraph>(group, graph, exec);
}

void capture_abandon(const PlaceGroup& group) noexcept {
  try {
    detail::DeviceGuard guard(group.device(0));
    const cudaStream_t first = stream_of(group, 0);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(first, &status) != cudaSuccess || status == cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      return;
    }
    for (std::size_t place = 1; place < group.size(); ++place) {  // the joins may fail once broken
      try {
        detail::wait_for(first, stream_of(group, place), group.device(place));
      } catch (const std::exception&) {
      }
    }
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(first, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  } catch (...) {
  }
}

}  // namespace csj

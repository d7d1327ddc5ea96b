// Recorded regions (Backend::begin_graph) as CUDA graphs.
//
// Why: a decode step is ~500 kernels. Launched one by one, each costs the
// host a few µs of driver time and the GPU a launch; replayed from a graph,
// the step is one launch, queued as soon as its inputs are uploaded.
//
// How a key's steps go:
//  1st: eager (as without graphs). A key seen once may never come back.
//  2nd: the region's ops are held at flush() and captured at end_graph()
//       (stream capture of the same launch calls, on our stream), the graph
//       instantiated and launched: the step's results are the graph's.
//  3rd+: begin_graph launches the graph right away (after the ops before
//       the region: the plan's upload, the error flag's reset); each op the
//       model then enqueues is only compared with the recorded name at its
//       place, and counted as launched. A different op, or a different
//       count at end_graph, fails the step: the caller broke the key's
//       promise (an engine bug), and results would not be the ops'.
//
// What a recording bakes in besides the ops' own arguments (which the key
// covers): the scratch buffer's address (scratch_generation_: a
// reallocation drops every recording), the cuBLASLt workspace and the
// inv_freq tables (allocated once), the device error flag. set_input bytes
// never go into a graph (a region containing one is run eagerly), so the
// pinned arena may move.
//
// Device errors in a replayed region name the op by its index, baked into
// the recording: the backend's key is the caller's mixed with the number of
// ops before the region, so a replay's ops sit at the recording's indices.
#include <atomic>
#include <chrono>

#include "muse/backends/cuda/cuda_impl.cuh"
#include "muse/core/log.h"

namespace muse::cuda {

namespace {
bool is_collective(const char* name) {
  const std::string n = name;
  return n == "all_reduce_sum" || n == "all_gather" || n == "all_to_all";
}
// A key whose capture or graph launch failed: its steps run op by op from
// now on (bounded: past 4096 such keys the set starts over).
void remember_failed(std::unordered_set<uint64_t>& failed, uint64_t key) {
  if (failed.size() > 4096) failed.clear();
  failed.insert(key);
}
}  // namespace

// Graphs off (--enforce-eager), or steps that must run op by op: profiled
// (events between the ops). Timing probes (--skip-ops) record their steps
// without the skipped ops: what an op costs a step as it runs in a graph.
bool CudaBackend::graphs_apply() const { return graphs_on_ && !profile_; }

void CudaBackend::begin_graph(uint64_t caller_key) {
  if (!graphs_apply() || caller_key == 0 || graph_mode_ != GraphMode::Off || !enqueue_error_.empty() ||
      flush_error_ != cudaSuccess)
    return;
  // The ops before the region (uploads the caller adds for some steps of a
  // key) shift the op indices the recording bakes in: part of the key.
  uint64_t key = (caller_key ^ (uint64_t(ops_.size()) * 0x9e3779b97f4a7c15ull)) * 0xbf58476d1ce4e5b9ull;
  key ^= key >> 31;
  if (key == 0) key = 1;
  if (graph_failed_.count(key)) return;  // its capture or a launch failed once: op by op
  use_device();
  auto it = graphs_.find(key);
  if (it != graphs_.end() && it->second.scratch_generation != scratch_generation_) {
    drop_graphs();  // the scratch moved: every recording points at the old one
    it = graphs_.end();
  }
  region_begin_ = ops_.size();
  graph_key_ = key;
  if (it == graphs_.end()) {
    if (graph_sightings_.size() > 4096) graph_sightings_.clear();  // bounded; a cleared key starts again
    if (++graph_sightings_[key] >= 2) graph_mode_ = GraphMode::Capture;
    return;
  }
  launch_queued(false);  // the ops before the region (the inputs' uploads) first
  if (!enqueue_error_.empty() || flush_error_ != cudaSuccess) return;
  if (cudaError_t e = join_side_stream(stream_); e != cudaSuccess) {  // the region may read a side branch's results
    flush_error_ = e, flush_error_name_ = "begin_graph (join the side stream)";
    return;
  }
  if (cudaGraphLaunch(it->second.exec, stream_) != cudaSuccess) {
    // Nothing of the region has run: drop the recording and run it op by op.
    cudaGetLastError();
    cudaGraphExecDestroy(it->second.exec);
    graphs_.erase(it);
    graph_stats_.live = int64_t(graphs_.size());
    remember_failed(graph_failed_, key);
    return;
  }
  it->second.last_use = ++graph_clock_;
  ++graph_stats_.replayed;
  replaying_ = &it->second;
  graph_mode_ = GraphMode::Replay;
}

void CudaBackend::graph_enqueued(const char* name) {
  const size_t i = ops_.size() - 1 - region_begin_;
  if (graph_mode_ == GraphMode::Capture) {
    // What a graph cannot hold: inputs uploaded inside the region, collectives.
    if (std::string(name) == "set_input" || is_collective(name)) graph_mode_ = GraphMode::Off;
    return;
  }
  // Replay: the op is the recording's.
  launched_ = ops_.size();
  if (!enqueue_error_.empty()) return;  // an op failed its checks (not enqueued): that error is the step's
  if (i >= replaying_->names.size() || replaying_->names[i] != name)
    graph_mismatch("op " + std::to_string(i) + " of the region is " + name + ", the recording's is " +
                   (i < replaying_->names.size() ? replaying_->names[i] : "past its end"));
}

void CudaBackend::graph_mismatch(const std::string& what) {
  check(false, "graph replay",
        "a step with recorded key " + std::to_string(graph_key_) + " enqueued other ops than the recording (" + what +
            "): the caller's key misses something that decides the ops");
  graph_mode_ = GraphMode::Off;
  replaying_ = nullptr;
  if (auto it = graphs_.find(graph_key_); it != graphs_.end()) {
    cudaStreamSynchronize(stream_);  // the replay may still run
    cudaGraphExecDestroy(it->second.exec);
    graphs_.erase(it);
    graph_stats_.live = int64_t(graphs_.size());
  }
}

void CudaBackend::end_graph() {
  switch (graph_mode_) {
    case GraphMode::Off:
      return;
    case GraphMode::Replay:
      if (enqueue_error_.empty() && ops_.size() - region_begin_ != replaying_->names.size())
        graph_mismatch("the region has " + std::to_string(ops_.size() - region_begin_) + " ops, the recording " +
                       std::to_string(replaying_->names.size()));
      graph_mode_ = GraphMode::Off;
      replaying_ = nullptr;
      return;
    case GraphMode::Capture:
      capture_region();
      graph_mode_ = GraphMode::Off;
      return;
  }
}

// Captures ops_[region_begin_, end) into a graph and launches it. Whatever
// fails on the way leaves the ops unlaunched, so flush()/execute() run them
// eagerly, as without graphs (and report a launch error as they would).
void CudaBackend::capture_region() {
  if (!enqueue_error_.empty() || flush_error_ != cudaSuccess || ops_.size() == region_begin_) return;
  use_device();
  launch_queued(false);  // up to the region (Capture mode)
  if (!enqueue_error_.empty() || flush_error_ != cudaSuccess) return;
  const auto t0 = std::chrono::steady_clock::now();
  // A side branch launched before the region is joined outside the capture:
  // side_ must enter the capture through a fork made inside it.
  cudaError_t e = join_side_stream(stream_);
  const char* failed = "join the side stream";
  if (e == cudaSuccess) e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), failed = "cudaStreamBeginCapture";
  if (e == cudaSuccess) {
    for (size_t i = region_begin_; i < ops_.size() && e == cudaSuccess; ++i) {
      e = run_op(i, stream_, skipped(i));
      if (e == cudaSuccess) e = cudaGetLastError();
      failed = ops_[i].name;
    }
    // The capture ends on stream_ with side_ joined (else it is unjoined and fails).
    if (const cudaError_t j = join_side_stream(stream_); e == cudaSuccess && j != cudaSuccess)
      e = j, failed = "join the side stream";
    side_open_ = false;  // a failed capture ran nothing on side_
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (e == cudaSuccess) e = end, failed = "cudaStreamEndCapture";
    cudaGraphExec_t exec = nullptr;
    if (e == cudaSuccess) {
      e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
      failed = "cudaGraphInstantiate";
    }
    if (graph) cudaGraphDestroy(graph);
    if (e == cudaSuccess) {
      e = cudaGraphLaunch(exec, stream_);
      failed = "cudaGraphLaunch";
      if (e != cudaSuccess) cudaGraphExecDestroy(exec);
    }
    if (e == cudaSuccess) {
      launched_ = ops_.size();
      StepGraph g;
      g.exec = exec;
      g.scratch_generation = scratch_generation_;
      g.last_use = ++graph_clock_;
      g.names.reserve(ops_.size() - region_begin_);
      for (size_t i = region_begin_; i < ops_.size(); ++i) g.names.push_back(ops_[i].name);
      if (graphs_.size() >= max_graphs_) {  // the least recently used goes
        auto lru = graphs_.begin();
        for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
          if (it->second.last_use < lru->second.last_use) lru = it;
        cudaGraphExecDestroy(lru->second.exec);  // a launched graph may be destroyed; its run completes
        graphs_.erase(lru);
      }
      graphs_[graph_key_] = std::move(g);
      graph_sightings_.erase(graph_key_);
      ++graph_stats_.captured;
      graph_stats_.capture_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      graph_stats_.live = int64_t(graphs_.size());
      return;
    }
  }
  // Not recorded: the ops run eagerly, and so do the key's later steps.
  // Clear the error the capture left.
  cudaGetLastError();
  remember_failed(graph_failed_, graph_key_);
  static std::atomic<bool> warned{false};  // once a process: it is a slower path, not an error
  if (!warned.exchange(true))
    LOG_WARN("cuda backend: a step region could not be recorded as a CUDA graph (%s: %s); such steps run op by op",
             failed, cudaGetErrorName(e));
}

void CudaBackend::drop_graphs() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
  graph_stats_.live = 0;
}

Backend::GraphStats CudaBackend::graph_stats() const { return graph_stats_; }

// Up to 16 rows every count is its own size (the products' 8-row column
// tiles make 5 rows pay little less than 8, but the rest of a Glimmer step
// did: 5 rows padded to 8 measured 2.7% slower than 5 launched eagerly);
// above, multiples of 8, the wgmma products' row granule (33 rows as 40
// measured 1.3% faster than 33 eagerly). At most 16 + 30 sizes to 256 rows.
int64_t CudaBackend::graph_rows(int64_t rows) const {
  if (!graphs_apply() || rows <= 16) return rows;
  return (rows + 7) / 8 * 8;
}

}  // namespace muse::cuda

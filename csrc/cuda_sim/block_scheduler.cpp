#include "cuda_sim/block_scheduler.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "cuda_sim/fiber.h"

namespace specdec::sim {
namespace {

constexpr unsigned kWarp = 32;
constexpr size_t kStackBytes = 256 * 1024;

enum class State { kRunnable, kAtBarrier, kAtWarpCollective, kExited, kFailed };

struct Thread {
  Context context;
  Dim3 idx;
  State state = State::kRunnable;
  const char* file = nullptr;  // where it waits
  int line = 0;
  // At a warp collective: which one, and this lane's argument to it.
  const char* collective = nullptr;
  WarpComplete complete = nullptr;
  void* warp_arg = nullptr;
  // Asynchronous copies not yet waited for, and the number of groups committed so far (copies
  // issued since the last commit belong to group `groups`).
  struct AsyncCopy {
    void* dst;
    const void* src;
    size_t bytes;
    uint64_t group;
  };
  std::vector<AsyncCopy> copies;
  uint64_t groups = 0;
};

// Dynamic shared memory in 128-byte aligned pieces (a GPU's is at least that aligned; wmma's
// loads and stores need 32 bytes).
struct alignas(128) SharedPiece {
  char bytes[128];
};

struct Block {
  Dim3 idx, dim, grid;
  const std::function<void()>* body = nullptr;
  std::vector<Thread> threads;
  Thread* current = nullptr;
  Context scheduler;
  std::vector<SharedPiece> smem;
  std::string error;
};

thread_local Block* running = nullptr;  // the block being simulated on this OS thread
thread_local std::vector<std::unique_ptr<Stack>> stacks;
std::atomic<int> simulated_sms{132};
std::atomic<uint64_t> launches{0};

Block& block() {
  TORCH_CHECK(running && running->current,
              "CUDA simulation: a device function ran outside a kernel");
  return *running;
}

std::string where(const char* file, int line) {
  return file ? std::string(file) + ":" + std::to_string(line) : std::string("?");
}

std::string describe(const Thread& t) {
  switch (t.state) {
    case State::kExited: return "exited";
    case State::kAtBarrier: return "waits at __syncthreads " + where(t.file, t.line);
    case State::kAtWarpCollective:
      return "waits at " + std::string(t.collective) + " " + where(t.file, t.line);
    default: return "runs";
  }
}

// Groups threads by what they do: "threads 0-31, 64: <what>; threads 32-63: <what>".
std::string summary(const std::vector<Thread>& threads, size_t begin, size_t end) {
  std::vector<std::pair<std::string, std::string>> groups;  // what, which threads
  for (size_t i = begin; i < end;) {
    const std::string what = describe(threads[i]);
    size_t j = i;
    while (j + 1 < end && describe(threads[j + 1]) == what) ++j;
    const std::string range =
        i == j ? std::to_string(i) : std::to_string(i) + "-" + std::to_string(j);
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == what; });
    if (it == groups.end()) groups.push_back({what, range});
    else it->second += ", " + range;
    i = j + 1;
  }
  std::string s;
  for (auto& [what, which] : groups)
    s += (s.empty() ? "" : "; ") + ("threads " + which + ": " + what);
  return s;
}

void yield_to_scheduler() {
  Block& b = block();
  switch_to(b.current->context, b.scheduler);
}

void thread_main(void* arg) {
  auto* t = static_cast<Thread*>(arg);
  (*running->body)();
  t->state = State::kExited;
  switch_to(t->context, running->scheduler);
  __builtin_unreachable();  // an exited thread is never resumed
}

// Records the block's first failure, naming the block.
void report(Block& b, const std::string& what) {
  if (!b.error.empty()) return;
  std::ostringstream s;
  s << "CUDA simulation: block (" << b.idx.x << ", " << b.idx.y << ", " << b.idx.z << ") of a ("
    << b.grid.x << ", " << b.grid.y << ", " << b.grid.z << ") grid of " << b.dim.count()
    << "-thread blocks: " << what;
  b.error = s.str();
}

// Completes the collectives of every warp whose lanes all wait at one; returns whether any did.
// Reports a warp with only some lanes at a collective (the others exited or wait elsewhere), and
// what a collective's completion finds wrong with its lanes' arguments.
bool complete_warp_collectives(Block& b) {
  bool any = false;
  const size_t n = b.threads.size();
  for (size_t w = 0; w * kWarp < n; ++w) {
    const size_t begin = w * kWarp, end = std::min(n, begin + kWarp);
    Thread& first = b.threads[begin];
    bool waiting = false, all = end - begin == kWarp;
    for (size_t i = begin; i < end; ++i) {
      const Thread& t = b.threads[i];
      waiting |= t.state == State::kAtWarpCollective;
      all &= t.state == State::kAtWarpCollective && t.file == first.file &&
             t.line == first.line && t.complete == first.complete;
    }
    if (!waiting) continue;
    const Thread& waiter = *std::find_if(b.threads.begin() + begin, b.threads.begin() + end,
        [](const Thread& t) { return t.state == State::kAtWarpCollective; });
    if (!all) {
      report(b, std::string(waiter.collective) + " needs all 32 lanes of the warp, but in warp " +
                    std::to_string(w) + " " + summary(b.threads, begin, end));
      return false;
    }
    void* lanes[kWarp];
    for (size_t i = 0; i < kWarp; ++i) lanes[i] = b.threads[begin + i].warp_arg;
    const std::string error = first.complete(lanes);
    if (!error.empty()) {
      report(b, std::string(first.collective) + " at " + where(first.file, first.line) + " in warp " +
                    std::to_string(w) + ": " + error);
      return false;
    }
    for (size_t i = begin; i < end; ++i) b.threads[i].state = State::kRunnable;
    any = true;
  }
  return any;
}

// Releases the block's barrier when every thread waits at the same one; returns false when all
// threads exited or (reported) when they do anything else.
bool release_barrier(Block& b) {
  size_t exited = 0;
  for (const Thread& t : b.threads) exited += t.state == State::kExited;
  if (exited == b.threads.size()) return false;
  const Thread& first = *std::find_if(b.threads.begin(), b.threads.end(),
                                      [](const Thread& t) { return t.state == State::kAtBarrier; });
  for (const Thread& t : b.threads) {
    if (t.state != State::kAtBarrier || t.file != first.file || t.line != first.line)
    {
      report(b, "__syncthreads is not reached by every thread of the block: " +
                    summary(b.threads, 0, b.threads.size()));
      return false;
    }
  }
  for (Thread& t : b.threads) t.state = State::kRunnable;
  return true;
}

void run_block(Block& b, uint64_t seed) {
  const unsigned n = b.dim.count();
  while (stacks.size() < n) stacks.push_back(std::make_unique<Stack>(kStackBytes));
  b.threads.assign(n, Thread{});
  for (unsigned i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.idx = {i % b.dim.x, i / b.dim.x % b.dim.y, i / (b.dim.x * b.dim.y)};
    start_fiber(t.context, *stacks[i], &thread_main, &t);
  }
  std::memset(static_cast<void*>(b.smem.data()), 0xff, b.smem.size() * sizeof(SharedPiece));
  std::vector<unsigned> order(n);
  std::mt19937_64 rng(seed);
  const unsigned block_linear = b.idx.x + b.grid.x * (b.idx.y + b.grid.y * b.idx.z);
  for (unsigned phase = 0;; ++phase) {
    // Forward, reverse and random orders in turn, shifted by the block's index.
    for (unsigned i = 0; i < n; ++i) order[i] = i;
    switch ((phase + block_linear) % 3) {
      case 1: std::reverse(order.begin(), order.end()); break;
      case 2: std::shuffle(order.begin(), order.end(), rng); break;
      default: break;
    }
    do {
      for (unsigned i : order) {
        Thread& t = b.threads[i];
        if (t.state != State::kRunnable) continue;
        b.current = &t;
        switch_to(b.scheduler, t.context);
        b.current = nullptr;
        if (!b.error.empty()) return;
      }
      const bool completed = complete_warp_collectives(b);
      if (!b.error.empty()) return;
      if (!completed) break;
    } while (true);
    const bool more = release_barrier(b);
    if (!b.error.empty() || !more) return;
  }
}

}  // namespace

const Dim3& thread_idx() { return block().current->idx; }
const Dim3& block_idx() { return block().idx; }
const Dim3& block_dim() { return block().dim; }
const Dim3& grid_dim() { return block().grid; }
void* dynamic_shared_bytes() { return block().smem.data(); }

void sync_threads(const char* file, int line) {
  Thread& t = *block().current;
  t.state = State::kAtBarrier;
  t.file = file;
  t.line = line;
  yield_to_scheduler();
}

void warp_collective(const char* what, const char* file, int line, void* arg,
                     WarpComplete complete) {
  Block& b = block();
  Thread& t = *b.current;
  if (b.threads.size() % kWarp != 0)
    fail(std::string(what) + " at " + where(file, line) + " in a block of " +
         std::to_string(b.threads.size()) + " threads: its last warp is not full");
  t.collective = what;
  t.complete = complete;
  t.warp_arg = arg;
  t.state = State::kAtWarpCollective;
  t.file = file;
  t.line = line;
  yield_to_scheduler();
}

void check_full_mask(unsigned mask, const char* what, const char* file, int line) {
  if (mask == 0xffffffffu) return;
  std::ostringstream s;
  s << what << " at " << where(file, line) << " with mask 0x" << std::hex << mask
    << " (only the full warp, 0xffffffff, is simulated)";
  fail(s.str());
}

namespace {
std::string no_exchange(void* const*) { return {}; }
}  // namespace

void sync_warp(const char* file, int line, unsigned mask) {
  check_full_mask(mask, "__syncwarp", file, line);
  warp_collective("__syncwarp", file, line, nullptr, &no_exchange);
}

void fail(const std::string& what) {
  Block& b = block();
  report(b, what);
  Thread& t = *b.current;
  t.state = State::kFailed;
  switch_to(t.context, b.scheduler);
  __builtin_unreachable();
}

void async_copy(void* dst, const void* src, size_t bytes, size_t zfill) {
  if (bytes != 4 && bytes != 8 && bytes != 16)
    fail("__pipeline_memcpy_async of " + std::to_string(bytes) + " bytes (4, 8 or 16 only)");
  if (zfill != 0) fail("__pipeline_memcpy_async with zfill (not simulated)");
  check_aligned(dst, bytes, "__pipeline_memcpy_async's destination");
  check_aligned(src, bytes, "__pipeline_memcpy_async's source");
  Thread& t = *block().current;
  t.copies.push_back({dst, src, bytes, t.groups});
}

void async_commit() { ++block().current->groups; }

void async_wait_prior(size_t prior) {
  Thread& t = *block().current;
  const uint64_t done = t.groups > prior ? t.groups - prior : 0;  // groups [0, done) complete
  std::vector<Thread::AsyncCopy> pending;
  for (const auto& c : t.copies) {
    if (c.group < done) std::memcpy(c.dst, c.src, c.bytes);
    else pending.push_back(c);
  }
  t.copies = std::move(pending);
}

void check_aligned(const void* p, size_t bytes, const std::string& what) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0)
    fail(what + ": the address is not " + std::to_string(bytes) + "-byte aligned");
}

void run_grid(Dim3 grid, Dim3 block_dims, size_t dynamic_smem, const std::function<void()>& body) {
  TORCH_CHECK(running == nullptr, "CUDA simulation: a launch from inside a kernel");
  Block b;
  b.grid = grid;
  b.dim = block_dims;
  b.body = &body;
  b.smem.resize(std::max<size_t>((dynamic_smem + sizeof(SharedPiece) - 1) / sizeof(SharedPiece), 1));
  const uint64_t launch = launches.fetch_add(1);
  struct Running {
    explicit Running(Block* b) { running = b; }
    ~Running() { running = nullptr; }
  } scope(&b);
  for (unsigned z = 0; z < grid.z && b.error.empty(); ++z)
    for (unsigned y = 0; y < grid.y && b.error.empty(); ++y)
      for (unsigned x = 0; x < grid.x && b.error.empty(); ++x) {
        b.idx = {x, y, z};
        run_block(b, launch * 1000003u + x + 7919u * (y + 7919u * z));
      }
  TORCH_CHECK(b.error.empty(), b.error);
}

int sm_count() { return simulated_sms.load(); }
int64_t set_sm_count(int64_t n) {
  TORCH_CHECK_VALUE(n >= 1 && n <= 65536,
                    "set_sm_count: the number of SMs must be in [1, 65536], got ", n);
  return simulated_sms.exchange(static_cast<int>(n));
}

}  // namespace specdec::sim

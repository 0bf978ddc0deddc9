#include "cuda_sim/block_scheduler.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "cuda_sim/fiber.h"

namespace specdec::sim {
namespace {

constexpr unsigned kWarp = 32;
constexpr size_t kStackBytes = 256 * 1024;

enum class State { kRunnable, kAtBarrier, kAtShuffle, kExited, kFailed };

struct Thread {
  Context context;
  Dim3 idx;
  State state = State::kRunnable;
  const char* file = nullptr;  // where it waits
  int line = 0;
  uint64_t bits = 0, result = 0;  // a shuffle's value and what it reads
  unsigned lane_xor = 0;
};

struct Block {
  Dim3 idx, dim, grid;
  const std::function<void()>* body = nullptr;
  std::vector<Thread> threads;
  Thread* current = nullptr;
  Context scheduler;
  std::vector<char> smem;
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
    case State::kAtShuffle: return "waits at a shuffle " + where(t.file, t.line);
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

// Completes the shuffles of every warp whose lanes all wait at one; returns whether any did.
// Reports a warp with only some lanes at a shuffle (the others exited or wait elsewhere).
bool complete_shuffles(Block& b) {
  bool any = false;
  const size_t n = b.threads.size();
  for (size_t w = 0; w * kWarp < n; ++w) {
    const size_t begin = w * kWarp, end = std::min(n, begin + kWarp);
    Thread& first = b.threads[begin];
    bool waiting = false, all = end - begin == kWarp;
    for (size_t i = begin; i < end; ++i) {
      const Thread& t = b.threads[i];
      waiting |= t.state == State::kAtShuffle;
      all &= t.state == State::kAtShuffle && t.file == first.file && t.line == first.line;
    }
    if (!waiting) continue;
    if (!all) {
      report(b, "a warp shuffle needs all 32 lanes of the warp, but in warp " + std::to_string(w) +
           " " + summary(b.threads, begin, end));
      return false;
    }
    for (size_t i = begin; i < end; ++i) {
      Thread& t = b.threads[i];
      t.result = b.threads[begin + ((i - begin) ^ t.lane_xor) % kWarp].bits;
      t.state = State::kRunnable;
    }
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
  std::fill(b.smem.begin(), b.smem.end(), static_cast<char>(0xff));
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
      const bool shuffled = complete_shuffles(b);
      if (!b.error.empty()) return;
      if (!shuffled) break;
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

uint64_t warp_exchange(unsigned mask, uint64_t bits, unsigned lane_xor, const char* file,
                       int line) {
  Block& b = block();
  Thread& t = *b.current;
  if (mask != 0xffffffffu) {
    std::ostringstream s;
    s << "a warp shuffle at " << where(file, line) << " with mask 0x" << std::hex << mask
      << " (only the full warp, 0xffffffff, is simulated)";
    fail(s.str());
  }
  if (b.threads.size() % kWarp != 0)
    fail("a warp shuffle at " + where(file, line) + " in a block of " +
         std::to_string(b.threads.size()) + " threads: its last warp is not full");
  t.bits = bits;
  t.lane_xor = lane_xor;
  t.state = State::kAtShuffle;
  t.file = file;
  t.line = line;
  yield_to_scheduler();
  return t.result;
}

void fail(const std::string& what) {
  Block& b = block();
  report(b, what);
  Thread& t = *b.current;
  t.state = State::kFailed;
  switch_to(t.context, b.scheduler);
  __builtin_unreachable();
}

void run_grid(Dim3 grid, Dim3 block_dims, size_t dynamic_smem, const std::function<void()>& body) {
  TORCH_CHECK(running == nullptr, "CUDA simulation: a launch from inside a kernel");
  Block b;
  b.grid = grid;
  b.dim = block_dims;
  b.body = &body;
  b.smem.resize(std::max<size_t>(dynamic_smem, 1));
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

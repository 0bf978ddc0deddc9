// Fibers for the CUDA simulation: each simulated GPU thread runs on its own stack, and control
// passes between them and the block scheduler by an explicit switch (context_switch_x86_64.S: a
// few register moves, no system call).
#pragma once

#include <cstddef>

namespace specdec::sim {

// A stack with a guard page below it (an overflow faults instead of corrupting a neighbour).
class Stack {
 public:
  explicit Stack(size_t bytes);
  ~Stack();
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* top() const { return base_ + size_; }

 private:
  char* base_;  // lowest usable byte
  size_t size_;
};

// Saved stack pointer of a suspended context (a fiber, or the scheduler on its OS thread).
struct Context {
  void* sp = nullptr;
};

// Prepares `fiber` to start fn(arg) on `stack` at its first resume. fn must never return.
void start_fiber(Context& fiber, const Stack& stack, void (*fn)(void*), void* arg);
// Suspends the running context into `from` and resumes `to`.
void switch_to(Context& from, const Context& to);

}  // namespace specdec::sim

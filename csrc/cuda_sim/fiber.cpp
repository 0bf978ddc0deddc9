#include "cuda_sim/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <new>

#if !defined(__x86_64__)
#error "the CUDA simulation's context switch is written for x86-64 only"
#endif

extern "C" {
void specdec_sim_switch(void** save_sp, void* next_sp);
void specdec_sim_fiber_entry();
}

namespace specdec::sim {

Stack::Stack(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_ = (bytes + page - 1) / page * page;
  void* mem = mmap(nullptr, size_ + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (mem == MAP_FAILED) throw std::bad_alloc();
  mprotect(mem, page, PROT_NONE);  // the guard page
  base_ = static_cast<char*>(mem) + page;
}

Stack::~Stack() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  munmap(base_ - page, size_ + page);
}

void start_fiber(Context& fiber, const Stack& stack, void (*fn)(void*), void* arg) {
  // The frame specdec_sim_switch pops, from the lowest address: x87 control word and MXCSR
  // (16 bytes), r15, r14, r13 (fn), r12 (arg), rbx, rbp, then the return address. The return
  // address sits 8 bytes below a 16-byte boundary, so the entry's call sees an aligned stack.
  auto top = reinterpret_cast<uintptr_t>(stack.top()) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top - 8);
  slot[0] = reinterpret_cast<uint64_t>(&specdec_sim_fiber_entry);
  slot[-1] = 0;                                     // rbp
  slot[-2] = 0;                                     // rbx
  slot[-3] = reinterpret_cast<uint64_t>(arg);       // r12
  slot[-4] = reinterpret_cast<uint64_t>(fn);        // r13
  slot[-5] = 0;                                     // r14
  slot[-6] = 0;                                     // r15
  auto* fp_state = reinterpret_cast<uint32_t*>(slot - 8);
  std::memset(fp_state, 0, 16);
  fp_state[0] = 0x037F;  // x87 control word: default
  fp_state[2] = 0x1F80;  // MXCSR: default (round to nearest, exceptions masked)
  fiber.sp = fp_state;
}

void switch_to(Context& from, const Context& to) { specdec_sim_switch(&from.sp, to.sp); }

}  // namespace specdec::sim

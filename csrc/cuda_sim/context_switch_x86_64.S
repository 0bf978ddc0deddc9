// specdec_sim_switch(void** save_sp, void* next_sp): saves the callee-saved registers (System V
// x86-64: rbx, rbp, r12-r15, the x87 control word, MXCSR) on the current stack, stores the stack
// pointer in *save_sp, switches to next_sp and restores what was saved there. A fresh fiber's
// stack holds the frame that fiber.cpp builds: it returns into specdec_sim_fiber_entry with the
// fiber's argument in r12 and its function in r13.
    .text
    .globl specdec_sim_switch
    .hidden specdec_sim_switch
    .type specdec_sim_switch, @function
specdec_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    fldcw (%rsp)
    ldmxcsr 8(%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size specdec_sim_switch, .-specdec_sim_switch

    .globl specdec_sim_fiber_entry
    .hidden specdec_sim_fiber_entry
    .type specdec_sim_fiber_entry, @function
specdec_sim_fiber_entry:
    movq %r12, %rdi
    callq *%r13
    ud2  // a fiber's function never returns: it switches away for good
    .size specdec_sim_fiber_entry, .-specdec_sim_fiber_entry

    .section .note.GNU-stack,"",@progbits

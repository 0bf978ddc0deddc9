"""Pacing of batches: what counts as the batch's progress, and when it stops proposing."""

import torch

from specdec.loop.pacing import Pacing, laggard


def run(pacing: Pacing, steps: int, speculative, one_token_ms: float = 1.0,
        finish_at: tuple[int, int] = (1 << 30, 1 << 30)) -> list:
    """Drives ``pacing`` like the loop over two rows: ``speculative(step)`` gives the tokens
    each row emits and the step's ms when proposing; a one-token step emits one per row. Row i
    stops after ``finish_at[i]`` tokens. Returns the budgets."""
    generated, finish_at = torch.zeros(2, dtype=torch.long), torch.tensor(finish_at)
    budgets = []
    for step in range(steps):
        going = generated < finish_at
        budgets.append(pacing.budget(generated, going))
        if budgets[-1] is None:
            emitted, ms = speculative(step)
        else:
            emitted, ms = [1, 1], one_token_ms
        generated += torch.where(going, torch.tensor(emitted), 0)
        pacing.observe(generated, generated < finish_at, ms)
    return budgets


def test_rows_copying_at_different_steps_keep_the_batch_proposing():
    # Each row takes 8 tokens every other step and 1 in between, out of phase: the batch's
    # laggard advances 9 tokens per two steps of 1.3 ms, against 1 per 1 ms step without.
    # (The fewest tokens a row emitted in a step is 1 every step: counted that way, the batch
    # would fall back to one-token steps.)
    pacing = Pacing()
    budgets = run(pacing, 40, lambda step: ([8, 1] if step % 2 else [1, 8], 1.3))
    assert budgets.count(0) == 2  # the two steps that measured one-token decoding
    assert pacing.speculative.value > 2 * pacing.one_token.value


def test_a_row_that_never_copies_sets_the_pace():
    # One row copies 8 tokens every step, the other never gets a candidate accepted: proposing
    # advances the batch's end one token per 1.3 ms step, slower than one-token steps.
    pacing = Pacing()
    budgets = run(pacing, 40, lambda step: ([9, 1], 1.3))
    later = budgets[8:]
    assert later.count(0) >= 0.8 * len(later)
    assert later.count(None) >= 1  # still tried now and then


def test_the_laggard_is_the_row_still_going_with_the_fewest_tokens():
    generated = torch.tensor([3, 9, 5])
    assert int(laggard(generated, torch.tensor([True, True, True]))) == 3
    assert int(laggard(generated, torch.tensor([False, True, True]))) == 5
    # Nothing going: a step that ended the batch is not measured.
    pacing = Pacing()
    pacing.budget(generated, torch.tensor([True, True, True]))
    pacing.observe(generated + 1, torch.tensor([False, False, False]), 1.0)
    assert pacing.speculative.count == 0


def test_rows_that_stop_leave_the_laggard_to_the_others():
    # Row 0 stops after its first step (2 tokens); from then on the batch waits for row 1 only,
    # which has 8: the step advanced the batch's end from 0 to 8 tokens, the next one by 8.
    pacing = Pacing()
    run(pacing, 2, lambda step: ([2, 8], 1.0), finish_at=(2, 100))
    assert pacing.speculative.count == 2
    assert pacing.speculative.value == 8.0  # 16 tokens in 2 ms


def test_while_requests_wait_the_batch_total_counts():
    # Row 0 copies 8 tokens a step (2 ms), row 1 never copies: the laggard advances 1 per step
    # either way, so by the laggard one-token steps (1 ms) win; while requests wait, the batch's
    # total (9 per 2 ms against 2 per 1 ms) makes proposing win. A change restarts the estimates.
    def copies(step):
        return [8, 1], 2.0

    assert run(Pacing(), 24, copies)[-8:].count(0) >= 7
    waiting = Pacing()
    waiting.measure_total(True)
    assert run(waiting, 24, copies)[-8:].count(None) >= 7
    waiting.measure_total(False)
    assert waiting.speculative.count == waiting.one_token.count == 0

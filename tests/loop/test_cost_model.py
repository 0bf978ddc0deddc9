"""CostModel under changing load: a slow spell of the machine raises the pass-cost estimates the
adaptive policies size their proposals by; once the spell has gone the policy returns to the
shape it chose before (issue 29: prompt lookup once stayed at 1.7 tokens per pass after a spell
of installs and builds, where it runs 6.3). Costs are synthetic: nothing here is timed."""

from specdec.loop.cost_model import EXPLORE_EVERY, AcceptanceEstimate, CostModel

# One row over n tokens, as measured on a 2-core CPU: wide passes cost little more than one-token
# passes (piecewise linear through 1: 100 ms, 8: 140 ms, 16: 180 ms; 5 ms per token beyond).
LIMIT = 10  # most candidates per step


def normal_ms(n: int) -> float:
    if n <= 8:
        return 100.0 + (n - 1) * 40.0 / 7
    return 140.0 + (n - 8) * 5.0


def spell_ms(n: int, step: int) -> float:
    """During the spell a one-token pass costs what it did, a wider one 4 to 8 times more (other
    processes take the cores a wide pass's threads would use)."""
    return normal_ms(n) if n == 1 else normal_ms(n) * (4 + step % 5)


def chosen(costs: CostModel, acceptance: AcceptanceEstimate, step: int) -> int:
    """The candidates prompt lookup proposes at batch 1 (CopyChain.propose: the length that
    maximises expected tokens per ms, or one candidate on exploring steps when none pays)."""
    explore = step % EXPLORE_EVERY == 0
    return costs.best_length(acceptance, LIMIT) or int(explore)


def test_a_slow_spell_does_not_keep_the_policy_small_after_it_has_gone():
    """60 normal steps, 30 slow ones, then normal again. Each step's pass (the chosen candidates
    and the root) is measured as the loop measures it (`observe_tokens`). The acceptance is held
    at a copying text's (0.9 per candidate) so that only the costs move the policy."""
    # At batch 1 on a CPU without `pass_costs` (the README demo) the estimates are only what
    # decoding measured. (With a profile, its unmeasured wide points cap the narrower widths'
    # prices, and this spell does not shrink the policy at all.)
    costs = CostModel()
    acceptance = AcceptanceEstimate(prior=0.9)
    shapes = []
    for step in range(1, 141):
        g = chosen(costs, acceptance, step)
        shapes.append(g)
        slow = 60 < step <= 90
        costs.observe_tokens(g + 1, spell_ms(g + 1, step) if slow else normal_ms(g + 1))
    before, spell, after = shapes[:60], shapes[60:90], shapes[90:]
    idle = before[-1]
    assert idle == LIMIT and set(before[10:]) == {idle}  # wide passes pay on this machine
    assert min(spell) <= 1  # the spell made wide passes too dear: the policy shrank
    # Bound: within EXPLORE_EVERY steps of the spell's end the policy measures a width the spell
    # raised (an exploring step); that pass, far below its estimate, shows the spell has gone,
    # and the estimates the spell raised go back to what they were before it. One step more to
    # act on them.
    back = EXPLORE_EVERY + 1
    assert set(after[back:]) == {idle}, after


def test_an_estimate_far_above_a_new_measurement_is_replaced_but_noise_is_smoothed():
    """The pieces of the policy: a measurement within OUTLIER of the estimate is smoothed (a
    noisy machine does not move the price much); one far below it replaces it, and brings back
    every point the spell raised to the lowest it has been, while points the spell did not
    raise keep their estimates."""
    costs = CostModel({1: 100.0, 8: 140.0, 16: 180.0})
    costs.observe_tokens(8, 120.0)  # noise: smoothed
    assert costs.target_ms[8] == 0.8 * 140.0 + 0.2 * 120.0
    for _ in range(30):  # a spell: 8 and 16 raised, step by step (at most OUTLIER x each)
        costs.observe_tokens(8, 1000.0)
        costs.observe_tokens(16, 1500.0)
    assert costs.target_ms[8] > 600 and costs.target_ms[16] > 900 and costs.target_ms[1] == 100.0
    costs.observe_tokens(16, 185.0)  # the spell has gone
    assert costs.target_ms[16] == 185.0
    assert costs.target_ms[8] == 0.8 * 140.0 + 0.2 * 120.0  # the lowest it has been
    assert costs.target_ms[1] == 100.0


def test_one_measured_pass_prices_a_far_wider_one_by_its_tokens():
    """With one pass measured there is no trend yet: a pass one node wider is tried (priced as the
    measured one), a far wider one is not priced as free. Then the chain grows to the length the
    true costs pay for, and stays at one-token passes where a pass costs what its tokens do
    (compute-bound), apart from the exploring steps."""
    acceptance = AcceptanceEstimate(prior=0.6)
    assert CostModel({1: 100.0}).best_length(acceptance, LIMIT) == 1
    # Below the one point the price is proportional: the one-token pass is what gets measured next.
    assert CostModel({16: 100.0}).best_length(acceptance, 30) == 0

    def lengths(pass_ms):
        costs, out = CostModel({}), []
        for step in range(1, 25):
            g = chosen(costs, acceptance, step) if costs.target_ms else 0
            costs.observe_tokens(g + 1, pass_ms(g + 1))
            out.append(g)
        return out

    best = max(range(LIMIT + 1), key=lambda g: acceptance.expected(g) / normal_ms(g + 1))
    cpu = lengths(normal_ms)
    assert best > 1 and cpu[1] == 1 and cpu[-1] == best
    compute_bound = lengths(lambda n: 100.0 * n)  # one candidate tried once, then none pays
    assert compute_bound[1] == 1
    assert all(g == 0 for step, g in enumerate(compute_bound, 1) if step > 2 and step % EXPLORE_EVERY)

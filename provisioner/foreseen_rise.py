"""Whether to buy ahead for a rise the forecaster foresees but cannot promise.

Why: capacity bought when a rise starts serves only after the boot, so the
rise's first ``react_s`` (boot plus a control step) go to spill at ``c_λ`` per
request. A forecaster with a calendar of recurring rises
(``predictor.rise_calendar``) knows, per step, the chance ``p`` that one is
under way and the rate it would bring; whether that is worth buying for is a
price question, so it is decided here, not in the forecast.

One instance of capacity ``C`` at ``π`` per second, ``c_o = π / C`` its price per
request at full use. Bought ahead, it is paid ``lead_s`` (the boot) before the
rise. If the rise comes it saves ``C·c_λ·react_s`` of spill and costs
``π·lead_s`` more than buying it when the rise starts; if not, it is paid
``lead_s + hold_s`` (``hold_s``: the cool-down or the billing minimum before it
may be retired) for nothing. It pays when

    p·(c_λ·react_s − c_o·lead_s) > (1 − p)·c_o·(lead_s + hold_s),

i.e. at ``p ≥ p* = c_o·(lead_s + hold_s) / (c_λ·react_s + c_o·hold_s)``: the
newsvendor's ratio again (as in ``provisioner.capacity_target``), with a false
alarm as the cost of being long. Cheap instances against Lambda (a GPU type,
spot) buy ahead for a rise that comes one day in five; dear ones (a large CPU
model) only for a rise that nearly always comes. While spill's price is not
known (not yet measured to answer in time), a rise's first minutes would be
misses, not charges, which the SLO's miss budget and the SLO monitor are there
for: buy ahead only for a rise that came on every day seen (``p = 1``). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from provisioner.capacity_target import cheapest_per_request
from provisioner.greedy import PlannerOption

UNPRICED_CHANCE = 1.0
"""``p*`` while spill's price is unknown: only a certain rise."""


def buy_ahead_chance(
    spill_cost_per_request: float | None,
    options: Sequence[PlannerOption],
    *,
    lead_s: float,
    react_s: float,
    hold_s: float,
) -> float:
    """``p*``: the least chance of a foreseen rise worth buying capacity ahead for."""
    c_o = cheapest_per_request(options)
    if spill_cost_per_request is None or c_o is None:
        return UNPRICED_CHANCE
    c_l = spill_cost_per_request
    denominator = c_l * react_s + c_o * hold_s
    if denominator <= 0.0:
        return 1.0
    return min(1.0, c_o * (lead_s + hold_s) / denominator)


def with_rises(
    forecast: Sequence[float],
    chance: Sequence[float],
    rate: Sequence[float],
    least_chance: float,
) -> tuple[list[float], int]:
    """``forecast`` raised to each foreseen rise's rate where its chance is at least
    ``least_chance``; and how many steps were raised. Steps past ``chance`` stand."""
    out = list(forecast)
    raised = 0
    for k in range(min(len(out), len(chance), len(rate))):
        if chance[k] > 0.0 and chance[k] >= least_chance and rate[k] > out[k]:
            out[k] = rate[k]
            raised += 1
    return out, raised

"""The control loop's shell: snapshot → pure step → reconcile and record.

``Controller`` is the one writer of the control state; ``history`` reads the
load and forecasts it; ``snapshot`` turns ports into the values a step reads;
``step_runner`` carries one model's planning step out; ``reconcile`` acts on
the fleet; ``recorder`` writes states, decisions, plans and the ledger;
``setup`` builds the options and predictors every world uses; ``profiles`` rates
each offering from its best profile; ``health`` tracks what the agents report;
``durable`` saves the control state a restart needs and holds the leader lease;
``retiring`` tells the other frontends, through the store, what is about to end.
"""

from mark.control.controller import Controller
from mark.control.history import cold_start_forecaster, max_rate_per_minute
from mark.control.reconcile import LIVE, launch_token
from mark.control.setup import build_options, measure_latency, online_predictor, resolve_source
from mark.control.step_runner import StepResult

__all__ = [
    "LIVE",
    "Controller",
    "StepResult",
    "build_options",
    "cold_start_forecaster",
    "launch_token",
    "max_rate_per_minute",
    "measure_latency",
    "online_predictor",
    "resolve_source",
]

"""``mark report``: what serving cost, from the ledger, and what the paper's baseline would have.

- ``aggregate``: ledger + instance events → priced charges → rows by day, model,
  type, component and status (pure).
- ``counterfactual``: the same recorded load under SageMaker target tracking
  (``provisioner.target_tracking``, as SageMaker behaves), priced per second at
  the ml.* hosting price (pure).
- ``capacity``: the baseline type's capacity, as the controller computes it.
- ``collect``: reads the store; ``render``: table, JSON, CSV, PNG.
"""

from mark.report.aggregate import Charge, Row, Totals, aggregate, collect_charges, totals
from mark.report.counterfactual import Counterfactual, target_tracking_cost
from mark.report.render import Report, build_report

__all__ = [
    "Charge",
    "Counterfactual",
    "Report",
    "Row",
    "Totals",
    "aggregate",
    "build_report",
    "collect_charges",
    "target_tracking_cost",
    "totals",
]

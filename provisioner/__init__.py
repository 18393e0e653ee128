"""The planning policies of MArk (paper §4.3-4.5), pure: plain data in, decisions out.

- ``perf_model``: an instance's throughput and latency (M/D/c, batching), a
  seeded queue simulation, capacity under a percentile SLO.
- ``profiles``: the paper's published profiles (shipped in ``data/``).
- ``batching``: the §4.3 tuner for N_batch, W_batch and μ*.
- ``options``: profile + price → ``PlannerOption``.
- ``greedy``: Algorithm 1, with a reason for every instance kept or bought.
- ``milp``: the clairvoyant optimum (HiGHS), a lower bound for any planner.
- ``rolling``: replays a planner step by step, priced like the MILP.
- ``capacity_target``, ``foreseen_rise``: how much of a step's peak, and of a
  rise foreseen but not certain, is worth instances rather than spill.
- ``guards``: launch now, reuse, cool-down, billing minimum, fleet cap.
- ``slo_monitor``: §4.4 reactive backups.
- ``spot``: §4.5 standbys, interruption response, avoidance, diversification.

Nothing here imports ``mark``, reads the clock or does I/O beyond the explicit
profile loader.
"""

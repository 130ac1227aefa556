"""What a configuration becomes before anything runs: the typed config, the models it serves, and the plan
(plan/planner.py, the one place that computes placement, counts, threads and limits)."""

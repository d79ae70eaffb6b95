"""Empirical privacy audits: lower bounds on ε measured from what a run releases.

- :mod:`dpfy.audit.stats`: the one-run test of Steinke, Nasr & Jagielski (2023);
- :mod:`dpfy.audit.fdp`: its f-DP variant (Mahloujifar et al. 2024);
- :mod:`dpfy.audit.gdp_estimate`: the Gaussian-DP estimate of ε (Nasr et al. 2023);
- :mod:`dpfy.audit.two_run`: many runs with and without one canary, Clopper–Pearson;
- :mod:`dpfy.audit.canaries`: white-box gradient canaries inserted in dpfy's own private step,
  scored at every step;
- :mod:`dpfy.audit.sink`: coordinates no real example touches, for Dirac canaries;
- :mod:`dpfy.audit.plant`: a noise bug planted behind the ledger's back (power tests only);
- :mod:`dpfy.audit.result`: the claimed ε beside the bounds (printing, JSON, report section);
- :mod:`dpfy.audit.run`: an audited training run (``dpfy audit``).

An audit never changes what is accounted: the claimed ε is read from the run's ledger, and
the audit's bound is evidence beside it (a bound above the claim means the code does not do
what the ledger says). See docs/audit.md.
"""

from dpfy.audit.fdp import fdp_epsilon
from dpfy.audit.stats import AuditBound, one_run_epsilon

__all__ = ["AuditBound", "one_run_epsilon", "fdp_epsilon"]

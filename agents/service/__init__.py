"""The control service core, without HTTP: tenants, planning, safe windows, journalled commits, audits.

* :mod:`agents.service.core`: :class:`~agents.service.core.ControlService`, which owns the fabric;
  :mod:`agents.service.device_commit` (its device commits and faults), :mod:`agents.service.operator` and
  :mod:`agents.service.startup_mixin` (start-up, health, operator routes) and :mod:`agents.service.sharing` are
  its mixins;
* :mod:`agents.service.jobs`: tenants, placements and tokens; :mod:`agents.service.checks`: request checks
  and the errors the HTTP layer turns into statuses; :mod:`agents.service.decisions`: the decision record;
* :mod:`agents.service.planner` and :mod:`agents.service.memo`: planning a job's intent, remembered across
  iterations; :mod:`agents.service.ordered_commit`: the non-blocking order as journalled commits;
* :mod:`agents.service.metrics`: the Prometheus metrics of the service.

The HTTP layer is :mod:`agents.http`, the command line :mod:`agents.cli`.
"""

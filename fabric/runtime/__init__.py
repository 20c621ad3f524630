"""The fabric controller's effectful runtime: the journal on disk, commits to devices, reconciliation.

The planning core (:mod:`fabric.topology`, :mod:`fabric.intent`, :mod:`fabric.traffic`,
:mod:`fabric.allocator`, :mod:`fabric.plan`, :mod:`fabric.controller`, :mod:`fabric.safe_window`,
:mod:`fabric.reconfig_order`, :mod:`fabric.cost`, :mod:`fabric.templates`) is pure: it imports no
storage and no sockets, so the simulator reuses it as it is. What touches a disk or a device lives
here and in :mod:`fabric.ocs`:

* :mod:`fabric.runtime.store` (with ``store_file``, ``store_records`` and ``store_checkpoint``): the
  SQLite journal;
* :mod:`fabric.runtime.commit`: journalled commits that drive every device of a step at once;
* :mod:`fabric.runtime.reconcile`: bring devices back to the journal after a crash or a failed step.

Nothing is re-exported here, so importing one of them never imports the others.
"""

"""The processes of a broker: how they start, stop and never outlive each other.

* ``lifecycle``: signals before the event loop, children that die with the server
  (``PR_SET_PDEATHSIG``, ``set_parent_death_signal``), the launch reaper, the serving GC.
* ``datadir``: the data directory's lock, its endpoints file, ``table_session``.
* ``supervisor``: ``pipeline serve --brokers N``, N broker processes under one supervisor.
"""

"""opus-testbed: experiments on photonic rails, from a YAML file to plots.

The path of a run, one folder per stage::

    experiment/  the experiment file, prepare (schedule + plan), sweeps, cross-validation
      -> workloads/ (top level)  model + parallelism -> per-rank schedule
    plan/        the schedule lowered to per-rank replay plans (lanes, ring steps)
      -> controller/ (top level)  Opus core, shim, service; controller/drivers/ the OCS drivers
    emulated/    the run on Mininet/OVS (runner, rank replayer)   -> emulator/ (top level)
    simulator/   the run on a virtual clock (network model, event engine, scale bench)
    metrics/     iteration time, exposed switching, windows; the fidelity guard
    results/     the results directory (manifest, tables, summary, plots)

Beside the path: ``cli/`` (the ``opus-testbed`` command line, glue only), ``cost/`` (electrical
vs photonic rails: cost and power), ``check.py`` (prerequisites) and ``errors.py``.
"""

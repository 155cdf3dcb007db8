"""The run specification: the experiment file (``config.py``), injected faults (``faults.py``)
and a run prepared before anything starts (``prepare.py``). Both backends, the results, the
torch jobs and the studies import it; it imports none of them."""

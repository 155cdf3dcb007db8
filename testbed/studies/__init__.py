"""Studies: runs orchestrated on the backends. One run with its baseline (``run.py``), the
demo (``demo.py``), sweeps over delays and modes (``sweep.py``), the model-difference ladder
(``ladder.py``), cross-validation of the two backends (``crossval.py``) and the
collective-algorithm benches (``collective_bench.py``). Nothing below imports them."""

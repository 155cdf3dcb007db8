"""Host threads that issue ops (:attr:`workloads.schedule.TemplateOp.thread`).

A module of its own, without imports, so a rank process reading its plan names a thread
without loading the schedule module (numpy and the model builder).
"""

MAIN_THREAD = "main"
AUTOGRAD_THREAD = "autograd"
THREADS = (MAIN_THREAD, AUTOGRAD_THREAD)

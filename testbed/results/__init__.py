"""The results directory of a run or a sweep: files, summary and plots."""

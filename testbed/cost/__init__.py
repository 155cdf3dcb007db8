"""Electrical vs photonic rails: bills of materials, cost and power (paper Fig. 7, Table 3)."""

"""Across runs (DESIGN.md 4.13): operation keys (`executions`: the rows, taken, settled, waited
for, one more allowed) and the executor's gate before a keyed or limited call (`gate`)."""

"""The stages of one case: build (the model, its weights and inputs), capture (each
reference's probes), oracle (the float64 runs), judge (the rows). harness/case.py runs them."""

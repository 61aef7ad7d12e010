"""Results and what is done with them: metrics, SLOs, saturation, sweeps, capacity, plots."""

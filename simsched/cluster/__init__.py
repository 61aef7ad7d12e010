"""Many replicas on one clock: the SimPy driver of a run, routers and disaggregation."""

"""Measured tuning (the AOE of opfuse): paired, interleaved latency measurement on a
runtime, the candidate settings of a model, and the search that keeps what is faster."""

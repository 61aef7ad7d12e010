"""Checks of the SGLang and TensorRT-LLM engines (not speed benchmarks): SGLang parity
(:mod:`.parity`, :mod:`.parity_driver`, :mod:`.parity_cases`) and a first look at silicon rows
(:mod:`.silicon_check`)."""

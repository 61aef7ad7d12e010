"""Step-for-step parity of simsched's scheduler with vLLM's own V1 scheduler.

:mod:`.cases` draws seeded cases (an engine's limits and a request list), :mod:`.sim` runs one in
simsched and reads its public per-step record, :mod:`.engine` (needs vLLM) drives vLLM's real
``Scheduler`` on it, and :mod:`.compare` lines the two up step by step.
``benchmarks/vllm_parity.py`` is the command; ``docs/parity.md`` says what is compared.
"""

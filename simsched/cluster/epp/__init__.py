"""llm-d's inference scheduler (the endpoint picker's scheduling cycle) as the ``llm-d`` router.

:mod:`~simsched.cluster.epp.plugins` (load scorers, role filters, pickers),
:mod:`~simsched.cluster.epp.prefix` (the approximate prefix cache producer and scorer),
:mod:`~simsched.cluster.epp.pd` (the P/D profile handler and deciders),
:mod:`~simsched.cluster.epp.admission` (admission of sheddable requests),
:mod:`~simsched.cluster.epp.config` (llm-d's ``EndpointPickerConfig`` YAML) and
:mod:`~simsched.cluster.epp.router` (the router, registered as ``llm-d``). See docs/llm_d.md.
"""

from simsched.cluster.epp.config import DEFAULT_CONFIG, PLUGIN_TYPES, parse  # noqa: F401
from simsched.cluster.epp.router import LlmD  # noqa: F401

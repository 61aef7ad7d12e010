"""llm-d's P/D (prefill/decode disaggregation) profile handler and its deciders.

``disagg-profile-handler`` (and its legacy alias ``pd-profile-handler``), with the deciders
``prefix-based-pd-decider`` and ``always-disagg-pd-decider``, from
``pkg/epp/framework/plugins/scheduling/profilehandler/disagg`` of
llm-d/llm-d-inference-scheduler (commit 520af47896e5f06e43d09aca281a1149187b0ffd).

The handler runs the decode profile first; its pick is the request's decode endpoint. Then the
prefill decider looks at that endpoint's approximate prefix match: when the prompt's uncached
tokens (prompt tokens - matched blocks x block size) reach ``nonCachedTokens``, the prefill
profile runs and its pick prefills the prompt (the KV then moves to the decode endpoint);
otherwise the decode endpoint serves the request whole. simsched runs this in a disaggregated
cluster (``cluster.roles``): the decode profile over the decode and mixed replicas, the prefill
profile over the prefill and mixed ones (:mod:`simsched.cluster.disagg`). The encode stage
(multimodal E/P/D) is accepted in the parameters but never runs: simsched's requests are text.
"""

from __future__ import annotations

from typing import Mapping

from simsched.cluster.epp.plugins import Plugin, _int_param


class PrefixBasedPDDecider(Plugin):
    """``prefix-based-pd-decider``: disaggregate when the decode endpoint's uncached part of the
    prompt is at least ``nonCachedTokens`` (0, the default, disables disaggregation)."""

    TYPE, KIND, CONSUMES = "prefix-based-pd-decider", "decider", ("prefix",)
    PARAMETERS = {"nonCachedTokens": 0}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        n = _int_param(self.TYPE, "nonCachedTokens", self.params["nonCachedTokens"])
        if n < 0:
            raise ValueError("nonCachedTokens parameter of prefix disaggregation decider cannot "
                             "be negative")
        self.non_cached_tokens = n

    def disaggregate(self, input_tokens: int, matched_blocks: int | None,
                     block_size: int) -> bool:
        """Whether to run the prefill profile for a prompt of ``input_tokens`` whose decode
        endpoint matched ``matched_blocks`` blocks of ``block_size`` tokens (None: no prefix
        information, as Go's missing endpoint or attribute: no)."""
        t = self.non_cached_tokens
        if t == 0 or matched_blocks is None or input_tokens < t:
            return False
        return input_tokens - matched_blocks * block_size >= t


class AlwaysDisaggPDDecider(Plugin):
    """``always-disagg-pd-decider``: always run the prefill profile."""

    TYPE, KIND = "always-disagg-pd-decider", "decider"

    def disaggregate(self, input_tokens: int, matched_blocks, block_size: int) -> bool:
        """Always True."""
        return True


_FLAT = ("decodeProfile", "prefillProfile", "encodeProfile", "prefillDeciderPluginName",
         "encodeDeciderPluginName", "deciderPluginName")


class DisaggProfileHandler(Plugin):
    """``disagg-profile-handler``: decode first, then prefill if the decider says so.

    Parameters as in Go: ``profiles`` (``decode`` default "decode", ``prefill`` default
    "prefill", ``encode`` default "encode") and ``deciders`` (``prefill``, ``encode``: plugin
    names; no prefill decider disables P/D), or the deprecated flat ones (``decodeProfile``,
    ``prefillProfile``, ``encodeProfile``, ``deciderPluginName`` / ``prefillDeciderPluginName``,
    ``encodeDeciderPluginName``); mixing the two forms is refused.
    """

    TYPE, KIND = "disagg-profile-handler", "handler"
    PARAMETERS = {"profiles": {}, "deciders": {}, **{k: "" for k in _FLAT}}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        p, t = self.params, self.TYPE
        profiles, deciders = p["profiles"], p["deciders"]
        for key, value, known in (("profiles", profiles, ("decode", "prefill", "encode")),
                                  ("deciders", deciders, ("prefill", "encode"))):
            if not isinstance(value, Mapping) or set(value) - set(known) \
                    or not all(isinstance(v, str) for v in value.values()):
                raise ValueError(f"{t} parameter {key} must map {list(known)} to names, "
                                 f"got {value!r}")
        for k in _FLAT:
            if not isinstance(p[k], str):
                raise ValueError(f"{t} parameter {k} must be a string, got {p[k]!r}")
        flat = {k: p[k] for k in _FLAT if p[k]}
        if flat and (profiles or deciders):
            raise ValueError(f"{t}: cannot mix deprecated flat parameters ({sorted(flat)}) with "
                             "nested parameters (profiles, deciders): use one format or the other")
        self.decode_profile = profiles.get("decode") or p["decodeProfile"] or "decode"
        self.prefill_profile = profiles.get("prefill") or p["prefillProfile"] or "prefill"
        self.encode_profile = profiles.get("encode") or p["encodeProfile"] or "encode"
        self.decider_name = deciders.get("prefill") or p["prefillDeciderPluginName"] \
            or p["deciderPluginName"] or None
        self.encode_decider_name = deciders.get("encode") or p["encodeDeciderPluginName"] or None
        self.decider = None     # bound by the config reader (it knows the plugins)

    def bind(self, plugins: dict, where: str) -> None:
        """Resolve the decider names to plugins; a missing or wrong one is refused."""
        for attr, role in (("decider_name", "prefill"), ("encode_decider_name", "encode")):
            name = getattr(self, attr)
            if name is None:
                continue
            plugin = plugins.get(name)
            if plugin is None:
                raise ValueError(f"{where}: {self.name}: deciders.{role} plugin not found: "
                                 f"{name}")
            if not hasattr(plugin, "disaggregate"):
                raise ValueError(f"{where}: {self.name}: plugin {name} ({plugin.TYPE}) is not "
                                 "a decider")
            if role == "prefill":
                self.decider = plugin

    def run_prefill(self, input_tokens: int, matched_blocks, block_size: int) -> bool:
        """Whether the prefill profile runs, once the decode profile picked (Go's Pick)."""
        return self.decider is not None and self.decider.disaggregate(
            input_tokens, matched_blocks, block_size)


class PdProfileHandler(DisaggProfileHandler):
    """``pd-profile-handler``, the deprecated form: ``decodeProfile``, ``prefillProfile``,
    ``deciderPluginName`` (default ``prefix-based-pd-decider``, which must then be defined),
    ``prefixPluginType`` / ``prefixPluginName`` (accepted: simsched's decider reads the one
    prefix producer), ``primaryPort`` (data-parallel port, 0 or 1-65535; no effect here)."""

    TYPE = "pd-profile-handler"
    PARAMETERS = {"decodeProfile": "decode", "prefillProfile": "prefill",
                  "prefixPluginType": "prefix-cache-scorer", "prefixPluginName": "",
                  "primaryPort": 0, "deciderPluginName": "prefix-based-pd-decider"}

    def __init__(self, name: str = "", **params) -> None:
        Plugin.__init__(self, name, **params)
        p, t = self.params, self.TYPE
        for k in ("decodeProfile", "prefillProfile", "prefixPluginType", "prefixPluginName",
                  "deciderPluginName"):
            if not isinstance(p[k], str):
                raise ValueError(f"{t} parameter {k} must be a string, got {p[k]!r}")
        port = _int_param(t, "primaryPort", p["primaryPort"])
        if port != 0 and not 1 <= port <= 65535:
            raise ValueError(f"invalid primaryPort: must be between 1 and 65535, got {port}")
        if not p["deciderPluginName"]:
            raise ValueError(f"{t}: decider plugin name is not defined")
        self.decode_profile = p["decodeProfile"] or "decode"
        self.prefill_profile = p["prefillProfile"] or "prefill"
        self.encode_profile = "encode"
        self.decider_name, self.encode_decider_name = p["deciderPluginName"], None
        self.decider = None


PD = (PrefixBasedPDDecider, AlwaysDisaggPDDecider, DisaggProfileHandler, PdProfileHandler)

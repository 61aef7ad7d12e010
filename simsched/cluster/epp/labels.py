"""llm-d's label plugins: ``by-label`` and the role filters, and ``context-length-aware``.

Kubernetes pods carry labels; simsched's replicas get theirs from the router option ``labels``
(one mapping per replica, in the order of the router's first view; replicas without an entry
have none). Source: ``pkg/epp/framework/plugins/scheduling/filter/bylabel`` and
``scheduling/scorer/contextlengthaware`` of llm-d/llm-d-inference-scheduler (commit
520af47896e5f06e43d09aca281a1149187b0ffd).
"""

from __future__ import annotations

from collections.abc import Mapping

from simsched.cluster.epp.plugins import Plugin

ROLE_LABEL = "llm-d.ai/role"
CONTEXT_LABEL = "llm-d.ai/context-length-range"


def _check_str(plugin: str, name: str, value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{plugin} parameter {name} must be a string, got {value!r}")
    return value


class ByLabel(Plugin):
    """``by-label``: keep endpoints whose ``label`` has one of ``validValues`` (and, with
    ``allowsNoLabel``, those without the label)."""

    TYPE, KIND, CONSUMES = "by-label", "filter", ("labels",)
    PARAMETERS = {"label": "", "validValues": [], "allowsNoLabel": False}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        p, t = self.params, self.TYPE
        self.label = _check_str(t, "label", p["label"])
        values = p["validValues"]
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{t} parameter validValues must be a list of strings, got {values!r}")
        if not isinstance(p["allowsNoLabel"], bool):
            raise ValueError(f"{t} parameter allowsNoLabel must be true or false")
        if not values and not p["allowsNoLabel"]:
            raise ValueError(f"{t}: either validValues must be non-empty or allowsNoLabel true")
        self.valid = frozenset(values)
        self.allows_no_label = p["allowsNoLabel"]

    def filter(self, m, req, cycle, cands) -> list[int]:
        labels, key = m.labels, self.label
        kept = []
        for i in cands:
            value = labels[i].get(key)
            if (value is None and self.allows_no_label) or value in self.valid:
                kept.append(i)
        return kept


class _Role(ByLabel):
    """A role filter: ``by-label`` on ``llm-d.ai/role`` with fixed values (no parameters)."""

    PARAMETERS: dict = {}
    VALUES: tuple = ()
    NO_LABEL = False

    def __init__(self, name: str = "", **params) -> None:
        Plugin.__init__(self, name, **params)
        self.label, self.valid, self.allows_no_label = ROLE_LABEL, frozenset(self.VALUES), \
            self.NO_LABEL


class DecodeFilter(_Role):
    """``decode-filter``: roles decode, prefill-decode, both, encode-prefill-decode, or no role
    label (so every unlabelled replica passes)."""

    TYPE = "decode-filter"
    VALUES = ("decode", "prefill-decode", "both", "encode-prefill-decode")
    NO_LABEL = True


class PrefillFilter(_Role):
    """``prefill-filter``: roles prefill, encode-prefill, prefill-decode, both,
    encode-prefill-decode; an unlabelled replica does not pass."""

    TYPE = "prefill-filter"
    VALUES = ("prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode")


class EncodeFilter(_Role):
    """``encode-filter``: roles encode, encode-prefill, encode-prefill-decode."""

    TYPE = "encode-filter"
    VALUES = ("encode", "encode-prefill", "encode-prefill-decode")


def parse_range(text) -> tuple[int, int] | None:
    """``"min-max"`` as ``(min, max)``; None where Go's parseContextRange errs."""
    if not isinstance(text, str) or not text:
        return None
    bounds = text.split("-")
    if len(bounds) != 2:
        return None
    try:
        low, high = int(bounds[0].strip()), int(bounds[1].strip())
    except ValueError:
        return None
    return None if low > high else (low, high)


def range_score(length: int, low: int, high: int) -> float:
    """Go's calculateRangeScore: in range (0.3, 1], tighter and roomier higher; out of range
    0.3 / (1 + distance / 1000)."""
    if low <= length <= high:
        width = high - low
        if width == 0:
            return 1.0
        raw = 0.7 * (1.0 / (1.0 + width / 10000.0)) + 0.3 * ((high - length) / width)
        return 0.3 + raw * 0.7
    distance = length - high if length > high else low - length
    return 0.3 / (1.0 + distance / 1000.0)


class ContextLengthAware(Plugin):
    """``context-length-aware``: scores endpoints by the request's context length against their
    ``label`` range (no label 0.5, a bad one 0); with ``enableFiltering`` it also filters out
    endpoints whose range excludes it. The context length is the prompt's tokens (as with
    llm-d's token-producer)."""

    TYPE, KIND, CONSUMES = "context-length-aware", "scorer", ("labels",)
    PARAMETERS = {"label": CONTEXT_LABEL, "enableFiltering": False}

    def __init__(self, name: str = "", **params) -> None:
        super().__init__(name, **params)
        self.label = _check_str(self.TYPE, "label", self.params["label"])
        if not self.label:
            raise ValueError(f"{self.TYPE}: label must not be empty")
        if not isinstance(self.params["enableFiltering"], bool):
            raise ValueError(f"{self.TYPE} parameter enableFiltering must be true or false")
        self.filtering = self.params["enableFiltering"]

    def score(self, m, req, cycle, cands) -> list[float]:
        n = getattr(req, "num_prompt_tokens", 0)
        out = []
        for i in cands:
            text = m.labels[i].get(self.label)
            if text is None:
                out.append(0.5)
                continue
            r = parse_range(text)
            out.append(0.0 if r is None else range_score(n, *r))
        return out

    def filter(self, m, req, cycle, cands) -> list[int]:
        if not self.filtering:
            return cands
        n = getattr(req, "num_prompt_tokens", 0)
        kept = []
        for i in cands:
            text = m.labels[i].get(self.label)
            if text is None:
                kept.append(i)
                continue
            r = parse_range(text)
            if r is not None and r[0] <= n <= r[1]:
                kept.append(i)
        return kept


LABELS = (ByLabel, DecodeFilter, PrefillFilter, EncodeFilter, ContextLengthAware)


def check_labels(labels):
    """The llm-d router's ``labels`` option as a tuple of string mappings (None stays None)."""
    if labels is None:
        return None
    if isinstance(labels, (str, bytes, Mapping)) or not isinstance(labels, (list, tuple)):
        raise ValueError(f"labels must be a list of mappings (one per replica), got {labels!r}")
    for i, entry in enumerate(labels):
        if not isinstance(entry, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in entry.items()):
            raise ValueError(f"labels[{i}] must map label names to string values, got {entry!r}")
    return tuple(labels)

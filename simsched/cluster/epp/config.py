"""Reading llm-d's ``EndpointPickerConfig`` (YAML or a mapping) into plugins and profiles.

The format is llm-d's own (``apix/config/v1alpha1/endpointpickerconfig_types.go``)::

    apiVersion: llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    plugins:
    - type: queue-scorer                  # name defaults to the type
    - name: picker
      type: max-score-picker
      parameters: {maxNumOfEndpoints: 1}
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: queue-scorer
        weight: 2                         # scorers only; default 1
      - pluginRef: picker

Defaults as in Go's loader (``pkg/epp/config/loader/defaults.go``): with no config, the default
profile (queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3, max-score-picker);
with no profile, one named ``default`` holding every filter, scorer and picker; a profile
without a picker gets a max-score-picker; a prefix-cache-scorer without a producer gets an
approx-prefix-cache-producer with its defaults. An unknown plugin type, parameter, field or
plugin reference is refused, naming it and the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from simsched.cluster.epp.admission import ADMISSION
from simsched.cluster.epp.affinity import AFFINITY
from simsched.cluster.epp.flowcontrol import FLOW_POLICIES, FlowController
from simsched.cluster.epp.labels import LABELS
from simsched.cluster.epp.latency import LATENCY
from simsched.cluster.epp.pd import PD
from simsched.cluster.epp.plugins import BUILTIN, MaxScorePicker
from simsched.cluster.epp.prefix import ApproxPrefixCacheProducer, PrefixCacheScorer
from simsched.cluster.epp.precise import PrecisePrefixCacheScorer
from simsched.cluster.epp.saturation import SATURATION, UtilizationDetector

PLUGIN_TYPES = {cls.TYPE: cls for cls in BUILTIN + AFFINITY + SATURATION + LABELS + PD + ADMISSION
                + FLOW_POLICIES + LATENCY
                + (ApproxPrefixCacheProducer, PrefixCacheScorer, PrecisePrefixCacheScorer)}
# Data-layer plugins of real configs: simsched reads the replicas' figures directly, so these
# have nothing to do here (accepted, without parameters, and ignored).
DATA_LAYER_TYPES = ("metrics-data-source", "core-metrics-extractor", "models-data-source",
                    "models-data-extractor", "openai-parser")
TOP_FIELDS = ("apiVersion", "kind", "plugins", "schedulingProfiles", "featureGates", "dataLayer",
              "parser", "saturationDetector", "flowControl")
FLOW_CONTROL_GATE = "flowControl"       # Go's flowcontrol.FeatureGate

DEFAULT_CONFIG: dict = {
    "apiVersion": "llm-d.ai/v1alpha1",
    "kind": "EndpointPickerConfig",
    "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
                {"type": "prefix-cache-scorer"}],
    "schedulingProfiles": [{"name": "default", "plugins": [
        {"pluginRef": "queue-scorer", "weight": 2.0},
        {"pluginRef": "kv-cache-utilization-scorer", "weight": 2.0},
        {"pluginRef": "prefix-cache-scorer", "weight": 3.0}]}],
}


class Profile:
    """A scheduling profile: filters, then (scorer, weight) pairs, then one picker."""

    def __init__(self, name: str, filters: list, scorers: list, picker) -> None:
        self.name = name
        self.filters = filters
        self.scorers = scorers
        self.picker = picker


class Pipeline:
    """The plugins of a config (by name), its profiles (the first is the primary, or the P/D
    handler's decode profile) and its P/D ``handler`` (None: single profile)."""

    def __init__(self, plugins: dict, profiles: list[Profile], handler=None,
                 detector=None, flow_control=None) -> None:
        self.plugins = plugins
        self.profiles = profiles
        self.handler = handler
        # Admission (simsched.cluster.epp.admission): the saturation detector legacy admission
        # reads, and the admitter plugins (every one defined is active, as in Go).
        self.detector = detector if detector is not None else UtilizationDetector()
        self.admitters = [p for p in plugins.values() if p.KIND == "admitter"]
        # Flow control (simsched.cluster.epp.flowcontrol), with its feature gate; None: legacy
        # admission (sheddable requests shed when the pool is saturated).
        self.flow_control = flow_control

    def profile(self, name: str) -> Profile:
        """The profile called ``name``."""
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(name)

    def producers(self, kind_type: str) -> list:
        """The plugins of type ``kind_type``."""
        return [p for p in self.plugins.values() if p.TYPE == kind_type]


def load_yaml(path: str | Path) -> Any:
    """The data of a YAML file (PyYAML); a missing file or bad YAML names the file."""
    try:
        import yaml
    except ImportError:     # pragma: no cover - a dependency of the package
        raise ValueError(f"reading {path} needs PyYAML (pip install pyyaml)") from None
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read llm-d config {path}: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None


def parse(data: Any, where: str = "EndpointPickerConfig", model: str = "") -> Pipeline:
    """The :class:`Pipeline` of an ``EndpointPickerConfig`` mapping (``where`` names its file
    in errors); None gives the default config."""
    if data is None:
        data = DEFAULT_CONFIG
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: an EndpointPickerConfig must be a mapping, got {data!r}")
    for key in data:
        if key not in TOP_FIELDS:
            raise ValueError(f"{where}: unknown field {key!r}; known: {list(TOP_FIELDS)}")
    if data.get("kind", "EndpointPickerConfig") != "EndpointPickerConfig":
        raise ValueError(f"{where}: kind must be EndpointPickerConfig, got {data.get('kind')!r}")
    plugins: dict = {}
    specs = data.get("plugins") or []
    if not isinstance(specs, list):
        raise ValueError(f"{where}: plugins must be a list, got {specs!r}")
    for n, spec in enumerate(specs):
        _add_plugin(plugins, spec, f"{where}: plugins[{n}]", model)
    handlers = [p for p in plugins.values() if hasattr(p, "run_prefill")]
    if len(handlers) > 1:
        raise ValueError(f"{where}: more than one profile handler "
                         f"({[p.name for p in handlers]})")
    handler = handlers[0] if handlers else None
    profiles = _profiles(data.get("schedulingProfiles"), plugins, where, handler)
    if handler is not None:
        handler.bind(plugins, where)
        if any(p.TYPE == "predicted-latency-producer" for p in plugins.values()):
            raise ValueError(f"{where}: predicted-latency-producer with {handler.name} (P/D "
                             "disaggregation) is not modelled")
        names = [p.name for p in profiles]
        for role in ("decode_profile", "prefill_profile"):
            if getattr(handler, role) not in names:
                raise ValueError(f"{where}: {handler.name} needs a scheduling profile named "
                                 f"{getattr(handler, role)!r} ({role.replace('_', ' ')}); "
                                 f"defined: {names}")
        # The decode profile runs first: it is the primary.
        profiles.sort(key=lambda p: p.name != handler.decode_profile)
    # Prefix-aware scorers read the producer's match info: injected when missing, as in Go.
    legacy = [p for p in plugins.values() if getattr(p, "producer_params", None)]
    has_producer = any(p.TYPE == ApproxPrefixCacheProducer.TYPE for p in plugins.values())
    if legacy and (has_producer or len({repr(sorted(p.producer_params.items()))
                                        for p in legacy}) > 1):
        raise ValueError(f"{where}: {legacy[0].name} has producer parameters "
                         f"{sorted(legacy[0].producer_params)}: give them to one "
                         f"{ApproxPrefixCacheProducer.TYPE} instead")
    if any("prefix" in p.CONSUMES for p in plugins.values()) and not has_producer:
        try:
            plugins[ApproxPrefixCacheProducer.TYPE] = ApproxPrefixCacheProducer(
                model=model, **(legacy[0].producer_params if legacy else {}))
        except ValueError as exc:
            raise ValueError(f"{where}: {legacy[0].name}: {exc}") from None
    gates = data.get("featureGates") or []
    if not isinstance(gates, list) or not all(isinstance(g, str) for g in gates):
        raise ValueError(f"{where}: featureGates must be a list of strings, got {gates!r}")
    # As Go: the flowControl section is read only with its feature gate on (ignored otherwise);
    # with the gate and no section, flow control runs with its defaults.
    flow = FlowController(data.get("flowControl"), plugins, where) \
        if FLOW_CONTROL_GATE in gates else None
    return Pipeline(plugins, profiles, handler,
                    _detector(data.get("saturationDetector"), plugins, where), flow)


def _detector(spec, plugins: dict, where: str):
    """The ``saturationDetector`` plugin (default: the ``utilization-detector`` one, or a new
    one with its defaults, as Go's loader injects)."""
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping) or set(spec) - {"pluginRef"}:
        raise ValueError(f"{where}: saturationDetector must be a mapping of pluginRef, got "
                         f"{spec!r}")
    ref = spec.get("pluginRef") or UtilizationDetector.TYPE
    plugin = plugins.get(ref)
    if plugin is None:
        if ref == UtilizationDetector.TYPE:
            return UtilizationDetector()
        raise ValueError(f"{where}: saturationDetector.pluginRef {ref!r} names no plugin; "
                         f"defined: {sorted(plugins)}")
    if not hasattr(plugin, "saturation"):
        raise ValueError(f"{where}: saturationDetector.pluginRef {ref!r} ({plugin.TYPE}) is not "
                         "a saturation detector")
    return plugin


def _add_plugin(plugins: dict, spec, where: str, model: str) -> None:
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where} must be a mapping with type, name and parameters")
    extra = set(spec) - {"type", "name", "parameters"}
    if extra:
        raise ValueError(f"{where} has unknown field(s) {sorted(extra)}")
    kind = spec.get("type")
    name = spec.get("name") or kind
    params = spec.get("parameters") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{where} ({kind}): parameters must be a mapping, got {params!r}")
    if kind in DATA_LAYER_TYPES:
        if params:
            raise ValueError(f"{where} ({kind}): simsched ignores data-layer plugins and takes no "
                             f"parameters for them, got {sorted(params)}")
        return
    cls = PLUGIN_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"{where}: unknown plugin type {kind!r}; simsched models "
                         f"{sorted(PLUGIN_TYPES)}")
    if not isinstance(name, str):
        raise ValueError(f"{where}: name must be a string, got {name!r}")
    if name in plugins:
        raise ValueError(f"{where}: plugin name {name!r} is used twice")
    unknown = [p for p in params if p not in cls.PARAMETERS]
    if unknown:
        raise ValueError(f"{where} ({kind}): unknown parameter(s) {unknown}; known: "
                         f"{sorted(cls.PARAMETERS)}")
    extra_args = {"model": model} if cls is ApproxPrefixCacheProducer else {}
    try:
        plugins[name] = cls(name, **dict(params), **extra_args)
    except ValueError as exc:
        raise ValueError(f"{where} ({kind}): {exc}") from None


def _profiles(specs, plugins: dict, where: str, handler=None) -> list[Profile]:
    if not specs:       # Go: one "default" profile with every filter, scorer and picker
        specs = [{"name": "default", "plugins": [
            {"pluginRef": n} for n, p in plugins.items()
            if p.KIND in ("filter", "scorer", "picker")]}]
    if not isinstance(specs, list):
        raise ValueError(f"{where}: schedulingProfiles must be a list, got {specs!r}")
    profiles = []
    for n, spec in enumerate(specs):
        at = f"{where}: schedulingProfiles[{n}]"
        if not isinstance(spec, Mapping) or set(spec) - {"name", "plugins"}:
            raise ValueError(f"{at} must be a mapping of name and plugins, got {spec!r}")
        filters, scorers, pickers = [], [], []
        for k, ref in enumerate(spec.get("plugins") or []):
            if not isinstance(ref, Mapping) or set(ref) - {"pluginRef", "weight"}:
                raise ValueError(f"{at}.plugins[{k}] must be a mapping of pluginRef and weight, "
                                 f"got {ref!r}")
            plugin = plugins.get(ref.get("pluginRef"))
            if plugin is None:
                raise ValueError(f"{at}.plugins[{k}]: pluginRef {ref.get('pluginRef')!r} names "
                                 f"no plugin; defined: {sorted(plugins)}")
            weight = ref.get("weight", 1.0)
            if plugin.KIND == "scorer":
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                        or not 0 <= weight < float("inf"):
                    raise ValueError(f"{at}.plugins[{k}] ({plugin.name}): weight must be a "
                                     f"finite number >= 0, got {weight!r}")
                scorers.append((plugin, float(weight)))
                if hasattr(plugin, "filter"):       # a scorer that filters too (Go: both roles)
                    filters.append(plugin)
            elif plugin.KIND == "filter":
                filters.append(plugin)
            elif plugin.KIND == "picker":
                pickers.append(plugin)
            elif plugin.KIND == "producer":
                pass            # producers run for every request (Go lists them in profiles too)
            else:
                raise ValueError(f"{at}.plugins[{k}]: {plugin.name} ({plugin.TYPE}) is a "
                                 f"{plugin.KIND}, not a filter, scorer, picker or producer")
        if len(pickers) > 1:
            raise ValueError(f"{at}: more than one picker ({[p.name for p in pickers]})")
        picker = pickers[0] if pickers else MaxScorePicker()
        profiles.append(Profile(spec.get("name", f"profile-{n}"), filters, scorers, picker))
    if len(profiles) > 1 and handler is None:
        raise ValueError(f"{where}: {len(profiles)} scheduling profiles need a profile handler "
                         "other than single-profile-handler (disagg-profile-handler)")
    return profiles

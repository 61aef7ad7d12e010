"""The ``simsched`` command's fault flags (``SimConfig.faults``, :mod:`simsched.config.faults`):
client deadlines, cancellations, retries, hedges, replica failures and degraded links."""

from __future__ import annotations

import argparse

__all__ = ["FAULT_FLAG_FIELDS", "add_fault_flags", "parse_failure", "parse_link_event"]

# flag destination -> config field
FAULT_FLAG_FIELDS = {
    "ttft_timeout": "faults.ttft_timeout", "request_timeout": "faults.request_timeout",
    "cancel_fraction": "faults.cancel_fraction", "max_num_attempts": "faults.max_num_attempts",
    "backoff_base_time": "faults.backoff_base_time", "backoff_jitter": "faults.backoff_jitter",
    "retry_budget": "faults.retry_budget", "hedge_delay": "faults.hedge_delay",
    "replica_failure": "faults.replica_failures", "mtbf": "faults.mtbf",
    "restart_time": "faults.restart_time", "link_event": "faults.link_events",
    "link_mtbf": "faults.link_mtbf", "on_link_down": "faults.on_link_down"}


def parse_failure(text: str) -> tuple:
    """``AT:REPLICA`` (``300:2``: replica 2 fails at t=300 s) as ``(300.0, 2)``."""
    at, sep, replica = text.strip().partition(":")
    try:
        return float(at), int(replica)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--replica-failure expects AT:REPLICA (seconds:index), e.g. 300:2, got {text!r}"
        ) from None


def parse_link_event(text: str) -> tuple:
    """``AT:DURATION:LINK:FRACTION`` (``60:30:0:0``: prefill replica 0's link is down from
    t=60 s for 30 s; ``LINK`` ``remote``: the remote KV tier's) as ``(60.0, 30.0, 0, 0.0)``."""
    parts = text.strip().split(":")
    try:
        if len(parts) != 4:
            raise ValueError
        link = parts[2] if parts[2] == "remote" else int(parts[2])
        return float(parts[0]), float(parts[1]), link, float(parts[3])
    except ValueError:
        raise argparse.ArgumentTypeError(
            "--link-event expects AT:DURATION:LINK:FRACTION (seconds, seconds, a prefill "
            f"replica index or 'remote', a bandwidth fraction; 0: down), e.g. 60:30:0:0, got "
            f"{text!r}") from None


class _Failures(argparse.Action):
    """--replica-failure, repeatable: the tuple of (at, replica) pairs."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, (getattr(namespace, self.dest, None) or ()) + (values,))


def add_fault_flags(p: argparse.ArgumentParser) -> None:
    """The ``faults`` argument group of ``simsched run`` and its siblings."""
    g = p.add_argument_group("faults (default: nothing goes wrong)")
    g.add_argument("--ttft-timeout", type=float, metavar="S",
                   help="an attempt without its first token S seconds after its send is "
                        "given up (aborted in the engine)")
    g.add_argument("--request-timeout", type=float, metavar="S",
                   help="an attempt not finished S seconds after its send is given up")
    g.add_argument("--cancel-fraction", type=float,
                   help="share of requests their user cancels (faults.cancel_time after)")
    g.add_argument("--max-num-attempts", type=int,
                   help="attempts per request, retries included (1: no retries)")
    g.add_argument("--backoff-base-time", type=float, metavar="S",
                   help="the first retry's backoff, doubled each retry")
    g.add_argument("--backoff-jitter", type=float, help="jitter share of a backoff, 0 to 1")
    g.add_argument("--retry-budget", type=float,
                   help="retries at most this share of the requests sent")
    g.add_argument("--hedge-delay", type=float, metavar="S",
                   help="send a second copy S seconds after an attempt; the loser is cancelled")
    g.add_argument("--replica-failure", type=parse_failure, action=_Failures,
                   metavar="AT:REPLICA", help="replica REPLICA fails at AT seconds (repeatable)")
    g.add_argument("--mtbf", type=float, metavar="S",
                   help="each replica fails after exponential times of mean S seconds")
    g.add_argument("--restart-time", type=float, metavar="S",
                   help="a failed replica's restart, before its model load (30 s)")
    g.add_argument("--link-event", type=parse_link_event, action=_Failures,
                   metavar="AT:DURATION:LINK:FRACTION",
                   help="a KV-transfer link (a prefill replica's, or 'remote') runs at FRACTION "
                        "of its bandwidth (0: down) for DURATION seconds from AT (repeatable)")
    g.add_argument("--link-mtbf", type=float, metavar="S",
                   help="each link degrades after exponential up times of mean S seconds "
                        "(faults.link_mttr, link_fraction)")
    g.add_argument("--on-link-down", choices=("retry", "recompute"),
                   help="a transfer failed by its link going down: sent again when it is back "
                        "(retry, the default) or prefilled again on its decode replica")

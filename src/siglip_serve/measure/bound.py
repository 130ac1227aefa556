"""Host-bound or device-bound: the one question a served figure must answer before anyone tunes.

Two ceilings bound what a deployment serves: the host's (the serving path with the model taken out,
`siglip-serve bench` part `host-ceiling`, backend zeros-no-model) and the device's (the bare model on
every replica's device). The lower one is the limit; the served rate against it says how close the
service came. On a trn2 the host ceiling is the first number to measure (docs/capacity.md).

Both ceilings are measured through a load client, and a client that used a whole core on the top level
was itself the limit: then neither figure says what the host or the device carries, and the verdict is
client-bound until the bench runs with more client processes (measure/client_pool.py).
"""

from __future__ import annotations

from siglip_serve.measure.results import Bound

# A client process this busy over a level had no time to send more: the level measured the client. Below a
# whole core because a saturated event loop still loses moments to the scheduler on a host it shares.
CLIENT_BOUND_CORE_FRACTION = 0.85


def judge(host_ceiling: float, device: float, served: float | None,
          client_busiest: float | None = None) -> Bound:
    """`host_ceiling`, `device` and `served` in images per second, for the same deployment and client;
    `client_busiest` the busiest client process's share of a core at the top level (the higher of the
    served run's and the host ceiling's)."""
    if host_ceiling <= 0 or device <= 0:
        raise ValueError(f"ceilings must be positive, got host {host_ceiling}, device {device}")
    if client_busiest is not None and client_busiest >= CLIENT_BOUND_CORE_FRACTION:
        why = (f"raise --client-processes: the busiest client process used {client_busiest:.2f} of a core at the "
               f"top level, so the served figure ({_rate(served)}) and the host ceiling ({host_ceiling:.1f} img/s) "
               f"are the client's limit, not the service's (the device runs {device:.1f} img/s bare)")
        return Bound(verdict="client-bound", host_ceiling_images_per_second=host_ceiling,
                     device_images_per_second=device, served_images_per_second=served, served_over_limit=None,
                     explanation=why, client_busiest_core_fraction=client_busiest)
    host_bound = host_ceiling < device
    limit = min(host_ceiling, device)
    ratio = served / limit if served is not None else None
    if host_bound:
        why = (f"the host side carries at most {host_ceiling:.1f} img/s with no model at all, below the device's "
               f"{device:.1f} img/s: fix the host path (more ingress replicas or host cores, cheaper requests) "
               "before the model")
    else:
        why = (f"the device runs {device:.1f} img/s bare, below the host's {host_ceiling:.1f} img/s ceiling: "
               "the model is the limit (buckets, compilation, more devices)")
    if ratio is not None:
        why += f"; served {served:.1f} img/s = {ratio:.0%} of that limit"
    return Bound(verdict="host-bound" if host_bound else "device-bound", host_ceiling_images_per_second=host_ceiling,
                 device_images_per_second=device, served_images_per_second=served, served_over_limit=ratio,
                 explanation=why, client_busiest_core_fraction=client_busiest)


def _rate(served: float | None) -> str:
    return "not measured" if served is None else f"{served:.1f} img/s"

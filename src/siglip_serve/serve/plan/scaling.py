"""The autoscaling settings of a deployment, as the config takes them: Serve's own fields, and each
deployment's target."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Scaling(BaseModel):
    """What Serve's autoscaler takes for any deployment (ray/serve/config.py AutoscalingConfig, Ray 2.60),
    passed through as its `autoscaling_config`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(1, ge=1, description="replicas kept running")
    max_replicas: int = Field(..., ge=1, description="replicas Serve may scale to")
    upscale_delay_s: float = Field(30.0, ge=0, description="seconds above target before a replica is added")
    downscale_delay_s: float = Field(600.0, ge=0, description="seconds below target before one is removed")
    look_back_period_s: float = Field(30.0, gt=0, description="seconds Serve averages the load over")
    # Still how often a handle (the ingress) and a replica push their counts in Ray 2.60
    # (serve/_private/router.py, replica.py).
    metrics_interval_s: float = Field(10.0, gt=0, description="seconds between pushes of the load to Serve's "
                                                              "controller")

    @model_validator(mode="after")
    def _check_range(self) -> Scaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


class Autoscaling(Scaling):
    """The encoder's: Serve's request-based policy on the encoder calls each replica holds. See
    docs/operations.md for the target's argument; min_replicas is also /readyz's ceiling, and the
    ingress admits for max_replicas."""

    # Default: the calls one replica is meant to hold (serve/plan/planner.py CALLS_IN_FLIGHT_*): one
    # running and (on an accelerator) one gathering; more than that is a call waiting behind a batch.
    target_ongoing_requests: float | None = Field(None, gt=0, description="encoder calls per replica Serve "
                                                  "scales towards (default: 1 on cpu, 2 on an accelerator)")


class IngressAutoscaling(Scaling):
    """The ingress's: on the host cores each ingress replica keeps busy (serve/plan/ingress_scaling.py), since
    what limits an ingress is its CPU (HTTP, JSON, decoding), not the requests it holds: those also
    pile up behind a busy device, where more ingress replicas would not help."""

    # One ingress process saturates near two cores (serve/plan/cpu_plan.py INGRESS_CORES): its event loop
    # holds the GIL at one while decode threads run beside it. Scaling out at one leaves it headroom.
    target_busy_cores: float = Field(1.0, gt=0, description="host cores each ingress replica may keep busy "
                                                            "before Serve adds one")

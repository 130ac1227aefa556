"""A stepped load shape that finds the saturation point: add users in steps until p99 breaks the target.

    locust -f loadtest/locustfile.py,loadtest/stepshape.py --step-users 8 --step-time 30 --max-users 64

Step k runs min(k x step_users, max_users) users for step_time seconds. At the end of each step
the recorder's window for it (the first 20 % dropped to let queues settle) is checked; once a
step's p99 is over --p99-target-ms or its failures over --max-fail-ratio, the test stops: the
saturation point is behind it. The options are declared in the locustfile.
"""

# Locust first: its gevent monkey-patching must precede anything that imports ssl or urllib3.
from locust import LoadTestShape  # isort: skip

import logging
import math
from typing import Any

log = logging.getLogger("siglip_loadtest")


class StepLoadShape(LoadTestShape):
    # Reads --spawn-rate (and Locust keeps enforcing --run-time as an overall cap).
    use_common_options = True

    def __init__(self) -> None:
        super().__init__()
        self.step = 0
        self.stopped_because: str | None = None

    def _options(self) -> Any:
        return self.runner.environment.parsed_options  # type: ignore[union-attr]

    def steps(self) -> int:
        options = self._options()
        if options.step_users < 1 or options.max_users < options.step_users:
            raise ValueError("the step shape needs --step-users >= 1 and --max-users >= --step-users")
        return math.ceil(options.max_users / options.step_users)

    def _past_saturation(self, users: int) -> str | None:
        recorder = getattr(self.runner.environment, "siglip_recorder", None)  # type: ignore[union-attr]
        if recorder is None:
            return None
        window = recorder.close_window(users)
        if window is None:
            return None
        options = self._options()
        p99 = window.latency_ms.p99
        log.info("step at %d users: %.1f img/s, p99 %s ms, fail ratio %.3f", users, window.images_per_second,
                 f"{p99:.0f}" if p99 is not None else "-", window.fail_ratio)
        if p99 is not None and p99 > options.p99_target_ms:
            return f"p99 {p99:.0f} ms over the {options.p99_target_ms:g} ms target at {users} users"
        if window.fail_ratio > options.step_max_fail_ratio:
            return f"fail ratio {window.fail_ratio:.3f} over {options.step_max_fail_ratio:g} at {users} users"
        return None

    def tick(self) -> tuple[int, float] | None:
        options = self._options()
        step = int(self.get_run_time() // options.step_time) + 1
        if step != self.step:
            if self.step:
                reason = self._past_saturation(self.users_at(self.step))
                if reason:
                    self.stopped_because = reason
                    log.info("stopping the step test: %s", reason)
                    recorder = getattr(self.runner.environment, "siglip_recorder", None)  # type: ignore[union-attr]
                    if recorder is not None:
                        recorder.notes.append(f"step test stopped early: {reason}")
                    return None
            if step > self.steps():
                return None
            self.step = step
            log.info("step %d of %d: %d users", step, self.steps(), self.users_at(step))
        spawn_rate = options.spawn_rate or float(options.step_users)
        return self.users_at(self.step), spawn_rate

    def users_at(self, step: int) -> int:
        options = self._options()
        return min(step * options.step_users, options.max_users)

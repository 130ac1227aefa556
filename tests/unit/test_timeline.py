"""`siglip-serve run --timings`: the service's phases (launcher/timeline.py) and each tower replica's, marked in the
replica (serve/towers/start_marks.py) and published in its registry record. The replicas are built here as Serve builds
them, without Ray; the printed timeline of a real start is checked in tests/integration/test_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
import torch

from siglip_serve.launcher import timeline as phases
from siglip_serve.launcher.timeline import Timeline, format_timeline
from siglip_serve.serve.plan.config import ServiceConfig
from siglip_serve.serve.towers.start_marks import BUILD, IMPORTS, REGISTRATION, START_KEY, WARMUP, WORKER, StartMarks


def test_phases_take_the_time_since_the_mark_before_and_end_at_seconds_from_the_origin() -> None:
    timeline = Timeline(100.0)
    timeline.mark(phases.INTERPRETER, at=101.5)
    timeline.mark(phases.ARGUMENTS, at=101.75)
    timeline.mark(phases.RAY_INIT, at=105.75)
    assert timeline.phases == [(phases.INTERPRETER, 1.5, 1.5), (phases.ARGUMENTS, 0.25, 1.75),
                               (phases.RAY_INIT, 4.0, 5.75)]


def test_the_origin_is_this_process_or_the_relay_that_started_it() -> None:
    alone = Timeline.of_command(relayed=False)
    assert alone.origin == psutil.Process().create_time() and alone.phases == []
    # The service the relay runs (launcher/session.py) is the relay's child: its timeline starts with the relay.
    code = ("import json; from siglip_serve.launcher.timeline import Timeline; t = Timeline.of_command(relayed=True); "
            "print(json.dumps([t.origin, t.phases]))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    origin, marked = json.loads(child.stdout)
    assert origin == psutil.Process(os.getpid()).create_time()
    assert [phase for phase, _, _ in marked] == [phases.RELAY]
    # The child began after this process (which may have run the whole suite before it) and before now.
    assert marked[0][1] == pytest.approx(marked[0][2])
    assert 0 <= marked[0][1] <= time.time() - psutil.Process().create_time()


def record(replica_id: str, tower: str, started: float, phases_: list[list[object]], ready: float) -> dict[str, object]:
    return {"tower": tower, "replica_id": replica_id, "pid": 7,
            START_KEY: {"process_started": started, "phases": phases_, "ready_at": ready}}


def test_the_report_is_a_table_of_the_service_then_a_line_per_replica_in_the_order_they_were_warm() -> None:
    service = [(phases.RAY_INIT, 4.04, 9.0), (phases.DEPLOY, 11.96, 21.0)]
    late = record("bbbbbbbbbbbb", "image", 1012.0, [[WORKER, 3.0], [IMPORTS, 2.5], [BUILD, 0.5],
                                                    [f"{WARMUP}1", 0.1], [f"{WARMUP}8", 0.2], [REGISTRATION, 0.01]],
                  1020.5)
    early = record("aaaaaaaaaaaa", "text", 1011.0, [[WORKER, 2.0], [IMPORTS, 1.5]], 1016.0)
    text = format_timeline(service, 1000.0, [late, early, {"tower": "image", "replica_id": "old"}])
    lines = text.splitlines()
    assert lines[0].startswith("start timeline")
    assert lines[2].split() == ["ray.init", "4.0", "9.0"]
    assert lines[3].split()[-2:] == ["12.0", "21.0"] and lines[3].strip().startswith(phases.DEPLOY)
    assert lines[4].strip() == ("text replica aaaaaaaa (pid 7): process at +11.0 s; worker start 2.00, "
                                "imports 1.50; warm at +16.0 s")
    assert lines[5].strip() == ("image replica bbbbbbbb (pid 7): process at +12.0 s; worker start 3.00, imports 2.50, "
                                "model build 0.50, warm-up 1 0.10, warm-up 8 0.20, registration 0.01; warm at +20.5 s")
    assert lines[6].strip() == "(1 replica(s) published no start marks)"


def test_marks_count_from_the_process_start_and_end_in_the_record() -> None:
    marks = StartMarks(process_started=psutil.Process().create_time())
    marks.mark(WORKER)
    marks.warmed(8)
    published = marks.record()
    assert [phase for phase, _ in published["phases"]] == [WORKER, f"{WARMUP}8"]
    assert published["process_started"] == pytest.approx(psutil.Process().create_time(), abs=1e-3)
    assert published["ready_at"] == pytest.approx(published["process_started"] + sum(s for _, s in published["phases"]),
                                                  abs=0.01)


def test_the_first_answer_is_marked_once_after_the_start() -> None:
    marks = StartMarks(process_started=psutil.Process().create_time())
    marks.mark(WORKER)
    assert "first_answer_at" not in marks.record()
    assert marks.answered() is True
    first = marks.record()["first_answer_at"]
    assert marks.answered() is False
    assert marks.record()["first_answer_at"] == first >= marks.record()["ready_at"]


@pytest.mark.parametrize("tower", ["image", "text"])
def test_each_tower_replica_publishes_its_start_phase_by_phase(tower: str) -> None:
    # An image replica first in a fresh process keeps transformers out of it (models/image_only.py), which a text
    # replica built next in the same process needs: open_clip imported first, as a replica of either would.
    import open_clip  # noqa: F401

    from siglip_serve.serve.plan.planner import plan_service
    from siglip_serve.serve.towers.image_deployment import ImageReplica
    from siglip_serve.serve.towers.text_deployment import TextReplica

    config = ServiceConfig(model="tiny-siglip", random_weights=True, buckets=(1, 4), text_buckets=(2, 8))
    before = torch.get_num_threads()
    try:
        model = plan_service(config.model_copy(update={"replicas": 1, "text_replicas": 1})).model
        replica = (ImageReplica if tower == "image" else TextReplica)(model.run, model.towers[tower])
    finally:
        torch.set_num_threads(before)
    start = replica.info[START_KEY]
    buckets = (1, 4) if tower == "image" else (2, 8)
    assert [phase for phase, _ in start["phases"]] == [WORKER, IMPORTS, BUILD, *(f"{WARMUP}{b}" for b in buckets),
                                                       REGISTRATION]
    assert all(seconds >= 0 for _, seconds in start["phases"])
    assert start["process_started"] == pytest.approx(psutil.Process().create_time(), abs=1e-3)
